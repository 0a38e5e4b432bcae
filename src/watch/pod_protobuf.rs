//! The pod watch's view of a pod (`PodMeta`) from the pod's protobuf message: the metadata and
//! the fields of the status `PodStatusSeen` reads, as the JSON decoding gives them (protobuf
//! writes the empty strings and zero times JSON omits).

use prost::Message;

use super::pod_index::PodMeta;
use crate::status::pods::{
    ContainerStateSeen, ContainerStatusSeen, PodConditionSeen, PodStatusSeen, StateDetail,
};
use operator_runtime::protobuf::{FromProtobuf, ObjectMetaMessage, TimeMessage, non_empty};

#[derive(Clone, PartialEq, Message)]
struct PodMessage {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMetaMessage>,
    #[prost(message, optional, tag = "3")]
    status: Option<PodStatusMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct PodStatusMessage {
    #[prost(message, repeated, tag = "2")]
    conditions: Vec<PodConditionMessage>,
    #[prost(string, optional, tag = "6")]
    pod_ip: Option<String>,
    #[prost(message, repeated, tag = "8")]
    container_statuses: Vec<ContainerStatusMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct PodConditionMessage {
    #[prost(string, optional, tag = "1")]
    r#type: Option<String>,
    #[prost(string, optional, tag = "2")]
    status: Option<String>,
    #[prost(message, optional, tag = "4")]
    last_transition_time: Option<TimeMessage>,
    #[prost(string, optional, tag = "5")]
    reason: Option<String>,
    #[prost(string, optional, tag = "6")]
    message: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ContainerStatusMessage {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(message, optional, tag = "2")]
    state: Option<ContainerStateMessage>,
    #[prost(message, optional, tag = "3")]
    last_state: Option<ContainerStateMessage>,
    #[prost(bool, optional, tag = "4")]
    ready: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct ContainerStateMessage {
    #[prost(message, optional, tag = "1")]
    waiting: Option<WaitingMessage>,
    #[prost(message, optional, tag = "3")]
    terminated: Option<TerminatedMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct WaitingMessage {
    #[prost(string, optional, tag = "1")]
    reason: Option<String>,
    #[prost(string, optional, tag = "2")]
    message: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct TerminatedMessage {
    #[prost(int32, optional, tag = "1")]
    exit_code: Option<i32>,
    #[prost(string, optional, tag = "3")]
    reason: Option<String>,
    #[prost(string, optional, tag = "4")]
    message: Option<String>,
}

impl From<ContainerStateMessage> for ContainerStateSeen {
    fn from(state: ContainerStateMessage) -> Self {
        Self {
            waiting: state.waiting.map(|w| StateDetail {
                reason: non_empty(w.reason),
                message: non_empty(w.message),
                exit_code: None,
            }),
            terminated: state.terminated.map(|t| StateDetail {
                reason: non_empty(t.reason),
                message: non_empty(t.message),
                exit_code: Some(t.exit_code.unwrap_or_default()),
            }),
        }
    }
}

impl From<PodStatusMessage> for PodStatusSeen {
    fn from(status: PodStatusMessage) -> Self {
        Self {
            conditions: status
                .conditions
                .into_iter()
                .map(|c| PodConditionSeen {
                    type_: c.r#type.unwrap_or_default(),
                    status: c.status.unwrap_or_default(),
                    reason: non_empty(c.reason),
                    message: non_empty(c.message),
                    last_transition_time: c.last_transition_time.and_then(TimeMessage::time),
                })
                .collect(),
            container_statuses: status
                .container_statuses
                .into_iter()
                .map(|c| ContainerStatusSeen {
                    name: c.name.unwrap_or_default(),
                    ready: c.ready.unwrap_or_default(),
                    state: c.state.map(Into::into).unwrap_or_default(),
                    last_state: c.last_state.map(Into::into).unwrap_or_default(),
                })
                .collect(),
            pod_ip: non_empty(status.pod_ip).and_then(|ip| ip.parse().ok()),
        }
    }
}

impl FromProtobuf for PodMeta {
    fn from_protobuf(message: &[u8]) -> Result<Self, prost::DecodeError> {
        let pod = PodMessage::decode(message)?;
        let metadata = pod.metadata.unwrap_or_default().into_object_meta();
        let status = pod.status.map(Into::into).unwrap_or_default();
        Ok(PodMeta::of(metadata, &status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::pods::Cause;
    use operator_runtime::protobuf::unwrap_envelope;

    /// One pod as kube-apiserver 1.35.8 served it in each encoding, at one resourceVersion:
    /// unschedulable, its memcached container waiting in CrashLoopBackOff after an OOM kill.
    #[test]
    fn a_pod_reads_the_same_from_protobuf_as_from_json() {
        let json: PodMeta = serde_json::from_slice(include_bytes!("testdata/pod.json")).unwrap();
        let envelope = include_bytes!("testdata/pod.pb");
        let message = unwrap_envelope(envelope[..].into()).unwrap();
        let protobuf = PodMeta::from_protobuf(&message).unwrap();
        assert_eq!(format!("{protobuf:?}"), format!("{json:?}"));
        // No node takes it: that comes first (the container's OOM kill is read below).
        assert_eq!(
            protobuf.trouble.map(|t| t.cause),
            Some(Cause::Unschedulable)
        );
        assert_eq!(protobuf.ip, Some([10, 0, 0, 7].into()));
        assert!(protobuf.not_ready_since.is_some() && protobuf.ready_since.is_none());
        let meta = &protobuf.metadata;
        assert_eq!(
            meta.labels.as_ref().unwrap()["topology.kubernetes.io/zone"],
            "zone-a"
        );
        assert_eq!(
            meta.owner_references.as_ref().unwrap()[0].controller,
            Some(true)
        );
        assert_eq!(
            meta.finalizers.as_deref(),
            Some(&["example.com/hold".to_string()][..])
        );

        // The status as read, container states included.
        #[derive(serde::Deserialize)]
        struct Json {
            status: PodStatusSeen,
        }
        let json: Json = serde_json::from_slice(include_bytes!("testdata/pod.json")).unwrap();
        let status: PodStatusSeen = PodMessage::decode(message.clone())
            .unwrap()
            .status
            .unwrap()
            .into();
        assert_eq!(format!("{status:?}"), format!("{:?}", json.status));
        let memcached = &status.container_statuses[0];
        let oom = memcached.last_state.terminated.as_ref().unwrap();
        assert_eq!(
            (oom.reason.as_deref(), oom.exit_code),
            (Some("OOMKilled"), Some(137))
        );
        assert_eq!(
            memcached.state.waiting.as_ref().unwrap().reason.as_deref(),
            Some("CrashLoopBackOff")
        );
        assert!(status.container_statuses[1].ready);
    }
}
