//! What the whole control plane was asked to do over a window, from the API server's own
//! counters: writes and lists by every client, watch events (and their bytes) it sent, and the
//! watchers it closed because they read too slowly, per resource. The audit log covers only the
//! operator (and who lists and watches pods); these show what the operator's writes set off.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use kube::Client;
use serde_json::{Value, json};

const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// The counters at one moment, keyed by (series, resource).
#[derive(Default)]
pub struct Counters(BTreeMap<(&'static str, String), f64>);

const WRITES: &str = "writes";
const WATCH_EVENTS: &str = "watch_events";
const WATCH_BYTES: &str = "watch_bytes";
const LISTS: &str = "lists";
/// A watcher whose client fell behind its buffer: the client re-watches, or lists again.
const WATCHERS_CLOSED: &str = "watchers_closed_unresponsive";

impl Counters {
    pub async fn read(client: &Client) -> Result<Self> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        let text = client
            .request_text(request)
            .await
            .context("the API server's /metrics")?;
        Ok(Self::parse(&text))
    }

    fn parse(text: &str) -> Self {
        let mut counters = Self::default();
        for line in text.lines() {
            let Some((series, rest)) = line.split_once('{') else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let labels = parse_labels(labels);
            let label = |name: &str| labels.get(name).copied().unwrap_or_default();
            let key = match series {
                "apiserver_request_total" if WRITE_VERBS.contains(&label("verb")) => WRITES,
                "apiserver_request_total" if label("verb") == "LIST" => LISTS,
                "apiserver_terminated_watchers_total" => WATCHERS_CLOSED,
                "apiserver_watch_events_total" => WATCH_EVENTS,
                "apiserver_watch_events_sizes_sum" => WATCH_BYTES,
                _ => continue,
            };
            let resource = match label("subresource") {
                "" => label("resource").to_string(),
                sub => format!("{}/{sub}", label("resource")),
            };
            *counters.0.entry((key, resource)).or_default() += value;
        }
        counters
    }

    /// What changed from `before` to `self`: per resource and in total, for each series.
    pub fn since(&self, before: &Counters) -> Value {
        let mut by_series: BTreeMap<&str, BTreeMap<&str, f64>> =
            [WRITES, LISTS, WATCH_EVENTS, WATCH_BYTES, WATCHERS_CLOSED]
                .map(|series| (series, BTreeMap::new()))
                .into();
        for (key @ (series, resource), after) in &self.0 {
            let delta = after - before.0.get(key).copied().unwrap_or_default();
            if delta > 0.0 {
                by_series.entry(series).or_default().insert(resource, delta);
            }
        }
        let mut out = serde_json::Map::new();
        for (series, by_resource) in by_series {
            let total: f64 = by_resource.values().sum();
            out.insert(format!("{series}_total"), json!(total));
            out.insert(series.to_string(), json!(by_resource));
        }
        Value::Object(out)
    }
}

/// `a="x",b="y"` as a map; values carry no quotes or commas in these series.
fn parse_labels(labels: &str) -> BTreeMap<&str, &str> {
    labels
        .split("\",")
        .filter_map(|pair| {
            let (name, value) = pair.split_once("=\"")?;
            Some((name.trim_start_matches(','), value.trim_end_matches('"')))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_lists_watch_events_and_closed_watchers_are_counted_per_resource_over_a_window() {
        let before = Counters::parse(concat!(
            "apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"apps\",resource=\"deployments\",scope=\"resource\",subresource=\"\",verb=\"APPLY\",version=\"v1\"} 10\n",
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"apps\",resource=\"deployments\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 3\n",
            "apiserver_watch_events_total{group=\"apps\",resource=\"deployments\",version=\"v1\"} 100\n",
        ));
        let after = Counters::parse(concat!(
            "# HELP apiserver_request_total Counter of apiserver requests\n",
            "apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"apps\",resource=\"deployments\",scope=\"resource\",subresource=\"\",verb=\"APPLY\",version=\"v1\"} 15\n",
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"apps\",resource=\"deployments\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 9\n",
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"status\",verb=\"PATCH\",version=\"v1\"} 4\n",
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"cluster\",subresource=\"\",verb=\"LIST\",version=\"v1\"} 2\n",
            "apiserver_terminated_watchers_total{group=\"\",resource=\"pods\",version=\"v1\"} 3\n",
            "apiserver_watch_events_total{group=\"apps\",resource=\"deployments\",version=\"v1\"} 130\n",
            "apiserver_watch_events_sizes_sum{group=\"apps\",resource=\"deployments\",version=\"v1\"} 65536\n",
        ));
        assert_eq!(
            after.since(&before),
            json!({
                "writes_total": 9.0, "writes": {"deployments": 5.0, "pods/status": 4.0},
                "lists_total": 2.0, "lists": {"pods": 2.0},
                "watchers_closed_unresponsive_total": 3.0, "watchers_closed_unresponsive": {"pods": 3.0},
                "watch_events_total": 30.0, "watch_events": {"deployments": 30.0},
                "watch_bytes_total": 65536.0, "watch_bytes": {"deployments": 65536.0},
            })
        );
    }
}
