//! What TLS and authentication cost memcached's clients: operations per second and latency on
//! the real node, for four Memcacheds that differ only in `spec.tls` and `spec.auth`.
//! A benchmark, not a test: `make bench-data-path` runs it (ignored by `make test`) and writes
//! bench/results/data-path.json.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use memcached_operator::api::{AuthSpec, TlsSpec};
use memcached_operator_testkit::memcached::Connection;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::ClientConfig;

use crate::harness::{admin, create, member_pods, memcached, wait_converged};
use crate::tls::{Ca, client_config, create_tls_secret};
use crate::{RealNode, create_credentials, operator_with_agent, pod_ip, real_namespace};

/// Connections kept open at once, each with one request in flight (as a web tier's pool).
const CONNECTIONS: usize = 8;
/// How long each steady-state run lasts.
const STEADY: Duration = Duration::from_secs(10);
/// How long each run of new connections lasts.
const CONNECTING: Duration = Duration::from_secs(5);
pub(crate) const USER: &str = "bench";
pub(crate) const PASSWORD: &str = "bench-password";
/// A typical cached value: a small serialized object.
pub(crate) const VALUE: &[u8] = &[b'x'; 200];

struct Variant {
    name: &'static str,
    tls: bool,
    auth: bool,
}

const VARIANTS: [Variant; 4] = [
    Variant {
        name: "plain",
        tls: false,
        auth: false,
    },
    Variant {
        name: "auth",
        tls: false,
        auth: true,
    },
    Variant {
        name: "tls",
        tls: true,
        auth: false,
    },
    Variant {
        name: "tls-auth",
        tls: true,
        auth: true,
    },
];

/// Latencies in microseconds → (p50, p99).
pub fn percentiles(mut micros: Vec<u64>) -> (u64, u64) {
    micros.sort_unstable();
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize];
    (at(0.50), at(0.99))
}

/// How the variant's clients connect: TLS or not, logged in or not.
pub(crate) struct Client {
    pub(crate) addr: SocketAddr,
    pub(crate) host: String,
    pub(crate) tls: Option<Arc<ClientConfig>>,
    pub(crate) auth: bool,
}

pub(crate) enum Conn {
    Plain(Connection),
    Tls(Box<Connection<TlsStream<TcpStream>>>),
}

impl Client {
    pub(crate) async fn connect(&self) -> Conn {
        let mut conn = match &self.tls {
            Some(config) => Conn::Tls(Box::new(
                Connection::connect_tls(self.addr, &self.host, config.clone())
                    .await
                    .unwrap(),
            )),
            None => Conn::Plain(Connection::connect(self.addr).await.unwrap()),
        };
        if self.auth {
            match &mut conn {
                Conn::Plain(c) => c.login(USER, PASSWORD).await.unwrap(),
                Conn::Tls(c) => c.login(USER, PASSWORD).await.unwrap(),
            }
        }
        conn
    }
}

impl Conn {
    /// One set and one get of `key`, timed separately.
    pub(crate) async fn set_then_get(&mut self, key: &str) -> (Duration, Duration) {
        match self {
            Conn::Plain(c) => timed_set_then_get(c, key).await,
            Conn::Tls(c) => timed_set_then_get(&mut **c, key).await,
        }
    }
}

async fn timed_set_then_get<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut Connection<S>,
    key: &str,
) -> (Duration, Duration) {
    let start = Instant::now();
    conn.set(key, VALUE).await.unwrap();
    let set = start.elapsed();
    let start = Instant::now();
    assert!(conn.get(key).await.unwrap().is_some(), "{key} read back");
    (set, start.elapsed())
}

/// Steady state: CONNECTIONS connections doing sets and gets for STEADY.
async fn steady(client: Arc<Client>) -> serde_json::Value {
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut conn = client.connect().await;
                let mut latencies = Vec::new();
                let end = Instant::now() + STEADY;
                let mut i = 0;
                while Instant::now() < end {
                    let key = format!("bench-{c}-{}", i % 1000);
                    let (set, get) = conn.set_then_get(&key).await;
                    latencies.push(set.as_micros() as u64);
                    latencies.push(get.as_micros() as u64);
                    i += 1;
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let ops = all.len() as f64 / STEADY.as_secs_f64();
    let (p50, p99) = percentiles(all);
    json!({"ops_per_second": ops.round(), "p50_us": p50, "p99_us": p99})
}

/// New connections one after another, each used for one set and get (a client without a pool).
async fn connecting(client: &Client) -> serde_json::Value {
    let mut latencies = Vec::new();
    let end = Instant::now() + CONNECTING;
    while Instant::now() < end {
        let start = Instant::now();
        client.connect().await.set_then_get("bench-connect").await;
        latencies.push(start.elapsed().as_micros() as u64);
    }
    let per_second = latencies.len() as f64 / CONNECTING.as_secs_f64();
    let (p50, p99) = percentiles(latencies);
    json!({"connections_per_second": per_second.round(), "p50_us": p50, "p99_us": p99})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: make bench-data-path"]
async fn data_path_costs_of_tls_and_auth() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "data-path").await;
    let _op = operator_with_agent(&client, &node, &ns).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    create_credentials(&secrets, "creds", USER, PASSWORD).await;
    let ca = Ca::new("benchmark CA");
    let names: Vec<String> = VARIANTS
        .iter()
        .map(|v| format!("{}.{ns}.svc", v.name))
        .collect();
    create_tls_secret(&secrets, "cert", &names, &ca).await;
    for v in &VARIANTS {
        let mut mc = memcached(v.name, 1);
        mc.spec.auth = v.auth.then(|| AuthSpec {
            enabled: true,
            secret_name: Some("creds".into()),
            ..AuthSpec::default()
        });
        mc.spec.tls = v.tls.then(|| TlsSpec {
            enabled: true,
            secret_name: Some("cert".into()),
            ..TlsSpec::default()
        });
        create(&client, &ns, &mc).await;
    }
    let mut results = serde_json::Map::new();
    for v in &VARIANTS {
        wait_converged(&client, &ns, v.name, 1).await;
        let ip: Ipv4Addr = pod_ip(&member_pods(&client, &ns, v.name).await[0]);
        let bench_client = Arc::new(Client {
            addr: SocketAddr::new(ip.into(), 11211),
            host: format!("{}.{ns}.svc", v.name),
            tls: v.tls.then(|| client_config(&ca.pem, None)),
            auth: v.auth,
        });
        let result = json!({
            "steady": steady(bench_client.clone()).await,
            "new_connections": connecting(&bench_client).await,
        });
        println!("{:<9} {result}", v.name);
        results.insert(v.name.into(), result);
    }
    let report = json!({
        "what": format!(
            "one memcached pod per variant on the real node; the client on the host, {CONNECTIONS} \
             connections for {STEADY:?} of set+get ({} B values), then new connections one after \
             another for {CONNECTING:?}",
            VALUE.len()
        ),
        "memcached_image": node.memcached_image(),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "results": results,
    });
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/data-path.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap() + "\n").unwrap();
    println!("written to {}", out.display());
}
