//! How the watches fill their caches: a streaming list where the API server serves one (the
//! current objects come as watch events, then a bookmark marks their end: `sendInitialEvents`,
//! the WatchList feature), pages of a list otherwise. Streaming holds one object at a time rather
//! than a page of 500 and its response body, and takes one request instead of one per page.
//!
//! The API server's WatchList gate is on by default in 1.32 and from 1.34, off in 1.33, where a
//! streaming watch is refused (422); older servers ignore the parameter and never send the
//! bookmark. So the server is asked once, at start.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{WatchEvent, WatchParams};
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

/// The annotation of the bookmark that ends a streaming list's initial objects.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";
/// A label no object carries: the probe's watch selects nothing, so the server sends only the
/// bookmark.
const SELECTS_NOTHING: &str = "operator-runtime.dev/initial-list-probe=none";
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitialList {
    /// Pages of a list, then a watch from its resourceVersion.
    #[default]
    Paged,
    /// One watch that starts with the current objects.
    Streaming,
}

impl InitialList {
    /// `config` with this way of filling the cache.
    pub fn configure(self, config: watcher::Config) -> watcher::Config {
        match self {
            Self::Paged => config,
            Self::Streaming => config.streaming_lists(),
        }
    }

    /// Streaming if the server ends a streaming watch of `api`'s kind (selecting none) with the
    /// initial-events-end bookmark within a few seconds; paged on any error or silence.
    pub async fn probe<K>(api: &Api<K>) -> Self
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let params = WatchParams::streaming_lists()
            .labels(SELECTS_NOTHING)
            .timeout(PROBE_TIMEOUT.as_secs() as u32);
        let streamed = async {
            let mut events = api.watch(&params, "0").await?.boxed();
            while let Some(event) = events.try_next().await? {
                if let WatchEvent::Bookmark(bookmark) = event
                    && bookmark.metadata.annotations.get(INITIAL_EVENTS_END)
                        == Some(&"true".to_string())
                {
                    return Ok::<_, kube::Error>(true);
                }
            }
            Ok(false)
        };
        let found = match tokio::time::timeout(PROBE_TIMEOUT, streamed).await {
            Ok(Ok(found)) => found,
            Ok(Err(error)) => {
                info!(%error, "the API server refused a streaming list; caches fill from paged lists");
                return Self::Paged;
            }
            Err(_) => false,
        };
        if found {
            info!(
                "the API server streams initial lists (WatchList); caches fill from watch events"
            );
            Self::Streaming
        } else {
            warn!(
                "the API server ignored a streaming list (no initial-events-end bookmark); caches fill from paged lists"
            );
            Self::Paged
        }
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, Response, StatusCode};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Client;
    use kube::client::Body;
    use serde_json::json;
    use tower_test::mock;

    use super::*;

    /// The probe's answer when the API server answers its one request with `status` and `body`.
    async fn probe_against(status: StatusCode, body: String) -> (InitialList, String) {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let api = Api::<ConfigMap>::all(Client::new(service, "default"));
        let server = tokio::spawn(async move {
            let (request, send) = handle.next_request().await.expect("a request");
            send.send_response(
                Response::builder()
                    .status(status)
                    .body(Body::from(body.into_bytes()))
                    .unwrap(),
            );
            request.uri().to_string()
        });
        let found = InitialList::probe(&api).await;
        (found, server.await.unwrap())
    }

    #[tokio::test]
    async fn a_server_that_ends_the_initial_events_with_a_bookmark_streams() {
        let bookmark = json!({"type": "BOOKMARK", "object": {
            "kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"resourceVersion": "42", "annotations": {"k8s.io/initial-events-end": "true"}}
        }});
        let (found, uri) = probe_against(StatusCode::OK, format!("{bookmark}\n")).await;
        assert_eq!(found, InitialList::Streaming);
        for part in [
            "watch=true",
            "sendInitialEvents=true",
            "resourceVersionMatch=NotOlderThan",
            "allowWatchBookmarks=true",
        ] {
            assert!(uri.contains(part), "{uri} lacks {part}");
        }
    }

    #[tokio::test]
    async fn a_server_without_watch_list_refuses_and_lists_are_paged() {
        let refusal = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422,
            "reason": "Invalid", "message": "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"});
        let (found, _) = probe_against(StatusCode::UNPROCESSABLE_ENTITY, refusal.to_string()).await;
        assert_eq!(found, InitialList::Paged);
    }

    #[tokio::test]
    async fn a_server_that_ignores_the_parameter_sends_no_bookmark_and_lists_are_paged() {
        // An old server: a plain watch that selects nothing ends without the bookmark.
        let (found, _) = probe_against(StatusCode::OK, String::new()).await;
        assert_eq!(found, InitialList::Paged);
    }

    #[test]
    fn streaming_configures_the_watcher_and_paged_leaves_it() {
        let base = watcher::Config::default().any_semantic();
        assert_eq!(
            InitialList::Streaming
                .configure(base.clone())
                .initial_list_strategy,
            watcher::InitialListStrategy::StreamingList
        );
        assert_eq!(
            InitialList::Paged.configure(base).initial_list_strategy,
            watcher::InitialListStrategy::ListWatch
        );
    }
}
