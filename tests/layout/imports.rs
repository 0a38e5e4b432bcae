//! No import circle between the files of src/ or runtime/src (issue 63): each file names only
//! files beneath it in the design, so any one can be read, tested and moved without the rest.
//! Edges are the `crate::`, `super::` and `self::` paths of a file's code before its tests,
//! resolved to the longest module path that is a file; a file naming its own ancestors (a
//! parent's re-exports, its settings) does not count.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use super::{files, is_test_file, root};

type Module = Vec<String>;

/// The module a source file is, relative to the crate's source root.
fn module_of(relative: &Path) -> Module {
    let mut parts: Module = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The `::`-separated identifiers at the start of `text`; and, when they end in a `{` group, each
/// item's identifiers.
fn segments(text: &str) -> (Vec<&str>, Vec<Vec<&str>>) {
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        let end = rest.find(|c| !is_ident(c)).unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segments.push(&rest[..end]);
        match rest[end..].strip_prefix("::") {
            Some(next) => rest = next,
            None => return (segments, Vec::new()),
        }
    }
    let group = rest
        .strip_prefix('{')
        .and_then(|g| g.split_once('}'))
        .map(|(items, _)| {
            items
                .split(',')
                .map(|item| item.split_whitespace().next().unwrap_or(""))
                .map(|path| {
                    path.split("::")
                        .take_while(|s| !s.is_empty() && s.chars().all(is_ident))
                        .collect::<Vec<_>>()
                })
                .filter(|path| !path.is_empty() && path[0] != "self")
                .collect()
        })
        .unwrap_or_default();
    (segments, group)
}

/// The modules `code` (of `module`) names, among `modules`.
fn named(module: &Module, code: &str, modules: &BTreeSet<Module>) -> BTreeSet<Module> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("::") {
        let start = code[..at].rfind(|c| !is_ident(c)).map_or(0, |i| i + 1);
        let head = &code[start..at];
        if !matches!(head, "crate" | "super" | "self") {
            continue;
        }
        if start > 1 && code[..start].ends_with("::") {
            continue; // the middle of a longer path (`super::super`), taken from its start
        }
        let (mut path, group) = segments(&code[start..]);
        let mut base: Module = match path[0] {
            "crate" => Vec::new(),
            _ => module.clone(),
        };
        while let Some(&first) = path.first() {
            match first {
                "crate" | "self" => {}
                "super" => {
                    base.pop();
                }
                _ => break,
            }
            path.remove(0);
        }
        let mut candidates = vec![path.clone()];
        candidates.extend(
            group
                .iter()
                .map(|item| [path.clone(), item.clone()].concat()),
        );
        for candidate in candidates {
            let longest = (0..=candidate.len()).rev().find_map(|n| {
                let mut m = base.clone();
                m.extend(candidate[..n].iter().map(|s| s.to_string()));
                modules.contains(&m).then_some(m)
            });
            if let Some(m) = longest
                && m != *module
                && !module.starts_with(&m)
            {
                found.insert(m);
            }
        }
    }
    found
}

/// The circles among `edges`: strongly connected groups of more than one module (Tarjan).
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    self.low.insert(v, self.low[v].min(self.low[w]));
                } else if self.stack.contains(&w) {
                    self.low.insert(v, self.low[v].min(self.index[w]));
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|m| *m == v).unwrap();
                let group: Vec<Module> = self.stack.drain(at..).cloned().collect();
                if group.len() > 1 {
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

fn edges_of(source_root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut sources = Vec::new();
    files(source_root, "rs", &mut sources);
    let code: BTreeMap<Module, String> = sources
        .iter()
        .filter(|p| !is_test_file(p.strip_prefix(root()).unwrap()))
        .map(|p| {
            let text = fs::read_to_string(p).unwrap();
            let before_tests = text.split("#[cfg(test)]").next().unwrap_or_default();
            let code: Vec<&str> = before_tests
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect();
            (
                module_of(p.strip_prefix(source_root).unwrap()),
                code.join("\n"),
            )
        })
        .collect();
    let modules: BTreeSet<Module> = code.keys().cloned().collect();
    code.iter()
        .map(|(m, text)| (m.clone(), named(m, text, &modules)))
        .collect()
}

#[test]
fn no_file_of_the_operator_or_the_runtime_imports_in_a_circle() {
    // Fewer imports than these would mean the paths were not read.
    for (dir, least) in [("src", 200), ("runtime/src", 5)] {
        let edges = edges_of(&root().join(dir));
        let named: usize = edges.values().map(BTreeSet::len).sum();
        assert!(named >= least, "{dir}: only {named} imports read");
        let found: Vec<String> = circles(&edges)
            .iter()
            .map(|group| {
                let names: Vec<String> = group.iter().map(|m| m.join("/")).collect();
                names.join(" → ")
            })
            .collect();
        assert!(
            found.is_empty(),
            "{dir}: import circles:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn a_circle_is_found_and_a_parent_is_not_one() {
    let m = |s: &str| -> Module { s.split('/').map(str::to_string).collect() };
    let modules: BTreeSet<Module> = ["a", "b", "a/c"].into_iter().map(m).collect();
    assert_eq!(
        named(
            &m("a/c"),
            "use super::super::b::X;\nuse super::Y;",
            &modules
        ),
        BTreeSet::from([m("b")])
    );
    assert_eq!(
        named(&m("b"), "use crate::{a::c, b};", &modules),
        BTreeSet::from([m("a/c")])
    );
    let edges = BTreeMap::from([
        (m("a"), BTreeSet::from([m("b")])),
        (m("b"), BTreeSet::from([m("a/c")])),
        (m("a/c"), BTreeSet::from([m("a")])),
    ]);
    assert_eq!(circles(&edges).len(), 1);
}
