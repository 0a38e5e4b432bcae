//! The proxy's own view as Prometheus metrics (`agent route --metrics-address`, with
//! `spec.monitoring`): memcached's `stats`, `stats proxy` and `stats proxybe`, read over the
//! pod's loopback at each scrape, and the layout the agent last rendered. Every member the proxy
//! routes to has a `memcached_proxy_backend_up` series, 0 while memcached counts it bad (it
//! failed its last requests and has not answered since): memcached itself lists only the bad.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::net::TcpListener;
use tracing::{info, warn};

use super::endpoint::{serve, text};
use super::loopback::stats_answers;
use crate::resources::proxy::Layout;

/// What the route agent knows of the layout, shared with its metrics.
#[derive(Default, Debug)]
pub struct View {
    /// The layout last rendered (memcached was asked to load it).
    pub rendered: Option<Layout>,
    /// The mounted layout fails the check: memcached keeps routing by `rendered`.
    pub refused: bool,
    /// memcached failed to load the configuration rendered from `rendered`: it keeps routing by
    /// the one before, until a later layout loads.
    pub load_failed: bool,
}

/// memcached's answers to `stats`, `stats proxy` and `stats proxybe`.
pub struct Answers {
    pub stats: String,
    pub proxy: String,
    pub backends: String,
}

/// `STAT <name> <value>` lines as a map (memcached's stats answers).
pub(super) fn stat_lines(answer: &str) -> BTreeMap<&str, &str> {
    answer
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("STAT ")?.split_ascii_whitespace();
            Some((words.next()?, words.next()?))
        })
        .collect()
}

/// The metrics' text for one scrape: `answers` None when memcached did not answer.
pub fn render(answers: Option<&Answers>, view: &View) -> String {
    let registry = Registry::new();
    let gauge = |name: &str, help: &str, value: i64| {
        let g = IntGauge::new(name, help).expect("a valid metric");
        g.set(value);
        registry.register(Box::new(g)).expect("registered once");
    };
    let counter = |name: &str, help: &str, value: Option<&str>| {
        let Some(value) = value.and_then(|v| v.parse().ok()) else {
            return;
        };
        let c = IntCounter::new(name, help).expect("a valid metric");
        c.inc_by(value);
        registry.register(Box::new(c)).expect("registered once");
    };
    gauge(
        "memcached_proxy_up",
        "1 when memcached in proxy mode answered this scrape's stats.",
        answers.is_some() as i64,
    );
    gauge(
        "memcached_proxy_layout_refused",
        "1 while the layout the operator wrote fails the agent's check: the proxy keeps the last one it loaded.",
        view.refused as i64,
    );
    gauge(
        "memcached_proxy_layout_load_failed",
        "1 while memcached failed to load the configuration of the operator's latest layout: it keeps routing by the one before.",
        view.load_failed as i64,
    );
    let layout = view.rendered.as_ref();
    gauge(
        "memcached_proxy_layout_members",
        "Members in the layout the proxy was last asked to load.",
        layout.map_or(0, |l| l.members.len() as i64),
    );
    gauge(
        "memcached_proxy_layout_handover",
        "1 while the layout has a previous one, where reads that miss fall back.",
        layout.is_some_and(|l| !l.previous.is_empty()) as i64,
    );
    if let Some(answers) = answers {
        let stats = stat_lines(&answers.stats);
        for (name, help, stat) in [
            (
                "memcached_proxy_config_reloads_total",
                "Route configurations memcached loaded (proxy_config_reloads).",
                "proxy_config_reloads",
            ),
            (
                "memcached_proxy_config_reload_failures_total",
                "Route configurations memcached failed to load (proxy_config_reload_fails).",
                "proxy_config_reload_fails",
            ),
            (
                "memcached_proxy_backend_failures_total",
                "Connections to members that failed (proxy_backend_failed).",
                "proxy_backend_failed",
            ),
            (
                "memcached_proxy_backends_marked_bad_total",
                "Times a member was marked bad after failed requests (proxy_backend_marked_bad).",
                "proxy_backend_marked_bad",
            ),
        ] {
            counter(name, help, stats.get(stat).copied());
        }
        if let Some(n) = stats.get("curr_connections").and_then(|v| v.parse().ok()) {
            gauge(
                "memcached_proxy_current_connections",
                "Client connections open to the proxy.",
                n,
            );
        }
        let proxy = stat_lines(&answers.proxy);
        let commands = IntCounterVec::new(
            Opts::new(
                "memcached_proxy_commands_total",
                "Commands the proxy received, by command (stats proxy's cmd_*).",
            ),
            &["command"],
        )
        .expect("a valid metric");
        for (name, value) in &proxy {
            if let (Some(command), Ok(n)) = (name.strip_prefix("cmd_"), value.parse()) {
                commands.with_label_values(&[command]).inc_by(n);
            }
        }
        registry
            .register(Box::new(commands))
            .expect("registered once");
        if let Some(kb) = proxy
            .get("vm_memory_kb")
            .and_then(|v| v.parse::<i64>().ok())
        {
            gauge(
                "memcached_proxy_lua_memory_bytes",
                "Memory of the proxy's route configuration (its Lua VMs).",
                kb * 1024,
            );
        }
        if let Some(layout) = layout {
            let bad = stat_lines(&answers.backends);
            let up = IntGaugeVec::new(
                Opts::new(
                    "memcached_proxy_backend_up",
                    "1 for each member in the proxy's layout that memcached does not count bad (stats proxybe).",
                ),
                &["backend"],
            )
            .expect("a valid metric");
            for backend in layout.members.iter().chain(&layout.previous) {
                let is_bad = bad
                    .get(format!("bad_{backend}").as_str())
                    .and_then(|n| n.parse::<i64>().ok())
                    .is_some_and(|n| n > 0);
                up.with_label_values(&[backend.as_str()])
                    .set(!is_bad as i64);
            }
            registry.register(Box::new(up)).expect("registered once");
        }
    }
    operator_runtime::metrics::render(&registry)
}

