//! Test fixtures: Memcacheds as the API server would return them, and a scripted API server.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{Memcached, MemcachedSpec};
use crate::status::Members;

/// A Memcached in namespace `default` with a uid and generation 1, as stored by the API server.
pub fn memcached(name: &str, size: i32) -> Memcached {
    let spec: MemcachedSpec = serde_json::from_value(serde_json::json!({ "size": size })).unwrap();
    let mut mc = Memcached::new(name, spec);
    mc.metadata.namespace = Some("default".into());
    mc.metadata.uid = Some(format!("uid-{name}"));
    mc.metadata.generation = Some(1);
    mc.metadata.resource_version = Some("1".into());
    mc
}

/// The Memcached "cache" of size 3 with `json`'s fields set in its spec.
pub fn memcached_with_spec(json: serde_json::Value) -> Memcached {
    let mut mc = memcached("cache", 3);
    let mut spec = serde_json::to_value(&mc.spec).unwrap();
    spec.as_object_mut()
        .unwrap()
        .extend(json.as_object().unwrap().clone());
    mc.spec = serde_json::from_value(spec).unwrap();
    mc
}

/// A Memcached with monitoring on, and the exporter image `image` if given.
pub fn monitored_memcached(image: Option<&str>) -> Memcached {
    let mut json = serde_json::json!({"monitoring": {"enabled": true}});
    if let Some(image) = image {
        json["monitoring"]["image"] = image.into();
    }
    memcached_with_spec(json)
}

/// `replicas` members, all of the current revision, `ready` of them Ready (and available).
pub fn members(replicas: i32, ready: i32) -> Members {
    Members {
        replicas,
        ready,
        available: ready,
        updated: replicas,
    }
}

/// A fixed point in time, `secs` after the epoch.
pub fn time(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
}

/// A scripted API server for scenario tests: each `expect` answers the next request, asserting
/// its method and path. A reconcile that sends a request nobody scripted waits for an answer
/// forever, which the scenario's timeout turns into a failure.
pub mod apiserver {
    use std::sync::Arc;
    use std::time::Duration;

    use http::{Request, Response, StatusCode};
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use kube::Client;
    use kube::client::Body;
    use kube::runtime::events::Reporter;
    use kube::runtime::watcher;
    use serde_json::{Value, json};
    use tower_test::mock::{self, Handle};

    use crate::certificate::Certificate;
    use crate::controller::{Config, Context, Events, Remembered};
    use crate::metrics::Metrics;
    use crate::service_monitor::ServiceMonitor;
    use crate::watch::Cached;
    use crate::watch::owned::OwnedObject;
    use operator_runtime::cache::{self, Writer};

    pub struct ApiServer(Handle<Request<Body>, Response<Body>>);

    /// Caches the test fills before reconciling, as the watches would.
    pub struct Caches {
        pub services: Writer<OwnedObject<Service>>,
        pub budgets: Writer<OwnedObject<PodDisruptionBudget>>,
        pub monitors: Writer<OwnedObject<ServiceMonitor>>,
        pub network_policies: Writer<OwnedObject<NetworkPolicy>>,
        pub certificates: Writer<OwnedObject<Certificate>>,
    }

    impl Caches {
        pub fn add_service(&mut self, s: Service) {
            self.services
                .apply_watcher_event(&watcher::Event::Apply(OwnedObject::of(&s)));
        }
        pub fn add_budget(&mut self, b: PodDisruptionBudget) {
            self.budgets
                .apply_watcher_event(&watcher::Event::Apply(OwnedObject::of(&b)));
        }
        pub fn add_monitor(&mut self, m: ServiceMonitor) {
            self.monitors
                .apply_watcher_event(&watcher::Event::Apply(OwnedObject::of(&m)));
        }
        pub fn add_network_policy(&mut self, p: NetworkPolicy) {
            self.network_policies
                .apply_watcher_event(&watcher::Event::Apply(OwnedObject::of(&p)));
        }
    }

    /// A context for a cluster that does not serve ServiceMonitors.
    pub fn context() -> (Arc<Context>, ApiServer, Caches) {
        context_where_service_monitors_are(false)
    }

    /// A context of an operator whose role does not let it watch NetworkPolicies (an install
    /// whose RBAC predates them).
    pub fn context_without_network_policies() -> (Arc<Context>, ApiServer, Caches) {
        let (ctx, api, caches) = context();
        let mut ctx = Arc::into_inner(ctx).expect("not shared yet");
        ctx.cached.network_policies = None;
        (Arc::new(ctx), api, caches)
    }

