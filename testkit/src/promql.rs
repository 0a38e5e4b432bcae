//! The metric names a PromQL expression reads, for checking that dashboards and alerts use only
//! names that exist. Parsed with `promql-parser` (the Prometheus grammar), so an expression that
//! Prometheus would refuse fails the check too.

use std::collections::BTreeSet;

use promql_parser::label::MatchOp;
use promql_parser::parser::{self, Expr, VectorSelector};
use promql_parser::util::{ExprVisitor, walk_expr};

/// The metric names in `expr`: the names of its vector and range selectors (`x` and
/// `{__name__="x"}`). Grafana's range variables (`[$__rate_interval]`) are read as `[5m]`.
///
/// Panics, naming the expression, when it is not PromQL.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let promql = ["$__rate_interval", "$__interval", "$__range"]
        .iter()
        .fold(expr.to_string(), |e, var| e.replace(var, "5m"));
    let ast = parser::parse(&promql).unwrap_or_else(|e| panic!("not PromQL: {expr}: {e}"));
    let mut names = Names(BTreeSet::new());
    walk_expr(&mut names, &ast).expect("the visitor does not fail");
    names.0
}

struct Names(BTreeSet<String>);

impl Names {
    fn add(&mut self, vs: &VectorSelector) {
        let by_matcher = vs
            .matchers
            .matchers
            .iter()
            .filter(|m| m.name == "__name__" && m.op == MatchOp::Equal)
            .map(|m| m.value.clone());
        self.0.extend(vs.name.clone().into_iter().chain(by_matcher));
    }
}

impl ExprVisitor for Names {
    type Error = std::convert::Infallible;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Self::Error> {
        match expr {
            Expr::VectorSelector(vs) => self.add(vs),
            Expr::MatrixSelector(ms) => self.add(&ms.vs),
            _ => {}
        }
        Ok(true)
    }
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
        assert_eq!(names(r#"{__name__="y", job="j"} offset 5m"#), ["y"]);
        assert_eq!(names("max_over_time(z[10m:1m])"), ["z"]);
    }

    #[test]
    #[should_panic(expected = "not PromQL: sum(rate(x[5m])")]
    fn refuses_what_prometheus_would() {
        metric_names("sum(rate(x[5m])");
    }
}
