//! A watcher that asks the API server for Kubernetes' protobuf encoding instead of JSON, for the
//! built-in kinds a controller watches in bulk (pods).
//!
//! The API server encodes each object it sends in the encoding each watcher asked for, and
//! caches an event's encoding per format for every watcher of the same format. The control
//! plane's own components (scheduler, controller-manager, kubelets) watch pods in protobuf, so a
//! JSON watcher makes the API server encode every pod event once more for it alone, and a JSON
//! list at startup encodes every object afresh (the watch cache's store keeps no encodings):
//! slower than protobuf by several times. kube-runtime's `watcher` decodes JSON only, so this
//! one follows its states and yields its events (`watcher::Event`, `watcher::Error`): a
//! streaming list or pages of a list, then a watch resumed from the last resourceVersion, a new
//! list after 410 Gone. Custom resources have no protobuf encoding; they stay with `watcher`.
//!
//! A watch body is frames of a 4-byte big-endian length and a `metav1.WatchEvent` message; the
//! messages themselves are in `protobuf.rs`.

use std::collections::VecDeque;

use futures::{Stream, StreamExt, TryStreamExt, stream};
use http::header::{ACCEPT, ACCEPT_ENCODING, HeaderValue};
use http_body_util::BodyExt;
use kube::api::{ListParams, VersionMatch, WatchParams};
use kube::core::{Request, Status};
use kube::runtime::watcher::{self, Event, InitialListStrategy, ListSemantic};
use kube::{Client, Resource, ResourceExt};
use prost::Message;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tokio_util::io::StreamReader;
use tracing::{debug, warn};

use crate::protobuf::{
    Frame, FromProtobuf, List, ListMeta, StatusMessage, decode_frame, status_of, undecodable,
    unwrap_envelope,
};

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// A watch frame's limit: the API server's own request limit is 3 MiB, objects are smaller.
const MAX_FRAME: usize = 16 << 20;

type Frames<K> = std::pin::Pin<Box<dyn Stream<Item = Result<Frame<K>, kube::Error>> + Send>>;

/// Where the watcher stands, as kube-runtime's watcher's states.
enum State<K> {
    Empty,
    InitPage {
        continue_token: Option<String>,
        objects: VecDeque<K>,
        resource_version: Option<String>,
    },
    InitialWatch(Frames<K>),
    InitListed(String),
    Watching(String, Frames<K>),
}

/// The request in protobuf, and the response's body if it succeeded; an error response's
/// Status otherwise.
async fn send(
    client: &Client,
    mut request: http::Request<Vec<u8>>,
) -> Result<http::Response<kube::client::Body>, kube::Error> {
    let headers = request.headers_mut();
    headers.insert(ACCEPT, HeaderValue::from_static(PROTOBUF));
    headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    let response = client.send(request.map(kube::client::Body::from)).await?;
    if response.status().is_success() {
        return Ok(response);
    }
    let code = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    // A Status in protobuf, as asked; anything else (a proxy's page) as text.
    let status = unwrap_envelope(body.clone())
        .and_then(|m| StatusMessage::decode(m).map_err(undecodable))
        .map(status_of)
        .unwrap_or_else(|_| Status::failure(&String::from_utf8_lossy(&body), "Unknown"));
    Err(kube::Error::Api(status.with_code(code).boxed()))
}

async fn list<K: FromProtobuf>(
    client: &Client,
    url: &str,
    params: &ListParams,
) -> Result<(Vec<K>, ListMeta), kube::Error> {
    let request = Request::new(url)
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    let body = send(client, request)
        .await?
        .into_body()
        .collect()
        .await?
        .to_bytes();
    let undecodable = |e| kube::Error::ReadEvents(undecodable(e));
    let message = unwrap_envelope(body).map_err(kube::Error::ReadEvents)?;
    let list = List::decode(message).map_err(undecodable)?;
    let items = list
        .items
        .iter()
        .map(|item| K::from_protobuf(item))
        .collect::<Result<_, _>>()
        .map_err(undecodable)?;
    Ok((items, list.metadata.unwrap_or_default()))
}

