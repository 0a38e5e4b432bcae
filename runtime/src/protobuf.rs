//! Kubernetes' protobuf encoding, as the API server writes it, for the kinds a controller
//! decodes itself (`FromProtobuf`): the envelope around each object (the magic `k8s\0` and a
//! `runtime.Unknown` whose `raw` is the object's message), watch events, lists, Status, and the
//! metadata every kind carries as its field 1. Only the fields read are declared; prost skips
//! the rest. Protobuf writes the empty strings and zero times Go's JSON omits, so what is read
//! is made to equal what the JSON decoding gives (`ObjectMetaMessage::into_object_meta`).

use kube::core::Status;
use prost::Message;
use prost::bytes::Bytes;

/// The prefix of every enveloped protobuf message the API server writes.
pub(crate) const MAGIC: &[u8] = b"k8s\0";
pub(crate) const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// A kind the watcher decodes from its protobuf message.
pub trait FromProtobuf: Sized {
    fn from_protobuf(message: &[u8]) -> Result<Self, prost::DecodeError>;
}

// Nested messages are `Bytes`, sliced out of the frame rather than copied: a pod event's
// message is decoded once, by its kind's `FromProtobuf`.

/// The envelope of an encoded object (`runtime.Unknown`): only its message is read.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Unknown {
    #[prost(bytes = "bytes", tag = "2")]
    pub(crate) raw: Bytes,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct WatchEvent {
    #[prost(string, tag = "1")]
    pub(crate) r#type: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) object: Option<RawExtension>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct RawExtension {
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) raw: Bytes,
}

/// Any object as its metadata (every kind's is field 1): a bookmark's.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct MetadataOnly {
    #[prost(message, optional, tag = "1")]
    pub(crate) metadata: Option<ObjectMetaMessage>,
}

/// A list: its metadata and its items' messages (decoded one by one).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct List {
    #[prost(message, optional, tag = "1")]
    pub(crate) metadata: Option<ListMeta>,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub(crate) items: Vec<Bytes>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct ListMeta {
    #[prost(string, tag = "2")]
    pub(crate) resource_version: String,
    #[prost(string, tag = "3")]
    pub(crate) r#continue: String,
}

/// `metav1.Status`, as an error event or an error response carries it.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct StatusMessage {
    #[prost(string, tag = "2")]
    pub(crate) status: String,
    #[prost(string, tag = "3")]
    pub(crate) message: String,
    #[prost(string, tag = "4")]
    pub(crate) reason: String,
    #[prost(int32, tag = "6")]
    pub(crate) code: i32,
}

/// Bytes that are not what the API server's protobuf encoding makes.
pub(crate) fn undecodable(
    error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, error)
}

/// The message inside an envelope (`k8s\\0`, then `runtime.Unknown`).
pub fn unwrap_envelope(bytes: Bytes) -> std::io::Result<Bytes> {
    if !bytes.starts_with(MAGIC) {
        return Err(undecodable("not a protobuf envelope (no k8s\\0)"));
    }
    Ok(Unknown::decode(bytes.slice(MAGIC.len()..))
        .map_err(undecodable)?
        .raw)
}

pub(crate) fn status_of(message: StatusMessage) -> Status {
    Status::failure(&message.message, &message.reason).with_code(message.code as u16)
}

/// One event of a watch, decoded.
pub(crate) enum Frame<K> {
    Added(K),
    Modified(K),
    Deleted(K),
    Bookmark {
        resource_version: String,
        initial_end: bool,
    },
    Error(Box<Status>),
}