    pub fn context_where_service_monitors_are(served: bool) -> (Arc<Context>, ApiServer, Caches) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let (legacy_stateful_sets, _) = cache::new();
        let (services, sw) = cache::new();
        let (budgets, bw) = cache::new();
        let (monitors, mw) = cache::new();
        let (network_policies, nw) = cache::new();
        let (certificates, cw) = cache::new();
        let ctx = Context {
            client: client.clone(),
            evictions: client.clone(),
            cached: Cached {
                services,
                budgets,
                deployments: cache::new().0,
                config_maps: cache::new().0,
                network_policies: Some(network_policies),
                service_monitors: served.then_some(monitors),
                certificates: Some(certificates),
                pods: Default::default(),
                hpas: None,
                synced: Default::default(),
            },
            legacy: legacy_stateful_sets,
            own_writes: Default::default(),
            remembered: Remembered {
                rollouts: Arc::new(crate::controller::Rollouts::new(10)),
                replacing: Default::default(),
                autoscaler: Default::default(),
                statuses: Default::default(),
            },
            events: Events::new(
                client.clone(),
                Reporter {
                    controller: "memcached-operator".into(),
                    instance: Some("test".into()),
                },
            ),
            metrics: Arc::new(Metrics::new()),
            config: Config {
                images: Default::default(),
                operator_namespace: None,
            },
        };
        (
            Arc::new(ctx),
            ApiServer(handle),
            Caches {
                services: sw,
                budgets: bw,
                monitors: mw,
                network_policies: nw,
                certificates: cw,
            },
        )
    }

    /// A request as the scripted server saw it.
    pub struct Seen {
        pub method: String,
        pub path_and_query: String,
        pub body: Value,
    }

    impl Seen {
        pub fn path(&self) -> &str {
            self.path_and_query.split('?').next().unwrap()
        }
    }

    pub struct Reply(tower_test::mock::SendResponse<Response<Body>>);

    impl Reply {
        pub fn send(self, status: StatusCode, body: &Value) {
            self.0.send_response(
                Response::builder()
                    .status(status)
                    .body(Body::from(serde_json::to_vec(body).unwrap()))
                    .unwrap(),
            );
        }
    }

    /// What a delete answers when it does not return the object (a collection's, say).
    pub fn success() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})
    }

    /// The request body as stored: what an apply or create of a new object answers.
    pub fn echoed(body: &Value) -> Value {
        let mut body = body.clone();
        body["metadata"]["resourceVersion"] = json!("100");
        body
    }

    impl ApiServer {
        /// Takes the next request the client sends.
        async fn receive(&mut self, waiting_for: &str) -> (Seen, Reply) {
            let (request, send) =
                tokio::time::timeout(Duration::from_secs(5), self.0.next_request())
                    .await
                    .unwrap_or_else(|_| panic!("no request arrived; expected {waiting_for}"))
                    .expect("client dropped");
            let method = request.method().to_string();
            let path_and_query = request.uri().path_and_query().unwrap().to_string();
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let body: Value = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).unwrap()
            };
            let seen = Seen {
                method,
                path_and_query,
                body,
            };
            (seen, Reply(send))
        }

        /// The next request, whatever it is, for the caller to answer.
        pub async fn receive_any(&mut self) -> (Seen, Reply) {
            self.receive("any request").await
        }

        /// Answers the next request with `status` and `reply(body)`; returns what was sent.
        pub async fn expect(
            &mut self,
            method: &str,
            path: &str,
            status: StatusCode,
            reply: impl FnOnce(&Value) -> Value,
        ) -> Seen {
            let (seen, send) = self.receive(&format!("{method} {path}")).await;
            assert_eq!(
                (seen.method.as_str(), seen.path()),
                (method, path),
                "unexpected request (body: {})",
                seen.body
            );
            send.send(status, &reply(&seen.body));
            seen
        }

        /// Answers the next `n` requests in whatever order they come (a reconcile sends its
        /// events in the background): a status apply as `echo_status` does, a delete with
        /// success, the rest as `echo`.
        pub async fn echo_any_order(&mut self, n: usize, mc: &crate::api::Memcached) -> Vec<Seen> {
            let mut seen = Vec::new();
            for _ in 0..n {
                let (request, send) = self.receive(&format!("{n} requests")).await;
                let reply = if request.path().ends_with("/status") {
                    let mut object = serde_json::to_value(mc).unwrap();
                    object["status"] = request.body["status"].clone();
                    object
                } else if request.method == "DELETE" {
                    success()
                } else {
                    echoed(&request.body)
                };
                send.send(StatusCode::OK, &reply);
                seen.push(request);
            }
            seen
        }

        /// Answers with 200 and the request body, as an apply or create of a new object would.
        pub async fn echo(&mut self, method: &str, path: &str) -> Seen {
            self.expect(method, path, StatusCode::OK, echoed).await
        }

        /// Answers a status patch of `mc` as the API server does: the object with the patch's
        /// status, at its next resourceVersion.
        pub async fn echo_status(&mut self, path: &str, mc: &crate::api::Memcached) -> Seen {
            let mut object = serde_json::to_value(mc).unwrap();
            let read = mc.metadata.resource_version.as_deref().unwrap_or("0");
            let next = read.parse::<u64>().map_or(1, |v| v + 1);
            object["metadata"]["resourceVersion"] = json!(next.to_string());
            self.expect("PATCH", path, StatusCode::OK, move |b| {
                object["status"] = b["status"].clone();
                object
            })
            .await
        }

        pub async fn not_found(&mut self, path: &str) -> Seen {
            self.expect("GET", path, StatusCode::NOT_FOUND, |_| {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"})
            })
            .await
        }
    }
}