async fn watch<K: FromProtobuf + Send + 'static>(
    client: &Client,
    url: &str,
    params: &WatchParams,
    version: &str,
) -> Result<Frames<K>, kube::Error> {
    let request = Request::new(url)
        .watch(params, version)
        .map_err(kube::Error::BuildRequest)?;
    let body = send(client, request).await?.into_body();
    let reader = StreamReader::new(body.into_data_stream().map_err(std::io::Error::other));
    let codec = LengthDelimitedCodec::builder()
        .length_field_length(4)
        .big_endian()
        .max_frame_length(MAX_FRAME)
        .new_codec();
    let frames = FramedRead::new(reader, codec).filter_map(|frame| async move {
        match frame {
            Ok(frame) => Some(decode_frame(frame.freeze()).map_err(kube::Error::ReadEvents)),
            // The server ended the response mid-frame: the watch ends and resumes.
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => None,
            Err(error) => Some(Err(kube::Error::ReadEvents(error))),
        }
    });
    Ok(Box::pin(frames))
}

fn list_params(config: &watcher::Config) -> ListParams {
    let (resource_version, version_match) = match config.list_semantic {
        ListSemantic::Any => (Some("0".into()), Some(VersionMatch::NotOlderThan)),
        ListSemantic::MostRecent => (None, None),
    };
    ListParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        version_match,
        resource_version,
        limit: config.page_size,
        ..ListParams::default()
    }
}

fn watch_params(config: &watcher::Config, initial: bool) -> WatchParams {
    WatchParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        timeout: config.timeout,
        bookmarks: config.bookmarks,
        send_initial_events: initial
            && config.initial_list_strategy == InitialListStrategy::StreamingList,
    }
}

/// After an error event: a new list if the server no longer has the version (410 Gone), else
/// the same state.
fn after_error<K>(
    status: Box<Status>,
    state: State<K>,
) -> (Option<watcher::Result<Event<K>>>, State<K>) {
    let next = if status.code == 410 {
        State::Empty
    } else {
        state
    };
    (Some(Err(watcher::Error::WatchError(status))), next)
}

/// A change seen while watching, and the watch resumed from its object's version.
fn changed<K: Resource>(
    obj: K,
    event: fn(K) -> Event<K>,
    frames: Frames<K>,
) -> (Option<watcher::Result<Event<K>>>, State<K>) {
    match obj.resource_version().filter(|v| !v.is_empty()) {
        Some(version) => (Some(Ok(event(obj))), State::Watching(version, frames)),
        None => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
    }
}

fn logged(error: &kube::Error) {
    if matches!(error, kube::Error::Api(status) if status.is_forbidden()) {
        warn!(%error, "protobuf watch refused");
    } else {
        debug!(%error, "protobuf watch failed");
    }
}

