//! Checks on a Memcached's spec that the CRD schema cannot express.
//!
//! "resources.limits.memory must exceed maxMemoryMiB" spans two fields and reads a quantity; the
//! API server (1.35) costs `quantity()` over an int-or-string field as unbounded and refuses such
//! a CEL rule (kubernetes/kubernetes#132370), so it is checked here instead and reported as
//! Degraded=True, reason InvalidSpec, without touching the running pods.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::MemcachedSpec;

/// Why the spec cannot be applied, naming the fields.
pub fn validate(spec: &MemcachedSpec) -> Result<(), String> {
    // Admission refuses this too; checked again for objects stored before that rule existed,
    // since memcached would not start.
    if let Some(item) = spec.max_item_size_mib
        && item * 2 > spec.max_memory_mib
    {
        return Err(format!(
            "spec.maxItemSizeMiB ({item}) must be at most half of spec.maxMemoryMiB ({})",
            spec.max_memory_mib
        ));
    }
    pod_metadata(spec)?;
    network_policy_peers(spec)?;
    let Some(resources) = spec.resources.as_ref() else {
        return Ok(());
    };
    let empty = Default::default();
    let requests = resources.requests.as_ref().unwrap_or(&empty);
    let limits = resources.limits.as_ref().unwrap_or(&empty);
    // Admission refuses these too; checked again for objects stored before that rule existed.
    for (map, quantities) in [("requests", requests), ("limits", limits)] {
        for (name, q) in quantities {
            match quantity_bytes(q) {
                Some(v) if v >= 0.0 => {}
                Some(_) => {
                    return Err(format!(
                        "spec.resources.{map}.{name}: {:?} must not be negative",
                        q.0
                    ));
                }
                None => {
                    return Err(format!(
                        "spec.resources.{map}.{name}: {:?} is not a quantity",
                        q.0
                    ));
                }
            }
        }
    }
    // The API server refuses a pod template whose request exceeds its limit; say so in the
    // Memcached's own fields. A cross-field CEL rule over quantities is priced out (see above).
    for (name, request) in requests {
        if let Some(limit) = limits.get(name)
            && quantity_bytes(request) > quantity_bytes(limit)
        {
            return Err(format!(
                "spec.resources.requests.{name} ({}) must not exceed spec.resources.limits.{name} ({})",
                request.0, limit.0
            ));
        }
    }
    let Some(limit) = limits.get("memory") else {
        return Ok(());
    };
    let bytes = quantity_bytes(limit).unwrap_or_default();
    let cache = f64::from(spec.max_memory_mib) * 1024.0 * 1024.0;
    if bytes <= cache {
        return Err(format!(
            "spec.resources.limits.memory ({}) must be greater than spec.maxMemoryMiB ({}Mi), or memcached is OOM-killed once its cache fills",
            limit.0, spec.max_memory_mib
        ));
    }
    Ok(())
}

/// Label and annotation keys and label values, as the API server checks them in a pod template.
/// The CRD schema cannot check map keys, and a refused member would only say so after the
/// fact; here the Memcached's own field is named.
fn pod_metadata(spec: &MemcachedSpec) -> Result<(), String> {
    let maps = [
        ("nodeSelector", spec.node_selector.as_ref(), true),
        ("podLabels", spec.pod_labels.as_ref(), true),
        ("podAnnotations", spec.pod_annotations.as_ref(), false),
    ];
    for (field, map, values_are_labels) in maps {
        for (key, value) in map.into_iter().flatten() {
            qualified_name(key).map_err(|e| format!("spec.{field}: key {key:?} {e}"))?;
            if values_are_labels {
                label_value(value).map_err(|e| format!("spec.{field}[{key}]: {value:?} {e}"))?;
            } else if value
                .chars()
                .any(|c| c.is_control() || matches!(c, '\u{FFFE}' | '\u{FFFF}'))
            {
                // Server-side apply bodies are parsed as YAML, which refuses what it does not
                // count as printable.
                return Err(format!(
                    "spec.{field}[{key}]: {value:?} contains a control character"
                ));
            }
        }
    }
    Ok(())
}

