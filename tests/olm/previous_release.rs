//! The previous release's operator (PREVIOUS_RELEASE, PREVIOUS_RELEASE_COMMIT in
//! hack/olm/versions.env), built by its own tree's hack/images.sh: the upgrade tests run what
//! that release shipped, as one binary cannot play both. Cached under
//! `$MEMCACHED_OPERATOR_CACHE/previous-release/<commit>/`: `src/` (git archive of the commit),
//! `git/` (that commit alone: the old images.sh labels the image from git, and exits outside a
//! repository), and `target/` and `cache/` of its own (never this worktree's; the old images.sh
//! prunes its cache to its newest three). The other releases' directories are removed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use memcached_operator_testkit::env_lines;

use crate::scripts::{olm_versions, repo, run, stdout_of};

pub struct PreviousRelease {
    dir: PathBuf,
    version: String,
}

impl PreviousRelease {
    /// The release's tree, extracted once.
    pub fn extracted() -> Self {
        let versions = olm_versions();
        let (version, commit) = (
            versions["PREVIOUS_RELEASE"].clone(),
            versions["PREVIOUS_RELEASE_COMMIT"].clone(),
        );
        let cache = std::env::var_os("MEMCACHED_OPERATOR_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/memcached-operator")
            });
        let dir = cache.join("previous-release").join(&commit);
        let release = Self { dir, version };
        if !release.src().join("Cargo.toml").is_file() || !release.git().join("HEAD").is_file() {
            release.extract(&commit);
        }
        release.forget_other_releases();
        release
    }

    fn src(&self) -> PathBuf {
        self.dir.join("src")
    }

    fn git(&self) -> PathBuf {
        self.dir.join("git")
    }

    /// Into a directory of this process's own, then moved into place: a concurrent extraction
    /// never sees half a tree.
    fn extract(&self, commit: &str) {
        eprintln!(
            "extracting {commit} (release {}) into {}",
            self.version,
            self.dir.display()
        );
        let tmp = self.dir.join(format!(".tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("src")).unwrap();
        let tar = tmp.join("src.tar");
        let git = |args: &[&str]| {
            let mut command = Command::new("git");
            command.args(args);
            command
        };
        run(git(&["-C", repo().to_str().unwrap(), "archive", "-o"])
            .arg(&tar)
            .arg(commit));
        run(Command::new("tar")
            .arg("-C")
            .arg(tmp.join("src"))
            .arg("-xf")
            .arg(&tar));
        let cargo = std::fs::read_to_string(tmp.join("src/Cargo.toml")).unwrap();
        assert!(
            cargo.contains(&format!("\nversion = \"{}\"\n", self.version)),
            "{commit} is not release {}",
            self.version
        );
        let bare = tmp.join("git");
        run(git(&["init", "-q", "--bare"]).arg(&bare));
        let in_git = |args: &[&str]| {
            let mut command = git(args);
            command.env("GIT_DIR", &bare);
            command
        };
        run(&mut in_git(&[
            "fetch",
            "-q",
            "--depth=1",
            repo().to_str().unwrap(),
            commit,
        ]));
        run(&mut in_git(&["update-ref", "--no-deref", "HEAD", commit]));
        run(&mut in_git(&["config", "core.bare", "false"]));
        run(in_git(&["read-tree", "HEAD"]).env("GIT_WORK_TREE", tmp.join("src")));
        let _ = std::fs::remove_dir_all(self.src());
        let _ = std::fs::remove_dir_all(self.git());
        std::fs::rename(tmp.join("src"), self.src()).unwrap();
        std::fs::rename(&bare, self.git()).unwrap();
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    /// Once a release is cut the one before it is never built again, and each holds a target
    /// directory of its own (about 800 MB).
    fn forget_other_releases(&self) {
        let Some(parent) = self.dir.parent() else {
            return;
        };
        for entry in std::fs::read_dir(parent).into_iter().flatten().flatten() {
            if entry.path() != self.dir {
                eprintln!(
                    "removing {}, a release no longer tested",
                    entry.path().display()
                );
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    /// The release's own hack/images.sh, on its own caches.
    fn images(&self, args: &[&str]) -> Command {
        let mut command = Command::new(self.src().join("hack/images.sh"));
        command
            .args(args)
            .env_remove("RUSTFLAGS")
            .env("MEMCACHED_OPERATOR_CACHE", self.dir.join("cache"))
            .env("CARGO_TARGET_DIR", self.dir.join("target"))
            .env(
                "OPERATOR_IMAGE",
                format!("localhost/memcached-operator:{}", self.version),
            )
            .env("GIT_DIR", self.git())
            .env("GIT_WORK_TREE", self.src());
        command
    }

    /// Its static binary (the Dockerfile's builder stage), built unless cached.
    pub fn binary(&self) -> PathBuf {
        PathBuf::from(stdout_of(&mut self.images(&["operator-binary"])))
    }

    /// Its image, built unless cached (root: buildah): OPERATOR_IMAGE, OPERATOR_ARCHIVE and
    /// OPERATOR_BINARY as its images.sh prints them.
    pub fn operator(&self) -> BTreeMap<String, String> {
        run(&mut self.images(&["operator"]));
        env_lines(&stdout_of(&mut self.images(&["--print-env"])))
    }
}