pub(crate) fn decode_frame<K: FromProtobuf>(frame: Bytes) -> std::io::Result<Frame<K>> {
    let event = WatchEvent::decode(frame).map_err(undecodable)?;
    let raw = event.object.map(|o| o.raw).unwrap_or_default();
    let message = unwrap_envelope(raw)?;
    decode_event(&event.r#type, &message).map_err(undecodable)
}

fn decode_event<K: FromProtobuf>(
    kind: &str,
    message: &[u8],
) -> Result<Frame<K>, prost::DecodeError> {
    Ok(match kind {
        "ADDED" => Frame::Added(K::from_protobuf(message)?),
        "MODIFIED" => Frame::Modified(K::from_protobuf(message)?),
        "DELETED" => Frame::Deleted(K::from_protobuf(message)?),
        "BOOKMARK" => {
            let meta = MetadataOnly::decode(message)?.metadata.unwrap_or_default();
            Frame::Bookmark {
                initial_end: meta.annotations.get(INITIAL_EVENTS_END).map(String::as_str)
                    == Some("true"),
                resource_version: meta.resource_version.unwrap_or_default(),
            }
        }
        _ => Frame::Error(status_of(StatusMessage::decode(message)?).boxed()),
    })
}

/// `metav1.ObjectMeta` as its message carries it, for a kind's `FromProtobuf`: the fields
/// an operator reads (managedFields and selfLink are skipped).
#[derive(Clone, PartialEq, Message)]
pub struct ObjectMetaMessage {
    #[prost(string, optional, tag = "1")]
    pub(crate) name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub(crate) namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub(crate) uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub(crate) resource_version: Option<String>,
    #[prost(int64, optional, tag = "7")]
    pub(crate) generation: Option<i64>,
    #[prost(message, optional, tag = "8")]
    pub(crate) creation_timestamp: Option<TimeMessage>,
    #[prost(message, optional, tag = "9")]
    pub(crate) deletion_timestamp: Option<TimeMessage>,
    #[prost(btree_map = "string, string", tag = "11")]
    pub(crate) labels: std::collections::BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    pub(crate) annotations: std::collections::BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    pub(crate) owner_references: Vec<OwnerReferenceMessage>,
    #[prost(string, repeated, tag = "14")]
    pub(crate) finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct OwnerReferenceMessage {
    #[prost(string, optional, tag = "1")]
    pub(crate) kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub(crate) name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub(crate) uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub(crate) api_version: Option<String>,
    #[prost(bool, optional, tag = "6")]
    pub(crate) controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub(crate) block_owner_deletion: Option<bool>,
}

/// `metav1.Time`: seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct TimeMessage {
    #[prost(int64, optional, tag = "1")]
    pub(crate) seconds: Option<i64>,
    #[prost(int32, optional, tag = "2")]
    pub(crate) nanos: Option<i32>,
}

/// Go's zero time (year 1), which protobuf writes where JSON writes null.
pub(crate) const GO_ZERO_TIME: i64 = -62_135_596_800;

impl TimeMessage {
    /// The time, or None for Go's zero time (JSON's null).
    pub fn time(self) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
        let seconds = self.seconds.unwrap_or_default();
        if seconds == GO_ZERO_TIME {
            return None;
        }
        let at = k8s_openapi::jiff::Timestamp::new(seconds, self.nanos.unwrap_or_default()).ok()?;
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at))
    }
}

/// Protobuf writes the empty values Go's JSON omits; JSON's absence is `None`.
pub fn non_empty(text: Option<String>) -> Option<String> {
    text.filter(|t| !t.is_empty())
}

impl ObjectMetaMessage {
    /// The metadata as the JSON decoding of the same object gives it.
    pub fn into_object_meta(self) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
        let owner_references = self
            .owner_references
            .into_iter()
            .map(|o| OwnerReference {
                api_version: o.api_version.unwrap_or_default(),
                block_owner_deletion: o.block_owner_deletion,
                controller: o.controller,
                kind: o.kind.unwrap_or_default(),
                name: o.name.unwrap_or_default(),
                uid: o.uid.unwrap_or_default(),
            })
            .collect::<Vec<_>>();
        ObjectMeta {
            name: non_empty(self.name),
            namespace: non_empty(self.namespace),
            uid: non_empty(self.uid),
            resource_version: non_empty(self.resource_version),
            generation: self.generation.filter(|g| *g != 0),
            creation_timestamp: self.creation_timestamp.and_then(TimeMessage::time),
            deletion_timestamp: self.deletion_timestamp.and_then(TimeMessage::time),
            labels: (!self.labels.is_empty()).then_some(self.labels),
            annotations: (!self.annotations.is_empty()).then_some(self.annotations),
            owner_references: (!owner_references.is_empty()).then_some(owner_references),
            finalizers: (!self.finalizers.is_empty()).then_some(self.finalizers),
            ..ObjectMeta::default()
        }
    }
}
