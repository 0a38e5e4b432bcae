//! Tests through OLM's own tooling and registry protocols (`make test-digests`, `make test-olm`,
//! `make test-run-bundle`): behind the `olm` feature, as they need tools built from Go modules
//! and, for some, root; `run_bundle` also behind `real-node`, as it needs the real node.

mod availability;
#[allow(dead_code)]
#[path = "../e2e/harness.rs"]
mod harness;
mod members;
mod olm;
mod previous_release;
mod scripts;

mod digests;
mod install_and_upgrade;
#[cfg(feature = "real-node")]
mod run_bundle;