/// The NetworkPolicy's peers, as the API server checks them: selectors' label keys and values,
/// and address blocks in canonical form.
fn network_policy_peers(spec: &MemcachedSpec) -> Result<(), String> {
    let Some(policy) = spec.network_policy.as_ref().filter(|p| p.enabled) else {
        return Ok(());
    };
    for (field, peers) in [
        ("from", &policy.from),
        ("metricsFrom", &policy.metrics_from),
    ] {
        for (i, peer) in peers.iter().enumerate() {
            let at = format!("spec.networkPolicy.{field}[{i}]");
            let selectors = [
                ("podSelector", peer.pod_selector.as_ref()),
                ("namespaceSelector", peer.namespace_selector.as_ref()),
            ];
            for (name, selector) in selectors {
                let Some(selector) = selector else { continue };
                for (key, value) in selector.match_labels.iter().flatten() {
                    qualified_name(key)
                        .map_err(|e| format!("{at}.{name}.matchLabels: key {key:?} {e}"))?;
                    label_value(value)
                        .map_err(|e| format!("{at}.{name}.matchLabels[{key}]: {value:?} {e}"))?;
                }
                for (j, expression) in selector.match_expressions.iter().flatten().enumerate() {
                    let here = format!("{at}.{name}.matchExpressions[{j}]");
                    qualified_name(&expression.key)
                        .map_err(|e| format!("{here}.key: {:?} {e}", expression.key))?;
                    let values = expression.values.as_deref().unwrap_or_default();
                    match (expression.operator.as_str(), values.is_empty()) {
                        ("In" | "NotIn", false) | ("Exists" | "DoesNotExist", true) => {}
                        ("In" | "NotIn", true) => {
                            return Err(format!("{here}.values: In and NotIn need values"));
                        }
                        ("Exists" | "DoesNotExist", false) => {
                            return Err(format!(
                                "{here}.values: Exists and DoesNotExist take none"
                            ));
                        }
                        (other, _) => {
                            return Err(format!(
                                "{here}.operator: {other:?} is not In, NotIn, Exists or DoesNotExist"
                            ));
                        }
                    }
                    for value in values {
                        label_value(value).map_err(|e| format!("{here}.values: {value:?} {e}"))?;
                    }
                }
            }
            if let Some(block) = &peer.ip_block {
                canonical_cidr(&block.cidr)
                    .map_err(|e| format!("{at}.ipBlock.cidr: {:?} {e}", block.cidr))?;
                for except in block.except.iter().flatten() {
                    canonical_cidr(except)
                        .map_err(|e| format!("{at}.ipBlock.except: {except:?} {e}"))?;
                }
            }
        }
    }
    Ok(())
}

/// `address/prefix` with no bits set past the prefix, as the API server wants a block.
fn canonical_cidr(cidr: &str) -> Result<(), String> {
    let not_a_block = || "is not an address block such as 10.0.0.0/8".to_string();
    let (address, prefix) = cidr.split_once('/').ok_or_else(not_a_block)?;
    let address: std::net::IpAddr = address.parse().map_err(|_| not_a_block())?;
    let prefix: u32 = prefix.parse().map_err(|_| not_a_block())?;
    let (bits, width) = match address {
        std::net::IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        std::net::IpAddr::V6(a) => (u128::from(a), 128),
    };
    if prefix > width {
        return Err(not_a_block());
    }
    let host_bits = width - prefix;
    let host_mask = if host_bits == 0 {
        0
    } else {
        u128::MAX >> (128 - host_bits)
    };
    if bits & host_mask != 0 {
        return Err(format!("has bits set past its /{prefix} prefix"));
    }
    Ok(())
}

/// `[prefix/]name`: prefix a DNS subdomain, name up to 63 alphanumerics, '-', '_' or '.',
/// beginning and ending alphanumeric.
fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err("has a prefix that is not a lowercase DNS subdomain".into());
        }
    }
    if name.is_empty() {
        return Err("has an empty name part".into());
    }
    label_value(name).map_err(|e| format!("has a name part that {}", e.trim_start_matches("is ")))
}

/// Up to 63 alphanumerics, '-', '_' or '.', beginning and ending alphanumeric; or empty.
fn label_value(value: &str) -> Result<(), String> {
    let edges_ok = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    let ok = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && edges_ok(value.chars().next())
        && edges_ok(value.chars().last());
    if ok {
        Ok(())
    } else {
        Err(
            "is not a label value: at most 63 of [A-Za-z0-9-_.], beginning and ending alphanumeric"
                .into(),
        )
    }
}

