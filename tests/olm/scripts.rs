//! What the OLM tests run of hack/: its scripts (which build the tools and images and generate
//! bundles), the pins of hack/olm/versions.env, and a throwaway image registry on 127.0.0.1
//! (hack/olm/registry.sh).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use memcached_operator_testkit::env_lines;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `hack/SCRIPT`, run in the repository.
pub fn hack(script: &str) -> Command {
    let mut command = Command::new(repo().join("hack").join(script));
    command.current_dir(repo());
    command
}

/// Runs `command`, its stderr passed through; its stdout, trimmed. Panics unless it succeeds.
pub fn stdout_of(command: &mut Command) -> String {
    let what = format!("{command:?}");
    let out = command
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what}: {}", out.status);
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Runs `command` with its output passed through (on stderr). Panics unless it succeeds.
pub fn run(command: &mut Command) {
    let what = format!("{command:?}");
    let status = command
        .stdout(std::io::stderr())
        .status()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what}: {status}");
}

/// The pins and release facts of hack/olm/versions.env.
pub fn olm_versions() -> BTreeMap<String, String> {
    env_lines(&std::fs::read_to_string(repo().join("hack/olm/versions.env")).unwrap())
}

pub fn path_env(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A tool's path: `$VAR`, else what `hack/olm/build-tools.sh --path TOOL` prints (building it).
pub fn tool(var: &str, name: &str) -> PathBuf {
    if let Some(p) = path_env(var) {
        return p;
    }
    PathBuf::from(stdout_of(hack("olm/build-tools.sh").args(["--path", name])))
}

/// A registry on 127.0.0.1 (`hack/olm/registry.sh start DIR`), stopped when dropped, the test
/// failed or not.
pub struct Registry {
    dir: PathBuf,
    /// host:port
    pub host: String,
    /// With TLS: its self-signed certificate, which clients must trust (SSL_CERT_FILE for Go
    /// programs). Read by run_bundle, which only the real-node feature builds.
    #[cfg_attr(not(feature = "real-node"), allow(dead_code))]
    pub ca: Option<PathBuf>,
}

impl Registry {
    /// Plain HTTP, or HTTPS with `tls`; its storage and pid in `dir`.
    pub fn start(dir: &Path, tls: bool) -> Registry {
        let mut command = hack("olm/registry.sh");
        command.arg("start").arg(dir);
        if tls {
            command.arg("--tls");
        }
        let host = stdout_of(&mut command);
        Registry {
            dir: dir.to_path_buf(),
            host,
            ca: tls.then(|| dir.join("ca.crt")),
        }
    }

    /// Pushes the OCI archive `archive` as `reference` (host:port/name:tag).
    pub fn push(&self, archive: impl AsRef<Path>, reference: &str) {
        run(hack("olm/registry.sh")
            .arg("push")
            .arg(archive.as_ref())
            .arg(reference));
    }

    /// `reference` (host:port/name:tag) as `host:port/name@<the digest the registry serves>`.
    pub fn pinned(&self, reference: &str) -> String {
        let digest = stdout_of(hack("olm/registry.sh").arg("digest").arg(reference));
        let (name, _tag) = reference.rsplit_once(':').unwrap();
        format!("{name}@{digest}")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let stopped = hack("olm/registry.sh").arg("stop").arg(&self.dir).status();
        if !stopped.as_ref().is_ok_and(|s| s.success()) {
            eprintln!("registry.sh stop {}: {stopped:?}", self.dir.display());
        }
    }
}

/// The CSV the upgrade tests start from, `<package>.v<PREVIOUS_RELEASE>`: one the bundle's `csv`
/// replaces, or one its `olm.skipRange` lets OLM upgrade from directly.
pub fn upgraded_from(package: &str, csv: &serde_json::Value) -> String {
    let from = olm_versions()["PREVIOUS_RELEASE"].clone();
    let name = format!("{package}.v{from}");
    let replaces = csv["spec"]["replaces"].as_str().unwrap_or_default();
    let range = csv["metadata"]["annotations"]["olm.skipRange"]
        .as_str()
        .unwrap_or_default();
    assert!(
        replaces == name || in_range(&from, range),
        "bundle/'s CSV neither replaces {name} nor skips it (olm.skipRange '{range}'): \
         PREVIOUS_RELEASE in hack/olm/versions.env is not a release it upgrades from"
    );
    name
}

/// A release's version `X.Y.Z` as numbers, in the order releases follow one another.
pub fn version(v: &str) -> Vec<u64> {
    v.split('.').filter_map(|n| n.parse().ok()).collect()
}

/// Whether `version` is within a skipRange of the form `>=A <B`.
fn in_range(of: &str, range: &str) -> bool {
    let v = version(of);
    range.split_whitespace().all(|bound| {
        if let Some(min) = bound.strip_prefix(">=") {
            v >= version(min)
        } else if let Some(max) = bound.strip_prefix('<') {
            v < version(max)
        } else {
            false
        }
    }) && !range.is_empty()
}
