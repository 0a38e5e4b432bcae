//! Write requests counted from the API server's audit log (the operator's ServiceAccount only).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use k8s_openapi::jiff::Timestamp;

/// Audit policy: request metadata for the operator's ServiceAccounts, nothing for anyone else.
pub const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:memcached-operator-system"]
- level: None
"#;

pub fn now() -> Timestamp {
    Timestamp::now()
}

#[derive(Debug, Default)]
pub struct Counts {
    pub writes: u64,
    /// "verb resource code" -> count, reads included.
    pub by_key: BTreeMap<String, u64>,
}

impl Counts {
    pub fn code(&self, code: u16) -> u64 {
        let suffix = format!(" {code}");
        self.by_key
            .iter()
            .filter(|(k, _)| k.ends_with(&suffix))
            .map(|(_, v)| v)
            .sum()
    }
}

/// Requests completed between `from` and `to`, by verb, resource (with subresource) and code.
pub fn count(log: &Path, from: Timestamp, to: Timestamp) -> Result<Counts> {
    let mut counts = Counts::default();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if event["stage"] != "ResponseComplete" {
            continue;
        }
        let Some(at) = event["stageTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
        else {
            continue;
        };
        if at < from || at > to {
            continue;
        }
        let verb = event["verb"].as_str().unwrap_or_default();
        if verb == "watch" {
            continue;
        }
        let object = &event["objectRef"];
        let mut resource = object["resource"]
            .as_str()
            .unwrap_or("(non-resource)")
            .to_string();
        if let Some(sub) = object["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let code = event["responseStatus"]["code"].as_u64().unwrap_or(0);
        *counts
            .by_key
            .entry(format!("{verb} {resource} {code}"))
            .or_default() += 1;
        if matches!(
            verb,
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) {
            counts.writes += 1;
        }
    }
    Ok(counts)
}