/// A Kubernetes quantity in base units (bytes for memory): "128Mi", "1G", "1.5Gi", "1e9", "500m".
pub fn quantity_bytes(q: &Quantity) -> Option<f64> {
    let s = q.0.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let number: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * multiplier)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;

    fn q(s: &str) -> Option<f64> {
        quantity_bytes(&Quantity(s.into()))
    }

    #[test]
    fn parses_the_quantity_forms() {
        assert_eq!(q("128Mi"), Some(134_217_728.0));
        assert_eq!(q("1Gi"), Some(1_073_741_824.0));
        assert_eq!(q("1.5Gi"), Some(1_610_612_736.0));
        assert_eq!(q("1G"), Some(1e9));
        assert_eq!(q("1e9"), Some(1e9));
        assert_eq!(q("134217728"), Some(134_217_728.0));
        assert_eq!(q("500m"), Some(0.5));
        assert_eq!(q("12Qi"), None);
        assert_eq!(q("lots"), None);
    }

    fn with_limit(max_mib: i32, limit: &str) -> MemcachedSpec {
        let mut mc = memcached("x", 1);
        mc.spec.max_memory_mib = max_mib;
        mc.spec.resources = Some(Box::new(k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some([("memory".to_string(), Quantity(limit.into()))].into()),
            ..Default::default()
        }));
        mc.spec
    }

    #[test]
    fn memory_limit_must_exceed_the_cache_size() {
        assert_eq!(
            validate(&memcached("x", 1).spec),
            Ok(()),
            "no limit, nothing to check"
        );
        assert_eq!(validate(&with_limit(64, "96Mi")), Ok(()));
        assert_eq!(validate(&with_limit(64, "1Gi")), Ok(()));
        let err = validate(&with_limit(128, "64Mi")).unwrap_err();
        assert!(
            err.starts_with(
                "spec.resources.limits.memory (64Mi) must be greater than spec.maxMemoryMiB (128Mi)"
            ),
            "{err}"
        );
        assert!(
            validate(&with_limit(64, "64Mi")).is_err(),
            "equal leaves no room for connections"
        );
        assert!(
            validate(&with_limit(64, "bogus"))
                .unwrap_err()
                .contains("not a quantity")
        );
    }

    fn with(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> MemcachedSpec {
        let map = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            )
        };
        let mut mc = memcached("x", 1);
        mc.spec.resources = Some(Box::new(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: map(requests),
            limits: map(limits),
            ..Default::default()
        }));
        mc.spec
    }

    #[test]
    fn negative_quantities_are_refused_naming_the_field() {
        assert_eq!(
            validate(&with(&[("cpu", "-1")], &[])),
            Err(r#"spec.resources.requests.cpu: "-1" must not be negative"#.into())
        );
        assert!(
            validate(&with(&[], &[("ephemeral-storage", "-5Mi")]))
                .unwrap_err()
                .starts_with("spec.resources.limits.ephemeral-storage")
        );
    }

    #[test]
    fn a_request_may_not_exceed_its_limit() {
        assert_eq!(validate(&with(&[("cpu", "500m")], &[("cpu", "1")])), Ok(()));
        assert_eq!(
            validate(&with(&[("cpu", "1")], &[("cpu", "1000m")])),
            Ok(())
        );
        assert_eq!(
            validate(&with(&[("cpu", "2")], &[("cpu", "1")])),
            Err(
                "spec.resources.requests.cpu (2) must not exceed spec.resources.limits.cpu (1)"
                    .into()
            )
        );
        assert_eq!(
            validate(&with(&[("memory", "1Gi")], &[])),
            Ok(()),
            "a request without a limit is not bounded"
        );
    }

    #[test]
    fn an_item_size_above_half_the_memory_is_named() {
        let mut spec = with(&[], &[]);
        spec.max_item_size_mib = Some(33);
        let err = validate(&spec).unwrap_err();
        assert!(err.starts_with("spec.maxItemSizeMiB (33)"), "{err}");
        spec.max_item_size_mib = Some(32);
        assert_eq!(validate(&spec), Ok(()));
    }

    #[test]
    fn pod_label_and_annotation_keys_are_checked_naming_the_field() {
        let mut spec = with(&[], &[]);
        spec.node_selector = Some([("example*com/disk".to_string(), "ssd".to_string())].into());
        let err = validate(&spec).unwrap_err();
        assert!(
            err.starts_with("spec.nodeSelector: key \"example*com/disk\""),
            "{err}"
        );
        spec.node_selector = Some([("disk".to_string(), "fast ssd".to_string())].into());
        assert!(
            validate(&spec)
                .unwrap_err()
                .starts_with("spec.nodeSelector[disk]")
        );
        spec.node_selector = Some([("example.com/disk".to_string(), "ssd".to_string())].into());
        assert_eq!(validate(&spec), Ok(()));

        spec.pod_labels = Some([("team".to_string(), "-web".to_string())].into());
        assert!(
            validate(&spec)
                .unwrap_err()
                .starts_with("spec.podLabels[team]")
        );
        spec.pod_labels = Some([("team".to_string(), String::new())].into());
        assert_eq!(validate(&spec), Ok(()), "an empty label value is valid");

        spec.pod_annotations =
            Some([("bad key".to_string(), "any value at all".to_string())].into());
        assert!(
            validate(&spec)
                .unwrap_err()
                .starts_with("spec.podAnnotations: key")
        );
        spec.pod_annotations =
            Some([("a.b/c_d".to_string(), "any value at all".to_string())].into());
        assert_eq!(validate(&spec), Ok(()));
        spec.pod_annotations = Some([("a".to_string(), "bell\u{7}".to_string())].into());
        assert!(validate(&spec).unwrap_err().contains("control character"));
    }

    #[test]
    fn network_policy_peers_are_checked_naming_the_field() {
        let with_peers = |peers: serde_json::Value| {
            let spec =
                serde_json::json!({"size": 1, "networkPolicy": {"enabled": true, "from": peers}});
            validate(&serde_json::from_value(spec).unwrap())
        };
        let selector = |labels: serde_json::Value| serde_json::json!([{"namespaceSelector": {"matchLabels": labels}}]);
        assert_eq!(
            with_peers(selector(serde_json::json!({"team": "shop"}))),
            Ok(())
        );
        let bad_key = with_peers(selector(serde_json::json!({"/W9*": "x"}))).unwrap_err();
        assert!(
            bad_key.starts_with(
                "spec.networkPolicy.from[0].namespaceSelector.matchLabels: key \"/W9*\""
            ),
            "{bad_key}"
        );
        let bad_value = with_peers(selector(serde_json::json!({"team": "a b"}))).unwrap_err();
        assert!(bad_value.contains("matchLabels[team]"), "{bad_value}");
        let expression = |op: &str, values: serde_json::Value| serde_json::json!([{"podSelector": {"matchExpressions": [{"key": "app", "operator": op, "values": values}]}}]);
        assert_eq!(
            with_peers(expression("In", serde_json::json!(["web"]))),
            Ok(())
        );
        assert!(
            with_peers(expression("In", serde_json::json!([])))
                .unwrap_err()
                .contains("need values")
        );
        assert!(
            with_peers(expression("Exists", serde_json::json!(["x"])))
                .unwrap_err()
                .contains("take none")
        );
        let block = |cidr: &str| serde_json::json!([{"ipBlock": {"cidr": cidr}}]);
        assert_eq!(with_peers(block("10.0.0.0/8")), Ok(()));
        assert_eq!(with_peers(block("fd00::/8")), Ok(()));
        assert!(
            with_peers(block("10.0.0.1/8"))
                .unwrap_err()
                .contains("past its /8 prefix")
        );
        assert!(
            with_peers(block("10.0.0.0"))
                .unwrap_err()
                .contains("ipBlock.cidr")
        );
        // Turned off, the peers are not applied and so not checked.
        let off = serde_json::json!({"size": 1, "networkPolicy": {"enabled": false, "from": selector(serde_json::json!({"/": "x"}))}});
        assert_eq!(validate(&serde_json::from_value(off).unwrap()), Ok(()));
    }
}