/// One step: the event to yield, if any, and the next state.
async fn step<K>(
    client: &Client,
    url: &str,
    config: &watcher::Config,
    state: State<K>,
) -> (Option<watcher::Result<Event<K>>>, State<K>)
where
    K: FromProtobuf + Resource + Send + 'static,
{
    match state {
        State::Empty => match config.initial_list_strategy {
            InitialListStrategy::ListWatch => (
                Some(Ok(Event::Init)),
                State::InitPage {
                    continue_token: None,
                    objects: VecDeque::new(),
                    resource_version: None,
                },
            ),
            InitialListStrategy::StreamingList => {
                match watch(client, url, &watch_params(config, true), "0").await {
                    Ok(frames) => (Some(Ok(Event::Init)), State::InitialWatch(frames)),
                    Err(error) => {
                        logged(&error);
                        (
                            Some(Err(watcher::Error::WatchStartFailed(error))),
                            State::Empty,
                        )
                    }
                }
            }
        },
        State::InitPage {
            continue_token,
            mut objects,
            resource_version,
        } => {
            if let Some(next) = objects.pop_front() {
                let state = State::InitPage {
                    continue_token,
                    objects,
                    resource_version,
                };
                return (Some(Ok(Event::InitApply(next))), state);
            }
            if continue_token.is_none()
                && let Some(resource_version) = resource_version
            {
                return (
                    Some(Ok(Event::InitDone)),
                    State::InitListed(resource_version),
                );
            }
            let mut params = list_params(config);
            params.continue_token = continue_token;
            match list(client, url, &params).await {
                Ok((items, meta)) => {
                    let resource_version = Some(meta.resource_version).filter(|v| !v.is_empty());
                    let continue_token = Some(meta.r#continue).filter(|c| !c.is_empty());
                    if resource_version.is_none() && continue_token.is_none() {
                        return (Some(Err(watcher::Error::NoResourceVersion)), State::Empty);
                    }
                    let state = State::InitPage {
                        continue_token,
                        objects: items.into(),
                        resource_version,
                    };
                    (None, state)
                }
                Err(error) => {
                    logged(&error);
                    (
                        Some(Err(watcher::Error::InitialListFailed(error))),
                        State::Empty,
                    )
                }
            }
        }
        State::InitialWatch(mut frames) => match frames.next().await {
            Some(Ok(Frame::Added(obj) | Frame::Modified(obj))) => {
                (Some(Ok(Event::InitApply(obj))), State::InitialWatch(frames))
            }
            // Impossible before the initial events end, says the API's documentation.
            Some(Ok(Frame::Deleted(_))) => (None, State::InitialWatch(frames)),
            Some(Ok(Frame::Bookmark {
                resource_version,
                initial_end: true,
            })) => (
                Some(Ok(Event::InitDone)),
                State::Watching(resource_version, frames),
            ),
            Some(Ok(Frame::Bookmark { .. })) => (None, State::InitialWatch(frames)),
            Some(Ok(Frame::Error(status))) => after_error(status, State::InitialWatch(frames)),
            Some(Err(error)) => {
                logged(&error);
                (
                    Some(Err(watcher::Error::WatchFailed(error))),
                    State::InitialWatch(frames),
                )
            }
            None => (None, State::Empty),
        },
        State::InitListed(resource_version) => {
            match watch(client, url, &watch_params(config, false), &resource_version).await {
                Ok(frames) => (None, State::Watching(resource_version, frames)),
                Err(error) => {
                    logged(&error);
                    let state = State::InitListed(resource_version);
                    (Some(Err(watcher::Error::WatchStartFailed(error))), state)
                }
            }
        }
        State::Watching(resource_version, mut frames) => match frames.next().await {
            Some(Ok(Frame::Added(obj) | Frame::Modified(obj))) => {
                changed(obj, Event::Apply, frames)
            }
            Some(Ok(Frame::Deleted(obj))) => changed(obj, Event::Delete, frames),
            Some(Ok(Frame::Bookmark {
                resource_version, ..
            })) => (None, State::Watching(resource_version, frames)),
            Some(Ok(Frame::Error(status))) => {
                after_error(status, State::Watching(resource_version, frames))
            }
            Some(Err(error)) => {
                logged(&error);
                let state = State::Watching(resource_version, frames);
                (Some(Err(watcher::Error::WatchFailed(error))), state)
            }
            // The server's timeout: resume from where it ended.
            None => (None, State::InitListed(resource_version)),
        },
    }
}

/// The events of `url` (a kind's collection, as `Api::resource_url` gives it) as
/// kube-runtime's `watcher` yields them, decoded from protobuf.
pub fn watcher<K>(
    client: Client,
    url: String,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: FromProtobuf + Resource + Send + 'static,
{
    stream::unfold(
        (client, url, config, State::Empty),
        |(client, url, config, mut state)| async move {
            loop {
                let (event, next) = step(&client, &url, &config, state).await;
                state = next;
                if let Some(event) = event {
                    return Some((event, (client, url, config, state)));
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use http::{Request, Response, StatusCode};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::client::Body;
    use tower_test::mock;

    use super::*;
    use crate::protobuf::*;

    impl FromProtobuf for ConfigMap {
        fn from_protobuf(message: &[u8]) -> Result<Self, prost::DecodeError> {
            let metadata = MetadataOnly::decode(message)?.metadata.unwrap_or_default();
            Ok(ConfigMap {
                metadata: metadata.into_object_meta(),
                ..ConfigMap::default()
            })
        }
    }

    /// An object's message as the API server writes it: Go's empty values included.
    fn object(name: &str, version: &str) -> ObjectMetaMessage {
        ObjectMetaMessage {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(version.into()),
            generation: Some(0),
            creation_timestamp: Some(TimeMessage {
                seconds: Some(1_780_000_000),
                nanos: Some(0),
            }),
            ..ObjectMetaMessage::default()
        }
    }

    fn enveloped(message: impl Message) -> Vec<u8> {
        let unknown = Unknown {
            raw: message.encode_to_vec().into(),
        };
        [MAGIC, &unknown.encode_to_vec()].concat()
    }

    fn frame(kind: &str, message: Vec<u8>) -> Vec<u8> {
        let event = WatchEvent {
            r#type: kind.into(),
            object: Some(RawExtension {
                raw: message.into(),
            }),
        }
        .encode_to_vec();
        [&(event.len() as u32).to_be_bytes()[..], &event].concat()
    }

    fn event(kind: &str, meta: ObjectMetaMessage) -> Vec<u8> {
        frame(
            kind,
            enveloped(MetadataOnly {
                metadata: Some(meta),
            }),
        )
    }

    fn bookmark(version: &str, initial_end: bool) -> Vec<u8> {
        let mut meta = object("", version);
        if initial_end {
            meta.annotations
                .insert(INITIAL_EVENTS_END.into(), "true".into());
        }
        event("BOOKMARK", meta)
    }

    fn status(code: i32, reason: &str, message: &str) -> Vec<u8> {
        enveloped(StatusMessage {
            status: "Failure".into(),
            message: message.into(),
            reason: reason.into(),
            code,
        })
    }

    /// Answers each request the watcher makes with the next (status, body), and returns the
    /// requests' URIs and Accept headers.
    fn serve(
        answers: Vec<(StatusCode, Vec<u8>)>,
    ) -> (Client, tokio::task::JoinHandle<Vec<String>>) {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for (status, body) in answers {
                let (request, send) = handle.next_request().await.expect("a request");
                let accept = request.headers().get(ACCEPT).unwrap().to_str().unwrap();
                seen.push(format!("{} {accept}", request.uri()));
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(body))
                        .unwrap(),
                );
            }
            seen
        });
        (Client::new(service, "default"), server)
    }

    /// The first `n` events of a watch of ConfigMaps, named.
    async fn events_of(client: Client, config: watcher::Config, n: usize) -> Vec<String> {
        watcher::<ConfigMap>(client, "/api/v1/configmaps".into(), config)
            .take(n)
            .map(|e| match e {
                Ok(event) => named(&event),
                Err(watcher::Error::WatchError(s)) => format!("Err {} {}", s.code, s.message),
                Err(error) => format!("Err {error}"),
            })
            .collect()
            .await
    }

    fn named(event: &Event<ConfigMap>) -> String {
        match event {
            Event::Init => "Init".into(),
            Event::InitApply(o) => format!("InitApply {}", o.name_any()),
            Event::InitDone => "InitDone".into(),
            Event::Apply(o) => format!("Apply {} {}", o.name_any(), o.resource_version().unwrap()),
            Event::Delete(o) => format!("Delete {}", o.name_any()),
        }
    }

    #[tokio::test]
    async fn a_streaming_list_its_changes_a_resumed_watch_and_a_new_list_after_gone() {
        let first = [
            event("ADDED", object("a", "5")),
            event("ADDED", object("b", "6")),
            bookmark("7", true),
            event("MODIFIED", object("a", "8")),
            event("DELETED", object("b", "9")),
            bookmark("10", false),
        ]
        .concat();
        let (client, server) = serve(vec![
            (StatusCode::OK, first),
            (
                StatusCode::OK,
                frame("ERROR", status(410, "Expired", "too old resource version")),
            ),
            (
                StatusCode::OK,
                [event("ADDED", object("a", "11")), bookmark("12", true)].concat(),
            ),
        ]);
        let config = watcher::Config::default().any_semantic().streaming_lists();
        let events = events_of(client, config, 10).await;
        assert_eq!(
            events,
            [
                "Init",
                "InitApply a",
                "InitApply b",
                "InitDone",
                "Apply a 8",
                "Delete b",
                "Err 410 too old resource version",
                "Init",
                "InitApply a",
                "InitDone",
            ]
        );
        let requests = server.await.unwrap();
        assert!(
            requests[0].contains("sendInitialEvents=true"),
            "{}",
            requests[0]
        );
        assert!(requests[0].ends_with(PROTOBUF), "{}", requests[0]);
        // Resumed from the last bookmark, without the initial events.
        assert!(
            requests[1].contains("resourceVersion=10"),
            "{}",
            requests[1]
        );
        assert!(
            !requests[1].contains("sendInitialEvents"),
            "{}",
            requests[1]
        );
        // After 410 Gone, listed anew.
        assert!(
            requests[2].contains("sendInitialEvents=true"),
            "{}",
            requests[2]
        );
    }

    #[tokio::test]
    async fn pages_of_a_list_where_the_server_does_not_stream_then_a_watch_from_the_list() {
        #[derive(Clone, PartialEq, Message)]
        struct ListOf {
            #[prost(message, optional, tag = "1")]
            metadata: Option<ListMeta>,
            #[prost(message, repeated, tag = "2")]
            items: Vec<MetadataOnly>,
        }
        let page = |names: &[&str], version: &str, next: &str| {
            enveloped(ListOf {
                metadata: Some(ListMeta {
                    resource_version: version.into(),
                    r#continue: next.into(),
                }),
                items: names
                    .iter()
                    .map(|n| MetadataOnly {
                        metadata: Some(object(n, "3")),
                    })
                    .collect(),
            })
        };
        let (client, server) = serve(vec![
            (StatusCode::OK, page(&["a", "b"], "", "token")),
            (StatusCode::OK, page(&["c"], "20", "")),
            (StatusCode::OK, event("MODIFIED", object("c", "21"))),
        ]);
        let config = watcher::Config::default().any_semantic().page_size(2);
        let events = events_of(client, config, 6).await;
        assert_eq!(
            events,
            [
                "Init",
                "InitApply a",
                "InitApply b",
                "InitApply c",
                "InitDone",
                "Apply c 21"
            ]
        );
        let requests = server.await.unwrap();
        assert!(
            requests[0].contains("limit=2") && !requests[0].contains("watch"),
            "{}",
            requests[0]
        );
        assert!(requests[1].contains("continue=token"), "{}", requests[1]);
        assert!(
            requests[2].contains("watch=true") && requests[2].contains("resourceVersion=20"),
            "{}",
            requests[2]
        );
    }

    #[tokio::test]
    async fn a_refused_watch_is_an_api_error_with_the_servers_status() {
        let (client, _server) = serve(vec![(
            StatusCode::FORBIDDEN,
            status(403, "Forbidden", "pods is forbidden"),
        )]);
        let config = watcher::Config::default().streaming_lists();
        let mut events = Box::pin(watcher::<ConfigMap>(
            client,
            "/api/v1/configmaps".into(),
            config,
        ));
        match events.next().await {
            Some(Err(watcher::Error::WatchStartFailed(kube::Error::Api(status)))) => {
                assert_eq!(
                    (status.code, status.message.as_str()),
                    (403, "pods is forbidden")
                );
                assert!(status.is_forbidden());
            }
            other => panic!("not a refusal: {other:?}"),
        }
    }

    #[test]
    fn go_empty_values_read_as_json_absences() {
        let meta = ObjectMetaMessage {
            labels: [("app".to_string(), "x".to_string())].into(),
            deletion_timestamp: Some(TimeMessage {
                seconds: Some(GO_ZERO_TIME),
                nanos: Some(0),
            }),
            uid: Some(String::new()),
            ..object("a", "4")
        }
        .into_object_meta();
        assert_eq!(meta.uid, None);
        assert_eq!(meta.generation, None);
        assert_eq!(meta.deletion_timestamp, None);
        assert_eq!(meta.annotations, None);
        assert_eq!(meta.owner_references, None);
        assert_eq!(meta.labels.unwrap()["app"], "x");
        assert_eq!(
            meta.creation_timestamp.unwrap().0.as_second(),
            1_780_000_000
        );
    }

    /// A streaming watch of one pod as kube-apiserver 1.35.8 wrote it (testdata/pods-watch.pb).
    #[tokio::test]
    async fn the_api_servers_own_bytes_decode() {
        let captured = include_bytes!("testdata/pods-watch.pb").to_vec();
        let (client, _server) = serve(vec![(StatusCode::OK, captured)]);
        let config = watcher::Config::default().streaming_lists();
        let events = events_of(client, config, 3).await;
        assert_eq!(events, ["Init", "InitApply cache-0", "InitDone"]);
    }
}
