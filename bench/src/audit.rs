//! Write requests counted from the API server's audit log: every request of the operator's
//! ServiceAccount, and the control plane's first act on the operator's write of its workload:
//! the deployment controller's ReplicaSet writes, or the statefulset controller's pod writes.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use k8s_openapi::jiff::Timestamp;
use memcached_operator::config::OPERATOR_NAMESPACE;

const DEPLOYMENT_CONTROLLER: &str = "system:serviceaccount:kube-system:deployment-controller";
const STATEFULSET_CONTROLLER: &str = "system:serviceaccount:kube-system:statefulset-controller";

/// Audit policy: request metadata for the operator's ServiceAccounts, for the deployment
/// controller's ReplicaSet writes, for the statefulset controller's pod writes and for everyone's
/// lists and watches of pods (a few hundred at most), nothing else.
pub const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:memcached-operator-system"]
- level: Metadata
  users: ["system:serviceaccount:kube-system:deployment-controller"]
  verbs: ["create", "update", "patch"]
  resources: [{group: "apps", resources: ["replicasets"]}]
- level: Metadata
  users: ["system:serviceaccount:kube-system:statefulset-controller"]
  verbs: ["create", "update", "patch", "delete"]
  resources: [{group: "", resources: ["pods"]}]
- level: Metadata
  verbs: ["list", "watch"]
  resources: [{group: "", resources: ["pods"]}]
- level: None
"#;

/// Whose requests to read from the log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum By {
    Operator,
    /// Scales a Deployment's ReplicaSets.
    DeploymentController,
    /// Creates and deletes a StatefulSet's pods itself.
    StatefulSetController,
}

impl By {
    fn made(self, event: &serde_json::Value) -> bool {
        let user = event["user"]["username"].as_str().unwrap_or_default();
        match self {
            By::Operator => user
                .strip_prefix("system:serviceaccount:")
                .and_then(|u| u.strip_prefix(OPERATOR_NAMESPACE))
                .is_some_and(|u| u.starts_with(':')),
            By::DeploymentController => user == DEPLOYMENT_CONTROLLER,
            By::StatefulSetController => user == STATEFULSET_CONTROLLER,
        }
    }
}

pub fn now() -> Timestamp {
    Timestamp::now()
}

#[derive(Debug, Default)]
pub struct Counts {
    pub writes: u64,
    /// Every client's lists and ended watches of pods: "verb user" -> requests completed. A watch
    /// completes when it ends: at its timeout, or when the API server closes a client that reads
    /// too slowly, which then watches again, or lists everything again.
    pub pod_reads: BTreeMap<String, u64>,
    /// "verb resource code" -> count, reads included.
    pub by_key: BTreeMap<String, u64>,
    /// "verb resource" -> each request's time in the API server (received to answered), in ms.
    pub latency_ms: BTreeMap<String, Vec<f64>>,
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

/// The audit log and the files it was rotated into (`audit-<time>.log` beside it): the API
/// server rotates at --audit-log-maxsize, 100 MB when unset, which 10,000 CRs pass.
fn log_files(log: &Path) -> Vec<std::path::PathBuf> {
    let dir = log.parent().unwrap_or(Path::new("."));
    let stem = log.file_stem().and_then(|s| s.to_str()).unwrap_or("audit");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.ends_with(".log")
                    && (n == format!("{stem}.log") || n.starts_with(&format!("{stem}-")))
            })
        })
        .collect();
    files.sort();
    files
}

/// Every completed request in the log and the files it was rotated into, oldest file first.
fn completed(log: &Path) -> impl Iterator<Item = serde_json::Value> {
    log_files(log).into_iter().flat_map(|file| {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|event| event["stage"] == "ResponseComplete")
            .collect::<Vec<_>>()
    })
}

/// The operator's requests completed between `from` and `to`, by verb, resource (with
/// subresource) and code; and everyone's lists and watches of pods, in the same pass over the log.
pub fn count(log: &Path, from: Timestamp, to: Timestamp) -> Result<Counts> {
    let mut counts = Counts::default();
    for event in completed(log) {
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
        let object = &event["objectRef"];
        if object["resource"] == "pods"
            && object["subresource"].is_null()
            && matches!(verb, "list" | "watch")
        {
            let user = event["user"]["username"].as_str().unwrap_or("(unknown)");
            *counts
                .pod_reads
                .entry(format!("{verb} {user}"))
                .or_default() += 1;
        }
        if verb == "watch" || !By::Operator.made(&event) {
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
        if let Some(received) = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
        {
            let ms = at.duration_since(received).as_secs_f64() * 1000.0;
            counts
                .latency_ms
                .entry(format!("{verb} {resource}"))
                .or_default()
                .push(ms);
        }
        if matches!(
            verb,
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) {
            counts.writes += 1;
        }
    }
    Ok(counts)
}

/// When the API server received and answered a write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Write {
    pub received: Timestamp,
    pub answered: Timestamp,
}

