//! The metric names a PromQL expression reads, for checking that dashboards and alerts use only
//! names that exist. A small scanner, not a parser: enough for the expressions this repository
//! writes (selectors, functions, aggregations with `by`, binary operators).

use std::collections::BTreeSet;

/// Keywords followed by a list of label names.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// The other keywords.
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "inf", "nan"];

/// The metric names in `expr`: identifiers outside label matchers, ranges and strings that are
/// not functions, aggregations' label lists or keywords.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let stripped = strip_label_lists(&strip_enclosed(expr));
    let chars: Vec<char> = stripped.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let after = chars[i..].iter().find(|c| !c.is_whitespace());
            let preceded_by_digit = start > 0 && chars[start - 1].is_ascii_digit();
            if after != Some(&'(')
                && !preceded_by_digit
                && !KEYWORDS
                    .iter()
                    .chain(LABEL_LIST_KEYWORDS)
                    .any(|k| word.eq_ignore_ascii_case(k))
            {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// `expr` without string literals, `{...}` label matchers and `[...]` ranges.
fn strip_enclosed(expr: &str) -> String {
    let mut out = String::new();
    let mut chars = expr.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                let mut escaped = false;
                for d in chars.by_ref() {
                    if !escaped && d == c {
                        break;
                    }
                    escaped = !escaped && d == '\\';
                }
                out.push(' ');
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                for d in chars.by_ref() {
                    if d == close {
                        break;
                    }
                }
                out.push(' ');
            }
            c => out.push(c),
        }
    }
    out
}

/// `expr` without the label lists of `by (...)`, `without (...)`, `on (...)`, `ignoring (...)`,
/// `group_left (...)` and `group_right (...)`.
fn strip_label_lists(expr: &str) -> String {
    let mut out = expr.to_string();
    for keyword in LABEL_LIST_KEYWORDS {
        let mut from = 0;
        while let Some(found) = out[from..].find(keyword) {
            let at = from + found;
            let before_ok = at == 0
                || !out[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            let rest = &out[at + keyword.len()..];
            let trimmed = rest.trim_start();
            if before_ok && trimmed.starts_with('(') {
                let open = at + keyword.len() + (rest.len() - trimmed.len());
                let close = out[open..].find(')').map_or(out.len(), |c| open + c + 1);
                out.replace_range(at..close, " ");
                from = at;
            } else {
                from = at + keyword.len();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).into_iter().collect()
    }

    #[test]
    fn finds_the_series_and_nothing_else() {
        assert_eq!(
            names(
                r#"histogram_quantile(0.99, sum by (le) (rate(x_bucket{controller="m",a=~"$ns"}[$__rate_interval])))"#
            ),
            ["x_bucket"]
        );
        assert_eq!(
            names(
                "sum by (namespace, service) (rate(hits[5m])) / sum by (namespace, service) (rate(gets[5m])) < 0.8\nand sum without (pod) (rate(gets[5m])) > 1"
            ),
            ["gets", "hits"]
        );
        assert_eq!(names(r#"absent(up{job="x"} == 1) or vector(0)"#), ["up"]);
        assert_eq!(names("a / on (pod) group_left (node) b"), ["a", "b"]);
        assert_eq!(names("max(x) < 1e3"), ["x"]);
    }
}