/// Every metric name `render` can give (the monitoring tests check the alerts and the dashboard
/// read only names that exist).
pub fn names() -> Vec<String> {
    let answers = Answers {
        stats: "STAT curr_connections 1\r\nSTAT proxy_config_reloads 1\r\nSTAT proxy_config_reload_fails 0\r\nSTAT proxy_backend_failed 0\r\nSTAT proxy_backend_marked_bad 0\r\nEND\r\n".into(),
        proxy: "STAT vm_memory_kb 1\r\nSTAT cmd_get 1\r\nEND\r\n".into(),
        backends: "END\r\n".into(),
    };
    let view = View {
        rendered: Some(Layout {
            members: vec!["a:1".into()],
            ..Layout::default()
        }),
        ..View::default()
    };
    render(Some(&answers), &view)
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Serves `GET /metrics` on `address` from memcached at `memcached` and the agent's `view`.
pub async fn serve_metrics(
    address: SocketAddr,
    memcached: SocketAddr,
    view: Arc<Mutex<View>>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(address).await?;
    info!(address = %listener.local_addr()?, "serving the proxy's metrics");
    tokio::spawn(serve(listener, move |req| {
        scrape(req, memcached, view.clone())
    }));
    Ok(())
}

async fn scrape(
    req: Request<Incoming>,
    memcached: SocketAddr,
    view: Arc<Mutex<View>>,
) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return text(StatusCode::NOT_FOUND, "not found\n".to_string());
    }
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_string());
    }
    let commands = ["stats", "stats proxy", "stats proxybe"];
    let answers = match stats_answers(memcached, commands).await {
        Ok([stats, proxy, backends]) => Some(Answers {
            stats,
            proxy,
            backends,
        }),
        Err(error) => {
            warn!(%error, "memcached's stats");
            None
        }
    };
    let body = render(answers.as_ref(), &view.lock().expect("not poisoned"));
    let mut response = text(StatusCode::OK, body);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = "STAT pid 7\r\nSTAT curr_connections 12\r\nSTAT proxy_config_reloads 3\r\nSTAT proxy_config_reload_fails 1\r\nSTAT proxy_backend_total 3\r\nSTAT proxy_backend_marked_bad 2\r\nSTAT proxy_backend_failed 9\r\nEND\r\n";
    const PROXY: &str = "STAT active_req_limit 0\r\nSTAT vm_memory_kb 512\r\nSTAT cmd_mg 0\r\nSTAT cmd_get 40\r\nSTAT cmd_set 25\r\nEND\r\n";

    fn view(members: &[&str], previous: &[&str]) -> View {
        View {
            rendered: Some(Layout {
                members: members.iter().map(|m| m.to_string()).collect(),
                previous: previous.iter().map(|m| m.to_string()).collect(),
                ..Layout::default()
            }),
            ..View::default()
        }
    }

    #[test]
    fn each_member_of_the_layout_is_up_unless_memcached_counts_it_bad() {
        let answers = Answers {
            stats: STATS.into(),
            proxy: PROXY.into(),
            backends: "STAT bad_c-1.c.ns.svc:11211 2\r\nSTAT bad_gone.c.ns.svc:11211 1\r\nEND\r\n"
                .into(),
        };
        let text = render(
            Some(&answers),
            &view(
                &["c-0.c.ns.svc:11211", "c-1.c.ns.svc:11211"],
                &[
                    "c-0.c.ns.svc:11211",
                    "c-1.c.ns.svc:11211",
                    "c-2.c.ns.svc:11211",
                ],
            ),
        );
        for line in [
            "memcached_proxy_up 1",
            r#"memcached_proxy_backend_up{backend="c-0.c.ns.svc:11211"} 1"#,
            r#"memcached_proxy_backend_up{backend="c-1.c.ns.svc:11211"} 0"#,
            r#"memcached_proxy_backend_up{backend="c-2.c.ns.svc:11211"} 1"#,
            "memcached_proxy_config_reloads_total 3",
            "memcached_proxy_config_reload_failures_total 1",
            "memcached_proxy_backend_failures_total 9",
            "memcached_proxy_backends_marked_bad_total 2",
            "memcached_proxy_current_connections 12",
            r#"memcached_proxy_commands_total{command="get"} 40"#,
            r#"memcached_proxy_commands_total{command="set"} 25"#,
            "memcached_proxy_lua_memory_bytes 524288",
            "memcached_proxy_layout_members 2",
            "memcached_proxy_layout_handover 1",
            "memcached_proxy_layout_refused 0",
            "memcached_proxy_layout_load_failed 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        // A backend no longer in the layout is not reported, however memcached counts it.
        assert!(!text.contains("gone.c.ns.svc"), "{text}");
    }

    #[test]
    fn memcached_not_answering_is_down_and_a_refused_layout_is_said() {
        let mut view = view(&["c-0.c.ns.svc:11211"], &[]);
        view.refused = true;
        let text = render(None, &view);
        assert!(text.lines().any(|l| l == "memcached_proxy_up 0"), "{text}");
        assert!(
            text.lines()
                .any(|l| l == "memcached_proxy_layout_refused 1"),
            "{text}"
        );
        assert!(!text.contains("memcached_proxy_backend_up"), "{text}");
        assert!(text.contains("memcached_proxy_layout_handover 0"), "{text}");
    }

    #[test]
    fn every_name_is_listed() {
        let names = names();
        for name in [
            "memcached_proxy_up",
            "memcached_proxy_backend_up",
            "memcached_proxy_config_reload_failures_total",
            "memcached_proxy_commands_total",
            "memcached_proxy_layout_refused",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
    }
}
