//! The bundles and catalog the test runs, as files: the previous release rebuilt from its
//! catalog entry, and what `opm render` makes of a directory or an image.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use base64::Engine;
use serde_json::Value;

use super::PACKAGE;

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    docs.into_iter().filter(|v| !v.is_null()).collect()
}

/// Every string of `value` that is a key of `map`, replaced by its value.
fn rename(value: &mut Value, map: &BTreeMap<String, String>) {
    match value {
        Value::String(s) => {
            if let Some(new) = map.get(s.as_str()) {
                *s = new.clone();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rename(v, map)),
        Value::Object(fields) => fields.values_mut().for_each(|v| rename(v, map)),
        _ => {}
    }
}

/// The bundle the catalog entry of `csv` (catalog/memcached-operator/CSV.yaml) was rendered
/// from, written to `out/bundle` with `out/bundle.Dockerfile`: every manifest of its
/// `olm.bundle.object` properties, each image of its relatedImages named as `local` names it by
/// the entry's name ("" is the operator), as a mirror would; metadata/annotations.yaml from the
/// channels that hold it (the first the default).
pub fn rebuild_from_catalog(catalog: &Path, csv: &str, local: &BTreeMap<&str, String>, out: &Path) {
    let entry_file = catalog.join(format!("{csv}.yaml"));
    let entry = yaml_docs(&entry_file).remove(0);
    let manifests = out.join("bundle/manifests");
    let metadata = out.join("bundle/metadata");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::create_dir_all(&metadata).unwrap();

    let map: BTreeMap<String, String> = entry["relatedImages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let name = r["name"].as_str().unwrap_or_default();
            let image = local.get(name).unwrap_or_else(|| {
                panic!("no local image for relatedImages entry {name} of {csv}")
            });
            (r["image"].as_str().unwrap().to_string(), image.clone())
        })
        .collect();
    let objects: Vec<&str> = entry["properties"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"] == "olm.bundle.object")
        .filter_map(|p| p["value"]["data"].as_str())
        .collect();
    assert!(
        !objects.is_empty(),
        "{} holds no olm.bundle.object",
        entry_file.display()
    );
    for (i, data) in objects.iter().enumerate() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap_or_else(|e| panic!("an olm.bundle.object of {csv}: {e}"));
        let mut object: Value = serde_json::from_slice(&bytes).unwrap();
        rename(&mut object, &map);
        std::fs::write(
            manifests.join(format!("{}.json", i + 1)),
            serde_json::to_string_pretty(&object).unwrap(),
        )
        .unwrap();
    }

    let channels: Vec<String> = yaml_docs(&catalog.join("channels.yaml"))
        .iter()
        .filter(|ch| {
            ch["entries"]
                .as_array()
                .is_some_and(|es| es.iter().any(|e| e["name"].as_str() == Some(csv)))
        })
        .filter_map(|ch| ch["name"].as_str().map(String::from))
        .collect();
    assert!(
        !channels.is_empty(),
        "{csv} is in no channel of the catalog"
    );
    let annotations = [
        (
            "operators.operatorframework.io.bundle.mediatype.v1",
            "registry+v1".to_string(),
        ),
        (
            "operators.operatorframework.io.bundle.manifests.v1",
            "manifests/".into(),
        ),
        (
            "operators.operatorframework.io.bundle.metadata.v1",
            "metadata/".into(),
        ),
        (
            "operators.operatorframework.io.bundle.package.v1",
            PACKAGE.into(),
        ),
        (
            "operators.operatorframework.io.bundle.channels.v1",
            channels.join(","),
        ),
        (
            "operators.operatorframework.io.bundle.channel.default.v1",
            channels[0].clone(),
        ),
    ];
    let mut yaml = String::from("annotations:\n");
    let mut dockerfile = String::from("FROM scratch\n");
    for (key, value) in &annotations {
        yaml += &format!("  {key}: {value}\n");
        dockerfile += &format!("LABEL {key}={value}\n");
    }
    dockerfile += "COPY bundle/manifests /manifests/\nCOPY bundle/metadata /metadata/\n";
    std::fs::write(metadata.join("annotations.yaml"), yaml).unwrap();
    std::fs::write(out.join("bundle.Dockerfile"), dockerfile).unwrap();
}

/// `opm render WHAT -o json` (a directory or an image), its objects in order; panics unless opm
/// succeeds.
pub fn opm_render(opm: &Path, what: &str, ssl_cert_file: &Path) -> Vec<Value> {
    let out = Command::new(opm)
        .args(["render", what, "-o", "json"])
        .env("SSL_CERT_FILE", ssl_cert_file)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", opm.display()));
    assert!(
        out.status.success(),
        "opm render {what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<Value>()
        .map(|v| v.unwrap_or_else(|e| panic!("opm render {what}: {e}")))
        .collect()
}

/// Where two renders first differ, for a failure message.
pub fn first_difference(a: &[Value], b: &[Value]) -> String {
    if a.len() != b.len() {
        return format!("{} objects against {}", a.len(), b.len());
    }
    a.iter()
        .zip(b)
        .find(|(x, y)| x != y)
        .map(|(x, y)| format!("{x:#}\nagainst\n{y:#}"))
        .unwrap_or_default()
}
