//! What the end-to-end suite (`tests/e2e`) and the benchmark (`bench/`) share: a local cluster
//! started by `hack/cluster.sh`, the operator as a child process, free ports and plain HTTP, and
//! for the real node: DNS lookups, a memcached client and a prober of each member's answers.

pub mod cert_manager;
pub mod cluster;
pub mod dns;
pub mod kwok;
pub mod memcached;
pub mod net;
pub mod operator;
pub mod probe;
pub mod process;
pub mod promql;

pub use cluster::LocalCluster;
pub use operator::{Launch, OperatorProcess};

/// The repository's root (this crate lives in `testkit/`): the checkout under test, as cargo
/// names it to the running test. Two checkouts sharing a cargo target (CI's cache) share this
/// crate's build, so the path compiled in may be the other checkout's.
pub fn repo_root() -> std::path::PathBuf {
    let running = std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from);
    let compiled = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    running
        .iter()
        .flat_map(|dir| dir.ancestors())
        .find(|dir| dir.join("testkit/Cargo.toml").is_file())
        .unwrap_or_else(|| compiled.parent().expect("testkit/ has a parent"))
        .to_path_buf()
}

/// `KEY=VALUE` lines, values unquoted as the shell would (`printf %q` output, versions.env).
pub fn env_lines(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let words = shlex::split(v).unwrap_or_else(|| panic!("{k}: cannot unquote {v:?}"));
            (k.trim().to_string(), words.join(" "))
        })
        .collect()
}
