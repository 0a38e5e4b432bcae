//! The layout's limits (issue 32), kept: a file a newcomer can read in one sitting, and shell only
//! for host setup. `make lint` runs it.

use std::fs;
use std::path::{Path, PathBuf};

mod imports;

/// Lines of code before its tests, in a source file of the operator or the runtime crate.
const MAX_CODE_LINES: usize = 450;
/// Lines of a source file, tests included.
const MAX_LINES: usize = 900;
/// Lines of shell in hack/.
const MAX_HACK_SHELL_LINES: usize = 3_600;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, extension: &str, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, extension, found);
        } else if path.extension().is_some_and(|e| e == extension) {
            found.push(path);
        }
    }
}

/// A file of tests only (`relative` to the repository): `tests.rs`, or under a `tests/`
/// directory.
fn is_test_file(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "tests.rs")
        || path.components().any(|c| c.as_os_str() == "tests")
}

/// Lines before the file's `#[cfg(test)]` module (all of them without one).
fn code_lines(text: &str) -> usize {
    text.lines()
        .take_while(|line| !line.starts_with("#[cfg(test)]"))
        .count()
}

#[test]
fn no_source_file_is_longer_than_a_newcomer_reads_at_once() {
    let mut sources = Vec::new();
    files(&root().join("src"), "rs", &mut sources);
    files(&root().join("runtime/src"), "rs", &mut sources);
    assert!(
        sources.len() > 20,
        "sources not found under {}",
        root().display()
    );
    let mut over = Vec::new();
    for path in &sources {
        let text = fs::read_to_string(path).unwrap();
        let relative = path.strip_prefix(root()).unwrap();
        let name = relative.display();
        let lines = text.lines().count();
        if lines > MAX_LINES {
            over.push(format!("{name}: {lines} lines (at most {MAX_LINES})"));
        }
        let code = code_lines(&text);
        if !is_test_file(relative) && code > MAX_CODE_LINES {
            over.push(format!(
                "{name}: {code} lines before its tests (at most {MAX_CODE_LINES})"
            ));
        }
    }
    assert!(over.is_empty(), "split these by role:\n{}", over.join("\n"));
}

#[test]
fn hack_holds_no_more_shell_than_host_setup_needs() {
    let mut scripts = Vec::new();
    files(&root().join("hack"), "sh", &mut scripts);
    let lines: usize = scripts
        .iter()
        .map(|p| fs::read_to_string(p).unwrap().lines().count())
        .sum();
    assert!(
        lines <= MAX_HACK_SHELL_LINES,
        "hack/ has {lines} lines of shell (at most {MAX_HACK_SHELL_LINES}): tests belong in Rust"
    );
}

#[test]
fn code_lines_stop_at_the_tests() {
    assert_eq!(code_lines("a\nb\n#[cfg(test)]\nmod tests {}\n"), 2);
    assert_eq!(code_lines("a\nb\n"), 2);
    assert!(is_test_file(Path::new("src/controller/members/tests.rs")));
    assert!(is_test_file(Path::new(
        "src/controller/reconcile/tests/optional.rs"
    )));
    assert!(!is_test_file(Path::new("src/controller/members.rs")));
}
