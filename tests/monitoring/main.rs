//! What ships for Prometheus and Grafana, checked without a cluster (`make test-unit`):
//! - the alerts (config/prometheus/prometheus_rule.yaml) pass `promtool check rules` and the
//!   `promtool test rules` cases in config/prometheus/tests, which fire and do not fire every
//!   alert;
//! - the Grafana dashboard (config/grafana) is valid JSON whose every panel has a query;
//! - every metric name the alerts and the dashboard read is one the operator registers, the
//!   exporter serves (tests/monitoring/exporter_metrics.txt) or the proxy's agent serves; the
//!   real-node suite checks them against a real Prometheus too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use memcached_operator::metrics::Metrics;
use memcached_operator_testkit::promql::metric_names;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The PrometheusRule's spec: a Prometheus rules file (`groups:`).
fn rule_groups() -> serde_json::Value {
    let rule: serde_json::Value =
        serde_saphyr::from_str(&read("config/prometheus/prometheus_rule.yaml")).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"].clone()
}

fn alerts() -> Vec<serde_json::Value> {
    rule_groups()["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

fn dashboard() -> Value {
    serde_json::from_str(&read("config/grafana/memcached-operator.json"))
        .expect("the dashboard is valid JSON")
}

/// Every query of every panel (rows' nested panels too).
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push((title.clone(), t["expr"].as_str().unwrap_or_default().into()));
            }
            walk(p["panels"].as_array().map_or(&[], Vec::as_slice), out);
        }
    }
    let mut out = Vec::new();
    walk(dashboard["panels"].as_array().unwrap(), &mut out);
    out
}

/// The metric a `label_values(metric{...}, label)` template variable reads.
fn template_names(dashboard: &Value) -> BTreeSet<String> {
    dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["query"].as_str())
        .filter_map(|q| q.strip_prefix("label_values("))
        .flat_map(|args| metric_names(args.rsplit_once(',').map_or(args, |(m, _)| m)))
        .collect()
}

/// What exists: the operator's registry (histograms with their series suffixes), the exporter's
/// scrape, and Prometheus's own `up`.
fn known_names() -> BTreeSet<String> {
    let mut known: BTreeSet<String> = BTreeSet::from(["up".to_string()]);
    for name in Metrics::new().names() {
        for suffix in ["", "_bucket", "_sum", "_count"] {
            known.insert(format!("{name}{suffix}"));
        }
    }
    // The proxy's agent serves its own (spec.proxy with spec.monitoring).
    known.extend(memcached_operator::agent::proxy_metric_names());
    known.extend(
        read("tests/monitoring/exporter_metrics.txt")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| l.trim().to_string()),
    );
    known
}

#[test]
fn the_dashboard_is_valid_and_every_panel_has_a_query() {
    let d = dashboard();
    assert_eq!(d["uid"], "memcached-operator");
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut graphs = 0;
    for p in panels {
        let title = p["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(p["id"].as_i64().unwrap()),
            "panel ids are unique"
        );
        assert!(p["gridPos"]["w"].as_i64().unwrap() > 0, "{title}: gridPos");
        if p["type"] == "row" {
            continue;
        }
        graphs += 1;
        assert!(
            p["description"].as_str().is_some_and(|s| !s.is_empty()),
            "{title}: a description says what it shows"
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "{title}: an empty query");
            assert!(
                !metric_names(expr).is_empty(),
                "{title}: {expr} reads no series"
            );
        }
    }
    assert!(graphs >= 12, "{graphs} panels");
    // The ConfigMap that ships it carries the sidecar's label.
    let kustomization = read("config/grafana/kustomization.yaml");
    assert!(kustomization.contains("grafana_dashboard: \"1\""));
    assert!(kustomization.contains("- memcached-operator.json"));
}

#[test]
fn dashboards_and_alerts_read_only_metrics_that_exist() {
    let known = known_names();
    let d = dashboard();
    let mut used: Vec<(String, String)> = dashboard_queries(&d)
        .into_iter()
        .flat_map(|(title, expr)| {
            metric_names(&expr)
                .into_iter()
                .map(move |n| (format!("dashboard panel {title:?}"), n))
        })
        .collect();
    used.extend(
        template_names(&d)
            .into_iter()
            .map(|n| ("dashboard variable".to_string(), n)),
    );
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap().to_string();
        for n in metric_names(alert["expr"].as_str().unwrap()) {
            used.push((format!("alert {name}"), n));
        }
    }
    let unknown: Vec<_> = used.iter().filter(|(_, n)| !known.contains(n)).collect();
    assert!(
        unknown.is_empty(),
        "names that nothing exports: {unknown:?}"
    );
    // The operator's own series are among them, and so are the exporter's.
    let names: BTreeSet<_> = used.iter().map(|(_, n)| n.as_str()).collect();
    for n in [
        "controller_runtime_reconcile_total",
        "memcached_operator_memcached_condition",
        "memcached_items_evicted_total",
        "memcached_current_connections",
        "memcached_proxy_backend_up",
        "memcached_proxy_commands_total",
    ] {
        assert!(names.contains(n), "{n} is used");
    }
}

#[test]
fn every_alert_has_a_summary_description_and_runbook_section() {
    let docs = read("docs/monitoring.md");
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        let annotations = &alert["annotations"];
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                annotations[key].as_str().is_some_and(|s| !s.is_empty()),
                "{name}: {key}"
            );
        }
        let anchor = name.to_ascii_lowercase();
        assert!(
            annotations["runbook_url"]
                .as_str()
                .unwrap()
                .ends_with(&format!("docs/monitoring.md#{anchor}")),
            "{name}: runbook_url points at its section"
        );
        assert!(
            docs.contains(&format!("\n### {name}\n")),
            "docs/monitoring.md has a runbook section for {name}"
        );
        assert!(alert["labels"]["severity"].as_str().is_some(), "{name}");
    }
}

fn promtool() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("promtool"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("promtool not found: install Debian's prometheus package (make test-unit does so as root)")
    })
}

fn run(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {}:\n{text}", args.join(" "));
    text
}

#[test]
fn promtool_tests_fire_and_spare_every_alert() {
    let dir = std::env::temp_dir().join(format!("memcached-operator-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rules.yaml"),
        serde_saphyr::to_string(&rule_groups()).unwrap(),
    )
    .unwrap();
    let tests = read("config/prometheus/tests/alerts_test.yaml");
    std::fs::write(dir.join("alerts_test.yaml"), &tests).unwrap();
    let checked = run(&dir, &["check", "rules", "rules.yaml"]);
    println!("{checked}");
    let tested = run(&dir, &["test", "rules", "alerts_test.yaml"]);
    println!("{tested}");
    assert!(tested.contains("SUCCESS"));

    // Every alert has a case where it fires and one where it does not.
    let cases: serde_json::Value = serde_saphyr::from_str(&tests).unwrap();
    let mut fired = BTreeSet::new();
    let mut spared = BTreeSet::new();
    for test in cases["tests"].as_array().unwrap() {
        for case in test["alert_rule_test"].as_array().unwrap() {
            let name = case["alertname"].as_str().unwrap().to_string();
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected > 0 {
                fired.insert(name);
            } else {
                spared.insert(name);
            }
        }
    }
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        assert!(fired.contains(name), "no case where {name} fires");
        assert!(spared.contains(name), "no case where {name} stays quiet");
    }
    std::fs::remove_dir_all(&dir).ok();
}
