//! The previous release's operator (PREVIOUS_RELEASE, PREVIOUS_RELEASE_COMMIT in
//! hack/olm/versions.env), built by its own tree's hack/images.sh: the upgrade tests run what
//! that release shipped, as one binary cannot play both. `hack/olm/build-tools.sh
//! --previous-release` extracts the tree once into
//! `$MEMCACHED_OPERATOR_CACHE/previous-release/<commit>/` and runs its images.sh on caches of
//! its own (`make tools` builds it ahead of the tests).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use memcached_operator_testkit::env_lines;

use crate::scripts::{hack, run, stdout_of};

/// The release's own hack/images.sh ARGS, on its own caches.
fn images(args: &[&str]) -> Command {
    let mut command = hack("olm/build-tools.sh");
    command.arg("--previous-release").args(args);
    command
}

/// Its static binary (the Dockerfile's builder stage), built unless cached.
pub fn binary() -> PathBuf {
    PathBuf::from(stdout_of(&mut images(&["operator-binary"])))
}

/// Its image, built unless cached (root: buildah): OPERATOR_IMAGE, OPERATOR_ARCHIVE and
/// OPERATOR_BINARY as its images.sh prints them.
pub fn operator() -> BTreeMap<String, String> {
    run(&mut images(&["operator"]));
    env_lines(&stdout_of(&mut images(&["--print-env"])))
}
