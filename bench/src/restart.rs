//! The restart scenario: the operator is stopped and started again on a quiet, converged control
//! plane; measured until it is ready (time, its CPU) and over its first pass (writes, peak RSS).
//!
//! A restart's CPU moves by ±0.1 s between runs of the same build at 10,000, as much as a change
//! under test saves, and a pair of whole runs also differs in the cluster each one converged. With
//! `--restart-compare-bin`, restarts alternate between the two binaries on one converged cluster,
//! `--restarts` times each, so both builds list the same objects from the same API server.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use memcached_operator_testkit::OperatorProcess;
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::{Args, audit, cpu_since, operator, percentile, procs, top_cpu};

/// Runs the scenario after `op` (the running operator) is stopped; returns the operator left
/// running and the results: `restart` (the first restart of `--operator-bin`, as always) and, when
/// restarts repeat or alternate, `restarts` with each binary's figures and medians.
pub async fn run(
    args: &Args,
    cluster: &Cluster,
    mut op: OperatorProcess,
) -> Result<(OperatorProcess, Value, Option<Value>)> {
    let mut binaries = vec![("operator", args.operator_bin.as_path())];
    if let Some(compare) = &args.restart_compare_bin {
        binaries.push(("compare", compare.as_path()));
    }
    let mut rounds: Vec<(&str, Value)> = Vec::new();
    for round in 0..args.restarts.max(1) {
        for &(label, bin) in &binaries {
            op.stop("TERM").await;
            let identity = format!("bench-restart-{label}-{round}");
            let profile = round == 0 && label == "operator";
            let (next, figures) = once(args, cluster, bin, &identity, profile).await?;
            op = next;
            rounds.push((label, figures));
        }
    }
    let restart = rounds.first().map_or(Value::Null, |(_, v)| v.clone());
    if rounds.len() == 1 {
        return Ok((op, restart, None));
    }
    let mut restarts = json!({});
    for &(label, bin) in &binaries {
        let runs: Vec<&Value> = rounds
            .iter()
            .filter(|(l, _)| *l == label)
            .map(|(_, v)| v)
            .collect();
        let median = |pointer: &str| {
            let values: Vec<f64> = runs
                .iter()
                .filter_map(|v| v.pointer(pointer)?.as_f64())
                .collect();
            percentile(&values, 0.5)
        };
        restarts[label] = json!({
            "binary": bin.display().to_string(),
            "operator_cpu_until_ready_p50": median("/until_ready_cpu_seconds/operator"),
            "ready_seconds_p50": median("/ready_seconds"),
            "rss_peak_mib_p50": median("/rss_peak_mib"),
            "writes_p50": median("/writes"),
            "runs": runs,
        });
    }
    Ok((op, restart, Some(restarts)))
}

/// One restart of `bin`, started once the control plane is quiet.
async fn once(
    args: &Args,
    cluster: &Cluster,
    bin: &Path,
    identity: &str,
    profile: bool,
) -> Result<(OperatorProcess, Value)> {
    // Converged means the control plane too: pods of the size change still settling are not
    // what a restart costs.
    let quiet = Instant::now();
    let control_plane_cores = crate::wait_quiet_control_plane(Duration::from_secs(120)).await;
    let quiet = quiet.elapsed();
    let t_audit = audit::now();
    let cpu_before = procs::snapshot();
    let profile = (profile && args.restart_profile_seconds > 0)
        .then(|| tokio::spawn(cluster.api_server_profile(args.restart_profile_seconds)));
    let started = Instant::now();
    let op = operator::start(cluster, &args.command_for(bin), identity).await?;
    op.wait_health("/readyz", Duration::from_secs(120)).await?;
    let ready = started.elapsed();
    let cpu_used = cpu_since(&cpu_before, &op);
    // Let it finish its first pass over every object before counting.
    op.wait_reconciled(args.crs, Duration::from_secs(300)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    if let Some(profile) = profile {
        args.save_profile(
            "restart.apiserver.pprof",
            &profile.await??,
            " over the restart",
        )?;
    }
    let writes = cluster.audit_counts(t_audit, audit::now())?;
    let figures = json!({
        "quiet_after_seconds": quiet.as_secs_f64(),
        "control_plane_cores_before": control_plane_cores,
        "ready_seconds": ready.as_secs_f64(),
        "until_ready_cpu_seconds": top_cpu(&cpu_used),
        "writes": writes.writes,
        "requests": writes.by_key,
        "rss_peak_mib": op.peak_rss_mib(),
    });
    Ok((op, figures))
}
