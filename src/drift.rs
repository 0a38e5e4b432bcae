//! Does an object already hold what we would apply? Lets a no-op reconcile make no write at all.
//!
//! Server-side apply of an unchanged object is harmless but still a write request; at thousands of
//! CRs and every resync that is load on the API server for nothing. The API server adds defaults
//! and other managers' fields, so "already applied" means: every field we set is present with the
//! same value.

use serde::Serialize;
use serde_json::Value;

/// True when applying `desired` over `actual` could change `actual`.
pub fn needs_apply<D: Serialize, A: Serialize>(desired: &D, actual: &A) -> bool {
    match serde_json::to_value(actual) {
        Ok(actual) => differs(desired, &actual, Lists::MayHaveMore),
        // Cannot tell: applying is always safe.
        Err(_) => true,
    }
}

/// As `needs_apply`, for an object the cache cut down to the fields our apply owns
/// (controller/kept.rs): an item there that `desired` no longer lists (the exporter sidecar, the
/// metrics port, once monitoring is turned off) was applied by us, and applying removes it.
pub fn needs_apply_to_ours<D: Serialize>(desired: &D, ours: &Value) -> bool {
    differs(desired, ours, Lists::ExactBelowSpec)
}

/// How lists of objects (merged by key on the server) and, within a spec, objects compare.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lists {
    /// Other managers' items may follow ours.
    MayHaveMore,
    /// Every item is ours: one more is one to remove. Objects too, once within a `spec` (the
    /// object's metadata and status are not cut to ours).
    Exact,
    /// As `Exact`, above the spec.
    ExactBelowSpec,
}

impl Lists {
    fn within(self, key: &str) -> Lists {
        match self {
            Lists::ExactBelowSpec if key == "spec" => Lists::Exact,
            other => other,
        }
    }
}

fn differs<D: Serialize>(desired: &D, actual: &Value, lists: Lists) -> bool {
    match serde_json::to_value(desired) {
        Ok(desired) => !contains(actual, &desired, lists),
        Err(_) => true,
    }
}

/// `actual` holds every field of `desired` with an equal value.
///
/// Arrays of objects (containers, ports, owner references) are merged by key on the server, so
/// extra items that another manager added do not make us re-apply; our items must match in place.
/// Arrays of scalars (args, command, finalizers) are atomic and must match exactly.
fn contains(actual: &Value, desired: &Value, lists: Lists) -> bool {
    match (actual, desired) {
        (Value::Object(a), Value::Object(d)) => {
            // Within our cut of a spec every field is one we applied: a field `desired` no
            // longer sets (a node selector taken out of the Memcached) is removed by applying.
            let unwanted = lists == Lists::Exact
                && a.iter()
                    .any(|(key, av)| !d.contains_key(key) && !is_empty(av));
            !unwanted
                && d.iter().all(|(key, dv)| match a.get(key) {
                    Some(av) => contains(av, dv, lists.within(key)),
                    None => is_empty(dv),
                })
        }
        (Value::Array(a), Value::Array(d)) => {
            let objects = d.iter().all(Value::is_object);
            if objects {
                let lengths = match lists {
                    Lists::MayHaveMore => a.len() >= d.len(),
                    Lists::Exact | Lists::ExactBelowSpec => a.len() == d.len(),
                };
                lengths && d.iter().zip(a).all(|(dv, av)| contains(av, dv, lists))
            } else {
                a == d
            }
        }
        (a, d) => a == d,
    }
}

/// The API server drops empty maps and lists, so their absence is no difference.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_defaults_and_foreign_fields_are_no_drift() {
        let desired = json!({"spec": {"replicas": 3, "template": {"containers": [{"name": "m", "args": ["-m", "64"]}]}}});
        let actual = json!({
            "metadata": {"resourceVersion": "7", "annotations": {"deployment.kubernetes.io/revision": "1"}},
            "spec": {"replicas": 3, "progressDeadlineSeconds": 600,
                     "template": {"containers": [
                        {"name": "m", "args": ["-m", "64"], "terminationMessagePath": "/dev/termination-log"},
                        {"name": "sidecar"}]}}
        });
        assert!(!needs_apply(&desired, &actual));
    }

    #[test]
    fn an_item_of_ours_no_longer_wanted_is_drift_in_our_cut() {
        let desired = json!({"spec": {"containers": [{"name": "memcached"}]}});
        let ours = json!({"spec": {"containers": [{"name": "memcached"}, {"name": "exporter"}]}});
        assert!(needs_apply_to_ours(&desired, &ours));
        assert!(
            !needs_apply(&desired, &ours),
            "in a whole object it may be someone else's"
        );
        assert!(!needs_apply_to_ours(&desired, &desired));
    }

    #[test]
    fn a_field_of_ours_no_longer_wanted_is_drift_in_our_cut() {
        let desired =
            json!({"spec": {"template": {"spec": {"containers": [{"name": "memcached"}]}}}});
        let ours = json!({"spec": {"template": {"spec": {"containers": [{"name": "memcached"}],
                                                           "nodeSelector": {"disk": "ssd"}}}}});
        assert!(needs_apply_to_ours(&desired, &ours));
        assert!(
            !needs_apply(&desired, &ours),
            "in a whole object it may be someone else's"
        );
        let emptied = json!({"spec": {"template": {"spec": {"containers": [{"name": "memcached"}],
                                                              "nodeSelector": {}}}}});
        assert!(!needs_apply_to_ours(&desired, &emptied));
    }

    #[test]
    fn changed_scalar_is_drift() {
        let desired = json!({"spec": {"replicas": 3}});
        assert!(needs_apply(&desired, &json!({"spec": {"replicas": 5}})));
        assert!(needs_apply(&desired, &json!({"spec": {}})));
    }

    #[test]
    fn scalar_arrays_are_atomic() {
        let desired = json!({"args": ["-m", "64"]});
        assert!(needs_apply(&desired, &json!({"args": ["-m", "64", "-vv"]})));
        assert!(needs_apply(&desired, &json!({"args": ["-m", "128"]})));
        assert!(!needs_apply(&desired, &json!({"args": ["-m", "64"]})));
    }

    #[test]
    fn missing_or_changed_object_item_is_drift() {
        let desired = json!({"containers": [{"name": "m", "image": "a"}]});
        assert!(needs_apply(&desired, &json!({"containers": []})));
        assert!(needs_apply(
            &desired,
            &json!({"containers": [{"name": "m", "image": "b"}]})
        ));
    }

    #[test]
    fn empty_desired_maps_match_absent_fields() {
        let desired = json!({"spec": {"resources": {}}});
        assert!(!needs_apply(&desired, &json!({"spec": {}})));
    }
}
