//! Tests through OLM's own tooling and registry protocols (`make test-digests`, `make test-olm`):
//! behind the `olm` feature, as they need tools built from Go modules and, for some, root.

#[allow(dead_code)]
#[path = "../e2e/harness.rs"]
mod harness;
mod olm;
mod scripts;

mod digests;
mod install_and_upgrade;
