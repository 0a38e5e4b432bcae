//! The bundle as OLM, registries and the scorecard read it, without a cluster (`make olm-check`):
//! bundle.Dockerfile's labels are the annotations OLM reads, and the scorecard's built-in tests
//! pass on bundle/ (was hack/olm/check-bundle-dockerfile.sh and scorecard-static.sh).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A Dockerfile's instructions: continuation lines joined, comments dropped.
fn instructions(dockerfile: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        if current.is_empty() && line.trim_start().starts_with('#') {
            continue;
        }
        if let Some(continued) = line.strip_suffix('\\') {
            current.push_str(continued);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let instruction = std::mem::take(&mut current);
        let instruction = instruction.trim();
        if !instruction.is_empty() {
            let (word, rest) = instruction.split_once(' ').unwrap_or((instruction, ""));
            out.push((word.to_uppercase(), rest.trim().to_string()));
        }
    }
    out
}

/// What is wrong between a bundle Dockerfile and the annotations OLM reads; empty when they agree.
fn disagreements(dockerfile: &str, annotations: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let (mut labels, mut copies, mut froms) = (BTreeMap::new(), Vec::new(), Vec::new());
    for (word, rest) in instructions(dockerfile) {
        match word.as_str() {
            "LABEL" => {
                for token in shlex::split(&rest).unwrap_or_default() {
                    let Some((key, value)) = token.split_once('=') else {
                        problems.push(format!("LABEL without '=': {token:?}"));
                        continue;
                    };
                    if let Some(old) = labels.insert(key.to_string(), value.to_string())
                        && old != value
                    {
                        problems.push(format!("LABEL {key} set twice ({old:?}, {value:?})"));
                    }
                }
            }
            "COPY" => copies.push(shlex::split(&rest).unwrap_or_default()),
            "FROM" => froms.push(rest),
            _ => {}
        }
    }
    if froms != ["scratch"] {
        problems.push(format!("expected a single 'FROM scratch', found {froms:?}"));
    }
    for (key, value) in annotations {
        match labels.get(key) {
            None => problems.push(format!("annotation {key}={value:?} has no LABEL")),
            Some(label) if label != value => problems.push(format!(
                "{key}: annotations.yaml has {value:?}, the Dockerfile {label:?}"
            )),
            Some(_) => {}
        }
    }
    for (key, label) in &labels {
        if !annotations.contains_key(key) {
            problems.push(format!("LABEL {key}={label:?} is not in annotations.yaml"));
        }
    }
    let slashed = |p: &str| format!("/{}/", p.trim_matches('/'));
    for (key, default) in [
        (
            "operators.operatorframework.io.bundle.manifests.v1",
            "manifests/",
        ),
        (
            "operators.operatorframework.io.bundle.metadata.v1",
            "metadata/",
        ),
    ] {
        let dest = slashed(annotations.get(key).map_or(default, String::as_str));
        let copied = copies
            .iter()
            .any(|c| c.last().is_some_and(|d| slashed(d) == dest));
        if !copied {
            problems.push(format!("no COPY to {dest} ({key})"));
        }
    }
    problems
}

fn annotations(path: &Path) -> BTreeMap<String, String> {
    #[derive(serde::Deserialize)]
    struct File {
        annotations: BTreeMap<String, String>,
    }
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_str::<File>(&text).unwrap().annotations
}

#[test]
fn the_bundle_dockerfile_labels_are_the_annotations_olm_reads() {
    let dockerfile = std::fs::read_to_string(repo().join("bundle.Dockerfile")).unwrap();
    let annotations = annotations(&repo().join("bundle/metadata/annotations.yaml"));
    assert!(annotations.len() >= 5, "{annotations:?}");
    let problems = disagreements(&dockerfile, &annotations);
    assert!(
        problems.is_empty(),
        "bundle.Dockerfile and annotations.yaml disagree:\n  - {}",
        problems.join("\n  - ")
    );
}

#[test]
fn a_label_that_differs_from_its_annotation_or_a_missing_copy_is_found() {
    let dockerfile = std::fs::read_to_string(repo().join("bundle.Dockerfile")).unwrap();
    let annotations = annotations(&repo().join("bundle/metadata/annotations.yaml"));
    let changed = dockerfile.replace(
        "channel.default.v1=stable",
        "channel.default.v1=alpha \\\n    extra.label=1",
    );
    let problems = disagreements(&changed, &annotations);
    assert!(
        problems.iter().any(|p| p.contains("channel.default.v1"))
            && problems.iter().any(|p| p.contains("extra.label")),
        "{problems:?}"
    );
    let no_metadata = dockerfile.replace("COPY bundle/metadata /metadata/", "");
    assert_eq!(
        disagreements(&no_metadata, &annotations),
        ["no COPY to /metadata/ (operators.operatorframework.io.bundle.metadata.v1)"]
    );
}

/// `operator-sdk scorecard` runs each test of bundle/tests/scorecard/config.yaml as a pod of the
/// scorecard-test image, with the bundle at /bundle. The built-in tests only read the bundle, so
/// the same program (built from the same operator-sdk version, SCORECARD_TEST) runs here in a
/// chroot whose /bundle is a copy of bundle/: the path is a compile-time constant of the program.
#[test]
#[cfg_attr(
    not(feature = "olm"),
    ignore = "needs SCORECARD_TEST: make scorecard-static"
)]
fn the_scorecards_built_in_tests_pass_on_the_bundle() {
    let program = std::env::var("SCORECARD_TEST")
        .expect("SCORECARD_TEST: the scorecard-test program (make scorecard-test prints it)");
    #[derive(serde::Deserialize)]
    struct Config {
        stages: Vec<Stage>,
    }
    #[derive(serde::Deserialize)]
    struct Stage {
        tests: Vec<Test>,
    }
    #[derive(serde::Deserialize)]
    struct Test {
        entrypoint: Vec<String>,
    }
    let bundle = repo().join("bundle");
    let config: Config = serde_saphyr::from_str(
        &std::fs::read_to_string(bundle.join("tests/scorecard/config.yaml")).unwrap(),
    )
    .unwrap();
    let tests: Vec<String> = config
        .stages
        .iter()
        .flat_map(|s| &s.tests)
        .filter(|t| t.entrypoint.first().map(String::as_str) == Some("scorecard-test"))
        .filter_map(|t| t.entrypoint.get(1).cloned())
        .collect();
    assert!(!tests.is_empty(), "no scorecard-test tests in the config");

    let root = std::env::temp_dir().join(format!("scorecard-root-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    let copied = Command::new("cp")
        .arg("-r")
        .arg(&bundle)
        .arg(root.join("bundle"))
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::copy(&program, root.join("scorecard-test")).unwrap();
    let as_root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        .unwrap_or(false);

    let mut failed = Vec::new();
    for test in &tests {
        let mut command = match as_root {
            true => Command::new("chroot"),
            false => {
                let mut c = Command::new("unshare");
                c.args(["--map-root-user", "chroot"]);
                c
            }
        };
        let out = command
            .arg(&root)
            .args(["/scorecard-test", test])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let result: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|_| {
            panic!(
                "{test}: not a scorecard result: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let result = &result["results"][0];
        println!("{test:<26} {}", result["state"]);
        if result["state"] != "pass" {
            failed.push(format!("{test}: {result}"));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    assert!(failed.is_empty(), "failed:\n{}", failed.join("\n"));
}
