//! Tests through OLM's own tooling and registry protocols (`make test-digests`, `make test-olm`):
//! behind the `olm` feature, as they need tools built from Go modules and, for some, root.

mod digests;
mod install_and_upgrade;
