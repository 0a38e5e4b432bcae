//! A release bundle pinned by digest (`make test-digests`, root; was hack/olm/test-digests.sh), made
//! as hack/olm/README.md ("Releasing") tells: the operator, memcached and exporter images pushed to
//! a registry on 127.0.0.1, then hack/olm/bundle.sh with IMG and RELATED_IMAGES naming them there
//! and USE_IMAGE_DIGESTS=true. Every image the CSV names (containerImage, the manager's image, the
//! RELATED_IMAGE_* values and relatedImages) must be the registry's reference by the digest the
//! registry serves, no tag may be left, and the bundle must validate. The shell scripts only build
//! and push the images and generate the bundle; the checks are here.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::scripts::{Registry, env_lines, hack, olm_versions, repo, run, stdout_of};

/// The test's directory, removed when this is dropped, the test failed or not.
struct Workspace {
    dir: PathBuf,
}

impl Workspace {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "olm-digests-{}-{:06x}",
            std::process::id(),
            rand::random::<u32>() & 0xff_ffff
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Workspace { dir }
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A reference by digest: `...@sha256:` and 64 lowercase hex digits at the end.
fn by_digest(reference: &str) -> bool {
    reference.rsplit_once("@sha256:").is_some_and(|(_, hex)| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// Every image reference in a manifest, wherever it is: the values of `image` and `containerImage`
/// keys and of `RELATED_IMAGE_*` env entries, with where they were found.
fn image_references(value: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            let related = map
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| n.starts_with("RELATED_IMAGE_"));
            for (key, child) in map {
                let key = key.as_str();
                let here = format!("{at}.{key}");
                match child.as_str() {
                    Some(s) if key == "image" || key == "containerImage" => {
                        out.push((here, s.to_string()));
                    }
                    Some(s) if key == "value" && related.is_some() => {
                        out.push((format!("{at}[{}]", related.unwrap()), s.to_string()));
                    }
                    _ => image_references(child, &here, out),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                image_references(item, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The references of `image_references` that are not by digest.
fn tagged_references(csv: &Value) -> Vec<String> {
    let mut refs = Vec::new();
    image_references(csv, "", &mut refs);
    refs.into_iter()
        .filter(|(_, r)| !by_digest(r))
        .map(|(at, r)| format!("{at}: {r}"))
        .collect()
}

/// The manager container of the CSV's first deployment.
fn manager(csv: &Value) -> Option<&Value> {
    csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"].as_str() == Some("manager"))
}

fn env_value<'a>(container: Option<&'a Value>, name: &str) -> Option<&'a str> {
    container?["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))?["value"]
        .as_str()
}

/// Each check: what, got, want; a line per check, and the failed ones.
#[derive(Default)]
struct Checks {
    failed: Vec<String>,
}

impl Checks {
    fn expect(&mut self, what: &str, got: Option<&str>, want: &str) {
        if got == Some(want) {
            println!("PASS  {what}: {want}");
        } else {
            let line = format!("{what}: got {got:?}, want {want:?}");
            println!("FAIL  {line}");
            self.failed.push(line);
        }
    }

    fn that(&mut self, what: &str, ok: bool, detail: impl FnOnce() -> String) {
        if ok {
            println!("PASS  {what}");
        } else {
            let line = format!("{what}: {}", detail());
            println!("FAIL  {line}");
            self.failed.push(line);
        }
    }
}

fn operator_sdk() -> PathBuf {
    let path = stdout_of(Command::new("make").current_dir(repo()).args([
        "--no-print-directory",
        "-s",
        "operator-sdk",
    ]));
    PathBuf::from(
        path.lines()
            .last()
            .expect("make operator-sdk printed no path"),
    )
}

fn read_csv(bundle: &Path) -> Value {
    let path = bundle.join("manifests/memcached-operator.clusterserviceversion.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

#[test]
fn a_release_bundle_names_every_image_by_the_digest_the_registry_serves() {
    let versions = olm_versions();
    let version = &versions["BUNDLE_VERSION"];
    run(hack("images.sh").arg("build"));
    run(hack("images.sh").arg("operator"));
    let images = env_lines(&stdout_of(hack("images.sh").arg("--print-env")));
    let image = |key: &str| -> &str {
        images
            .get(key)
            .unwrap_or_else(|| panic!("hack/images.sh --print-env has no {key}: {images:?}"))
    };
    let tag_of = |key: &str| image(key).rsplit_once(':').unwrap().1.to_string();
    let sdk = operator_sdk();

    let work = Workspace::new();
    // Declared after the workspace, so dropped (stopped) before its directory is removed.
    let registry = Registry::start(&work.dir.join("registry"), false);
    let host = &registry.host;
    let operator_ref = format!("{host}/memcached/memcached-operator:{version}");
    let memcached_ref = format!("{host}/memcached/memcached:{}", tag_of("MEMCACHED_IMAGE"));
    let exporter_ref = format!(
        "{host}/memcached/memcached-exporter:{}",
        tag_of("EXPORTER_IMAGE")
    );
    for (archive, reference) in [
        ("OPERATOR_ARCHIVE", &operator_ref),
        ("MEMCACHED_ARCHIVE", &memcached_ref),
        ("EXPORTER_ARCHIVE", &exporter_ref),
    ] {
        registry.push(image(archive), reference);
    }
    let operator_pinned = registry.pinned(&operator_ref);
    let memcached_pinned = registry.pinned(&memcached_ref);
    let exporter_pinned = registry.pinned(&exporter_ref);

    let out = work.dir.join("out");
    run(hack("olm/bundle.sh")
        .arg(&out)
        .env("IMG", &operator_ref)
        .env(
            "RELATED_IMAGES",
            format!("MEMCACHED={memcached_ref} MEMCACHED_EXPORTER={exporter_ref}"),
        )
        .env("USE_IMAGE_DIGESTS", "true")
        .env("OPERATOR_SDK", &sdk));
    let bundle = out.join("bundle");
    let csv = read_csv(&bundle);

    let mut checks = Checks::default();
    checks.expect(
        "CSV containerImage",
        csv["metadata"]["annotations"]["containerImage"].as_str(),
        &operator_pinned,
    );
    let manager = manager(&csv);
    checks.expect(
        "manager image",
        manager.and_then(|m| m["image"].as_str()),
        &operator_pinned,
    );
    checks.expect(
        "RELATED_IMAGE_MEMCACHED",
        env_value(manager, "RELATED_IMAGE_MEMCACHED"),
        &memcached_pinned,
    );
    checks.expect(
        "RELATED_IMAGE_MEMCACHED_EXPORTER",
        env_value(manager, "RELATED_IMAGE_MEMCACHED_EXPORTER"),
        &exporter_pinned,
    );
    checks.expect(
        "RELATED_IMAGE_AGENT (the operator's own image)",
        env_value(manager, "RELATED_IMAGE_AGENT"),
        &operator_pinned,
    );
    let related: Vec<&str> = csv["spec"]["relatedImages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["image"].as_str())
        .collect();
    for want in [&operator_pinned, &memcached_pinned, &exporter_pinned] {
        checks.that(
            &format!("relatedImages lists {want}"),
            related.contains(&want.as_str()),
            || format!("relatedImages is {related:?}"),
        );
    }
    let tagged = tagged_references(&csv);
    checks.that("no image reference by tag", tagged.is_empty(), || {
        format!("by tag: {tagged:?}")
    });
    let validate = Command::new(&sdk)
        .arg("bundle")
        .arg("validate")
        .arg(&bundle)
        .args(["--select-optional", "suite=operatorframework"])
        .output()
        .unwrap_or_else(|e| panic!("{sdk:?}: {e}"));
    checks.that(
        "operator-sdk bundle validate (suite=operatorframework)",
        validate.status.success(),
        || {
            let log = String::from_utf8_lossy(&validate.stdout).into_owned()
                + &String::from_utf8_lossy(&validate.stderr);
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("{}:\n{}", validate.status, tail.join("\n"))
        },
    );
    assert!(
        checks.failed.is_empty(),
        "the bundle pinned by digest from {host}:\n  - {}",
        checks.failed.join("\n  - ")
    );
}

#[test]
fn an_image_named_by_tag_anywhere_in_a_csv_is_found() {
    let digest = format!("@sha256:{}", "0123456789abcdef".repeat(4));
    let csv: Value = serde_saphyr::from_str(&format!(
        r#"
metadata:
  annotations:
    containerImage: r/operator{digest}
spec:
  install:
    spec:
      deployments:
      - spec:
          template:
            spec:
              containers:
              - name: manager
                image: r/operator{digest}
                env:
                - name: RELATED_IMAGE_MEMCACHED
                  value: r/memcached:1.6
                - name: OTHER
                  value: not-an-image:1
              initContainers:
              - name: init
                image: r/init:latest
  relatedImages:
  - name: memcached
    image: r/memcached{digest}
  - name: short
    image: r/exporter@sha256:0123
"#
    ))
    .unwrap();
    assert_eq!(
        tagged_references(&csv),
        [
            ".spec.install.spec.deployments[0].spec.template.spec.containers[0].env[0][RELATED_IMAGE_MEMCACHED]: r/memcached:1.6",
            ".spec.install.spec.deployments[0].spec.template.spec.initContainers[0].image: r/init:latest",
            ".spec.relatedImages[1].image: r/exporter@sha256:0123",
        ]
    );
}