/// Per (namespace, name), the first successful write to `resource` by `by` received at or after
/// `from`.
pub fn first_writes(
    log: &Path,
    by: By,
    resource: &str,
    from: Timestamp,
) -> BTreeMap<(String, String), Write> {
    let mut first = BTreeMap::new();
    for event in completed(log).filter(|e| by.made(e)) {
        let object = &event["objectRef"];
        let code = event["responseStatus"]["code"].as_u64().unwrap_or(0);
        if !matches!(event["verb"].as_str(), Some("patch" | "update" | "create"))
            || object["resource"] != resource
            || !object["subresource"].is_null()
            || !(200..300).contains(&code)
        {
            continue;
        }
        let time = |field: &str| event[field].as_str()?.parse::<Timestamp>().ok();
        let (Some(received), Some(answered)) =
            (time("requestReceivedTimestamp"), time("stageTimestamp"))
        else {
            continue;
        };
        if received < from {
            continue;
        }
        let key = (
            object["namespace"].as_str().unwrap_or_default().to_string(),
            object["name"].as_str().unwrap_or_default().to_string(),
        );
        keep_earliest(&mut first, key, Write { received, answered });
    }
    first
}

/// Records `write` under `key` unless an earlier-received one is there.
pub fn keep_earliest(
    first: &mut BTreeMap<(String, String), Write>,
    key: (String, String),
    write: Write,
) {
    first
        .entry(key)
        .and_modify(|w| {
            if write.received < w.received {
                *w = write;
            }
        })
        .or_insert(write);
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPERATOR: &str = "system:serviceaccount:memcached-operator-system:controller-manager";

    fn line(verb: &str, resource: &str, code: u16, at: &str) -> String {
        serde_json::json!({
            "stage": "ResponseComplete", "stageTimestamp": at, "verb": verb,
            "user": {"username": OPERATOR},
            "objectRef": {"resource": resource}, "responseStatus": {"code": code},
        })
        .to_string()
    }

    #[test]
    fn counts_span_rotated_files_and_the_time_window() {
        let dir = std::env::temp_dir().join(format!("audit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rotated = [
            line("patch", "deployments", 201, "2026-01-01T00:00:01Z"),
            line("create", "events", 409, "2026-01-01T00:00:02Z"),
        ];
        let controller = line("update", "replicasets", 200, "2026-01-01T00:00:03Z")
            .replace(OPERATOR, DEPLOYMENT_CONTROLLER);
        let current = [
            line("get", "deployments", 404, "2026-01-01T00:00:03Z"),
            controller,
            line("patch", "services", 201, "2026-01-01T00:00:09Z"),
        ];
        std::fs::write(
            dir.join("audit-2026-01-01T00-00-02.500.log"),
            rotated.join("\n"),
        )
        .unwrap();
        std::fs::write(dir.join("audit.log"), current.join("\n")).unwrap();
        std::fs::write(dir.join("other.log"), rotated.join("\n")).unwrap();

        let from = "2026-01-01T00:00:00Z".parse().unwrap();
        let to = "2026-01-01T00:00:05Z".parse().unwrap();
        let counts = count(&dir.join("audit.log"), from, to).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();

        assert_eq!(counts.writes, 2, "{counts:?}");
        assert_eq!(counts.code(409), 1);
        assert_eq!(counts.by_key.get("get deployments 404"), Some(&1));
        assert_eq!(counts.by_key.get("patch services 201"), None);
        assert_eq!(
            counts.by_key.get("update replicasets 200"),
            None,
            "only the operator's requests count"
        );
    }

    #[test]
    fn every_clients_ended_watches_and_lists_of_pods_are_counted_by_user() {
        let read = |user: &str, verb: &str, resource: &str, at: &str| {
            line(verb, resource, 200, at).replace(OPERATOR, user)
        };
        let dir = std::env::temp_dir().join(format!("audit-reads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lines = [
            read("kwok", "watch", "pods", "2026-01-01T00:00:01Z"),
            read("kwok", "watch", "pods", "2026-01-01T00:00:02Z"),
            read("admin", "list", "pods", "2026-01-01T00:00:03Z"),
            read("admin", "watch", "memcacheds", "2026-01-01T00:00:03Z"),
            read("admin", "get", "pods", "2026-01-01T00:00:03Z"),
            read("kwok", "watch", "pods", "2026-01-01T00:00:09Z"),
            // A watch that has started answering has not ended.
            read("kwok", "watch", "pods", "2026-01-01T00:00:04Z")
                .replace("ResponseComplete", "ResponseStarted"),
        ];
        std::fs::write(dir.join("audit.log"), lines.join("\n")).unwrap();
        let from = "2026-01-01T00:00:00Z".parse().unwrap();
        let to = "2026-01-01T00:00:05Z".parse().unwrap();
        let counts = count(&dir.join("audit.log"), from, to).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();

        assert_eq!(
            counts.pod_reads,
            BTreeMap::from([("list admin".to_string(), 1), ("watch kwok".to_string(), 2)])
        );
    }

    #[test]
    fn the_first_write_of_each_object_after_a_moment_is_found() {
        let write = |name: &str, code: u16, received: &str, answered: &str| {
            serde_json::json!({
                "stage": "ResponseComplete", "verb": "patch",
                "user": {"username": OPERATOR},
                "requestReceivedTimestamp": received, "stageTimestamp": answered,
                "objectRef": {"resource": "deployments", "namespace": "ns", "name": name},
                "responseStatus": {"code": code},
            })
            .to_string()
        };
        let dir = std::env::temp_dir().join(format!("audit-first-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lines = [
            write("a", 200, "2026-01-01T00:00:01Z", "2026-01-01T00:00:01.5Z"),
            write("a", 200, "2026-01-01T00:00:04Z", "2026-01-01T00:00:04.2Z"),
            write("a", 200, "2026-01-01T00:00:03Z", "2026-01-01T00:00:03.1Z"),
            write("b", 422, "2026-01-01T00:00:03Z", "2026-01-01T00:00:03.1Z"),
            write("c", 200, "2026-01-01T00:00:03Z", "2026-01-01T00:00:03.1Z")
                .replace(OPERATOR, DEPLOYMENT_CONTROLLER),
        ];
        std::fs::write(dir.join("audit.log"), lines.join("\n")).unwrap();
        let found = first_writes(
            &dir.join("audit.log"),
            By::Operator,
            "deployments",
            "2026-01-01T00:00:02Z".parse().unwrap(),
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let a = found[&("ns".to_string(), "a".to_string())];
        assert_eq!(a.received, "2026-01-01T00:00:03Z".parse().unwrap());
        assert_eq!(a.answered, "2026-01-01T00:00:03.1Z".parse().unwrap());
        assert_eq!(
            found.len(),
            1,
            "a refused write is not the change, nor another user's: {found:?}"
        );
    }

    #[test]
    fn the_policy_logs_each_controller_that_is_read() {
        for (user, resource) in [
            (DEPLOYMENT_CONTROLLER, "replicasets"),
            (STATEFULSET_CONTROLLER, "pods"),
        ] {
            let rule = POLICY
                .split("- level:")
                .find(|rule| rule.contains(user))
                .unwrap_or_else(|| panic!("no rule for {user}"));
            assert!(rule.starts_with(" Metadata"), "{rule}");
            assert!(
                rule.contains(&format!("resources: [\"{resource}\"]")),
                "{rule}"
            );
            assert!(rule.contains("\"create\""), "{rule}");
        }
        assert!(POLICY.trim_end().ends_with("- level: None"));
    }

    #[test]
    fn the_statefulset_controllers_pod_creates_are_found_and_no_one_elses() {
        let write = |user: &str, verb: &str, resource: &str, name: &str, at: &str| {
            serde_json::json!({
                "stage": "ResponseComplete", "verb": verb,
                "user": {"username": user},
                "requestReceivedTimestamp": at, "stageTimestamp": at,
                "objectRef": {"resource": resource, "namespace": "ns", "name": name},
                "responseStatus": {"code": 201},
            })
            .to_string()
        };
        let dir = std::env::temp_dir().join(format!("audit-sts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lines = [
            write(
                STATEFULSET_CONTROLLER,
                "create",
                "pods",
                "mc-00001-0",
                "2026-01-01T00:00:01Z",
            ),
            write(
                STATEFULSET_CONTROLLER,
                "create",
                "pods",
                "mc-00001-1",
                "2026-01-01T00:00:03Z",
            ),
            write(
                STATEFULSET_CONTROLLER,
                "delete",
                "pods",
                "mc-00002-1",
                "2026-01-01T00:00:03Z",
            ),
            write(
                DEPLOYMENT_CONTROLLER,
                "update",
                "replicasets",
                "mc-00003-7d9f8b",
                "2026-01-01T00:00:03Z",
            ),
            write(
                OPERATOR,
                "create",
                "pods",
                "mc-00004-1",
                "2026-01-01T00:00:03Z",
            ),
        ];
        std::fs::write(dir.join("audit.log"), lines.join("\n")).unwrap();
        let log = dir.join("audit.log");
        let from = "2026-01-01T00:00:02Z".parse().unwrap();
        let pods = first_writes(&log, By::StatefulSetController, "pods", from);
        let replica_sets = first_writes(&log, By::DeploymentController, "replicasets", from);
        let none = first_writes(&log, By::StatefulSetController, "replicasets", from);
        std::fs::remove_dir_all(&dir).unwrap();

        assert_eq!(
            pods.keys().collect::<Vec<_>>(),
            [&("ns".to_string(), "mc-00001-1".to_string())],
            "a create since the moment, not a delete nor another user's: {pods:?}"
        );
        assert_eq!(
            replica_sets.keys().collect::<Vec<_>>(),
            [&("ns".to_string(), "mc-00003-7d9f8b".to_string())]
        );
        assert!(none.is_empty(), "{none:?}");
    }
}
