//! `make bench`: measures an operator for Memcached on its own embedded control plane.
//!
//! Scenarios: converge (N CRs of size 1), steady (idle RSS/CPU, then size-change latency),
//! restart (time to ready and writes made), failover (SIGKILL and SIGTERM of the leader); and,
//! only when asked for, autoscaling (the autoscaler's own CPU against scripted `stats`
//! responders, `make bench-autoscaling`).
//! Operator figures come from /proc; API figures from the API server's audit log, filtered to the
//! operator's ServiceAccount, never from the operator's own metrics.

mod audit;
mod autoscaling;
mod cluster;
mod control_plane;
mod floor;
mod operator;
mod procs;
mod restart;
mod speed;
mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::{Memcached, MemcachedSpec};
use memcached_operator_testkit::OperatorProcess;
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::workload::Workload;

#[derive(Parser, Debug)]
#[command(
    about = "Benchmark an operator for Memcached on a local control plane",
    args_override_self = true
)]
struct Args {
    /// Memcached objects to create.
    #[arg(long, default_value_t = 1000)]
    crs: usize,
    /// Namespaces to spread them over.
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    /// The operator's binary, for {bin} in --operator. `make bench` passes the image's (the
    /// Dockerfile's static build, `hack/images.sh operator-binary`).
    #[arg(long, default_value = "target/release/memcached-operator")]
    operator_bin: PathBuf,
    /// Command that runs the operator; {bin}, {metrics}, {health} and {identity} are filled in,
    /// and KUBECONFIG points at its ServiceAccount's credentials. The failover adds the Lease
    /// flags config/manager ships where the command runs {bin}.
    #[arg(
        long,
        default_value = "{bin} --metrics-bind-address=127.0.0.1:{metrics} --health-probe-bind-address=127.0.0.1:{health} --identity={identity} --max-concurrent-reconciles=8"
    )]
    operator: String,
    /// A second operator binary whose restarts alternate with --operator-bin's in the restart
    /// scenario, on the same converged cluster (results under "restarts").
    #[arg(long)]
    restart_compare_bin: Option<PathBuf>,
    /// Restarts measured of each binary in the restart scenario; their medians go under
    /// "restarts" when there is more than one restart.
    #[arg(long, default_value_t = 1)]
    restarts: usize,
    /// CRD to install.
    #[arg(
        long,
        default_value = "config/crd/bases/cache.example.com_memcacheds.yaml"
    )]
    crd: PathBuf,
    /// Kustomize directory with the operator's ServiceAccount and RBAC (it runs with that
    /// ServiceAccount's token).
    #[arg(long, default_value = "config/local")]
    rbac: PathBuf,
    /// The kind the operator runs each Memcached's pods as, of the Memcached's name: what the
    /// benchmark waits on and times (this operator: pods; the reference: deployments; a
    /// StatefulSet-based operator: statefulsets).
    #[arg(long, value_enum, default_value = "pods")]
    workload: workload::Kind,
    /// Seconds of idle for the steady-state figures (and of each of autoscaling's two windows).
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// Scenarios to run, comma-separated; also `autoscaling` (--crs Memcacheds of 3 members,
    /// autoscaled, on a loopback node).
    #[arg(long, default_value = "converge,steady,restart,failover")]
    scenarios: String,
    /// Where the JSON results go; {crs} is filled in.
    #[arg(long, default_value = "bench/results/memcached-operator-{crs}.json")]
    out: String,
    /// Instead of the scenarios, with no operator: the benchmark creates each Memcached's objects
    /// in this shape itself and times the control plane to every pod Ready (floor.rs).
    #[arg(long, value_enum)]
    floor: Option<floor::Shape>,
    /// Give up waiting for convergence after this many seconds (10,000 CRs take about 1,600).
    #[arg(long, default_value_t = 3600)]
    timeout_seconds: u64,
    /// Seconds of the API server's CPU profile taken from the size change's first patch (0: none);
    /// written beside the results as .apiserver.pprof, for `go tool pprof -top`.
    #[arg(long, default_value_t = 30)]
    profile_seconds: u64,
    /// Seconds of the API server's CPU profile taken from the first restart's start (0: none);
    /// written beside the results as .restart.apiserver.pprof.
    #[arg(long, default_value_t = 0)]
    restart_profile_seconds: u64,
}

impl Args {
    fn out(&self) -> PathBuf {
        PathBuf::from(self.out.replace("{crs}", &self.crs.to_string()))
    }

    fn operator_command(&self) -> String {
        self.command_for(&self.operator_bin)
    }

    fn command_for(&self, bin: &Path) -> String {
        self.operator.replace("{bin}", &bin.display().to_string())
    }

    /// Writes an API server CPU profile beside the results, under `extension`.
    fn save_profile(&self, extension: &str, profile: &[u8], over: &str) -> Result<()> {
        let path = self.out().with_extension(extension);
        std::fs::write(&path, profile)?;
        println!(
            "the API server's CPU profile{over}: go tool pprof -top {}",
            path.display()
        );
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let scenarios: Vec<&str> = args.scenarios.split(',').map(str::trim).collect();
    let machine = machine_facts();
    let cluster = Cluster::up().await?;
    let result = run(&args, machine, &scenarios, &cluster).await;
    cluster.down().await;
    let results = result?;
    let out = args.out();
    std::fs::create_dir_all(out.parent().unwrap_or(&PathBuf::from(".")))?;
    std::fs::write(&out, serde_json::to_string_pretty(&results)?)?;
    print_table(&results);
    println!("results written to {}", out.display());
    Ok(())
}

async fn run(args: &Args, machine: Value, scenarios: &[&str], cluster: &Cluster) -> Result<Value> {
    let client = cluster.admin().await?;
    cluster.install(&args.crd, &args.rbac).await?;
    let namespaces: Vec<String> = (0..args.namespaces).map(|i| format!("bench-{i}")).collect();
    for ns in &namespaces {
        let obj = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(ns.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .patch(ns, &PatchParams::apply("bench"), &Patch::Apply(&obj))
            .await?;
    }
    let names: Vec<(String, String)> = (0..args.crs)
        .map(|i| {
            (
                namespaces[i % namespaces.len()].clone(),
                format!("mc-{i:05}"),
            )
        })
        .collect();
    let timeout = Duration::from_secs(args.timeout_seconds);
    // A floor runs no operator, so it has no command and no workload kind: its shape says what
    // was created.
    let operated = args.floor.is_none();
    let mut results = json!({
        "machine": machine,
        "operator": operated.then(|| args.operator_command()),
        "operator_binary": binary_facts(&args.operator_bin),
        "crs": args.crs,
        "namespaces": args.namespaces,
        "workload": operated.then(|| args.workload.plural()),
    });

    if let Some(shape) = args.floor {
        let calibration = calibration(&results);
        results["floor"] = floor::run(&client, &names, shape, calibration, timeout).await?;
        return Ok(results);
    }

    let mut op = operator::start(cluster, &args.operator_command(), "bench-a").await?;
    op.wait_health("/readyz", Duration::from_secs(60)).await?;

    let kind = args.workload;
    let resource = kind.api_resource();
    let workloads: Store<Workload> =
        watched(Api::all_with(client.clone(), &resource), resource.clone()).await;
    let memcacheds: Store<Memcached> = watched(Api::all(client.clone()), ()).await;

    if scenarios.contains(&"converge") {
        let t_audit = audit::now();
        let cpu_before = procs::snapshot();
        let counters_before = control_plane::Counters::read(&client).await?;
        let probe = speed::Probe::start();
        let started = Instant::now();
        let created_at: BTreeMap<(String, String), Timestamp> = stream::iter(names.iter())
            .map(|(ns, name)| {
                let client = &client;
                async move {
                    create(client, ns, name).await?;
                    anyhow::Ok(((ns.clone(), name.clone()), Timestamp::now()))
                }
            })
            .buffer_unordered(32)
            .try_collect()
            .await?;
        let created = started.elapsed();
        wait_count(
            &workloads,
            &format!("{} with replicas 1", kind.title()),
            args.crs,
            timeout,
            |w| kind.replicas(w) == Some(1),
        )
        .await?;
        let workloads_at = started.elapsed();
        wait_count(
            &workloads,
            &format!("{} with 1 ready pod", kind.title()),
            args.crs,
            timeout,
            |w| kind.ready_replicas(w) == Some(1),
        )
        .await?;
        let ready_at = started.elapsed();
        wait_count(
            &memcacheds,
            "Memcacheds Available",
            args.crs,
            timeout,
            is_available,
        )
        .await?;
        let available_at = started.elapsed();
        let speed = probe.finish(calibration(&results));
        let cpu_used = cpu_since(&cpu_before, &op);
        let control_plane = control_plane::Counters::read(&client)
            .await?
            .since(&counters_before);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let writes = cluster.audit_counts(t_audit, audit::now())?;
        let (workload_writes, controller_writes) = first_writes(cluster, kind, t_audit);
        let available: BTreeMap<(String, String), Timestamp> = memcacheds
            .state()
            .iter()
            .filter_map(|m| Some(((m.namespace()?, m.name_any()), available_since(m)?)))
            .collect();
        let parts = converge_breakdown(
            &created_at,
            &workload_writes,
            &controller_writes,
            &available,
        );
        let request_ms: BTreeMap<&String, Value> = writes
            .latency_ms
            .iter()
            .map(|(key, ms)| {
                let mut figures = p50_p99(ms);
                figures["count"] = json!(ms.len());
                (key, figures)
            })
            .collect();
        results["converge"] = json!({
            "create_seconds": created.as_secs_f64(),
            "workloads_seconds": workloads_at.as_secs_f64(),
            "pods_ready_seconds": ready_at.as_secs_f64(),
            "available_seconds": available_at.as_secs_f64(),
            "writes": writes.writes,
            "writes_per_cr": writes.writes as f64 / args.crs as f64,
            "conflicts_409": writes.code(409),
            "throttled_429": writes.code(429),
            "requests": writes.by_key,
            "request_ms": request_ms,
            "parts_ms": parts,
            "rss_peak_mib": op.peak_rss_mib(),
            // Until all Available: where the machine's cores went, and what the whole control
            // plane wrote and sent its watchers.
            "cpu_seconds": top_cpu(&cpu_used),
            "control_plane": control_plane,
            // Every client's lists and ended watches of pods: a client that reads too slowly is
            // cut off and watches or lists again.
            "pod_reads": writes.pod_reads,
            // How much slower a core was over the window than before the run.
            "speed": speed,
        });
    }

    if scenarios.contains(&"steady") {
        let t_audit = audit::now();
        let cpu0 = op.cpu_seconds();
        tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
        let idle_cpu = op.cpu_seconds() - cpu0;
        let idle_rss = op.rss_mib();
        let idle_writes = cluster.audit_counts(t_audit, audit::now())?;

        let changed: Vec<&(String, String)> = names.iter().step_by(10).collect();
        let cpu_before = procs::snapshot();
        let counters_before = control_plane::Counters::read(&client).await?;
        let profile = (args.profile_seconds > 0)
            .then(|| tokio::spawn(cluster.api_server_profile(args.profile_seconds)));
        let window = Instant::now();
        let changes = size_change(&client, &workloads, kind, &changed, 2, timeout).await?;
        let window = window.elapsed();
        let cpu_used = cpu_since(&cpu_before, &op);
        let control_plane = control_plane::Counters::read(&client)
            .await?
            .since(&counters_before);
        let latencies: Vec<f64> = changes.iter().map(|c| c.latency_ms()).collect();
        let began = changes_began(&changes);
        let (writes, scaled) = first_writes(cluster, kind, began);
        let parts = breakdown(&changes, &writes, &scaled);
        if let Some(profile) = profile {
            args.save_profile("apiserver.pprof", &profile.await??, "")?;
        }
        // Settle before the next scenario: status writes for pods still starting are not restart
        // cost. Available, not only ready: with minReadySeconds a pod counts as available some
        // seconds after it is ready, and that change is reported too.
        // Of pods, one more for each changed.
        let settled_count = match kind {
            workload::Kind::Pods => args.crs + changed.len(),
            _ => args.crs,
        };
        wait_count(
            &workloads,
            &format!("{} with all pods available", kind.title()),
            settled_count,
            timeout,
            |w| kind.settled(w),
        )
        .await?;
        // Operators that report ready pods in status (ours does, the tutorial's does not) have
        // settled when that report has caught up too.
        let reports_ready = memcacheds
            .state()
            .iter()
            .any(|m| m.status.as_ref().is_some_and(|s| s.ready_replicas > 0));
        wait_count(
            &memcacheds,
            "Memcacheds settled at their size",
            args.crs,
            timeout,
            |m: &Memcached| {
                is_available(m)
                    && (!reports_ready
                        || m.status.as_ref().is_some_and(|s| {
                            s.ready_replicas == m.spec.size && s.available_replicas == m.spec.size
                        }))
            },
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        results["steady"] = json!({
            "idle_seconds": args.idle_seconds,
            "idle_rss_mib": idle_rss,
            "idle_cpu_seconds": idle_cpu,
            "idle_writes": idle_writes.writes,
            "changed_crs": changed.len(),
            "size_change_p50_ms": percentile(&latencies, 0.50),
            "size_change_p99_ms": percentile(&latencies, 0.99),
            "size_change_parts_ms": parts,
            "size_change_window_seconds": window.as_secs_f64(),
            "size_change_cpu_seconds": top_cpu(&cpu_used),
            "size_change_control_plane": control_plane,
            "loaded_rss_mib": op.rss_mib(),
            "rss_peak_mib": op.peak_rss_mib(),
            "cpu_seconds_total": op.cpu_seconds(),
        });
    }

    if scenarios.contains(&"autoscaling") {
        if kind == workload::Kind::Deployments {
            bail!("the autoscaling scenario measures this operator's autoscaler");
        }
        results["autoscaling"] =
            autoscaling::run(args, &client, cluster, &op, &memcacheds, &namespaces).await?;
    }

    if scenarios.contains(&"restart") {
        let (next, restart, restarts) = restart::run(args, cluster, op).await?;
        op = next;
        results["restart"] = restart;
        if let Some(restarts) = restarts {
            results["restarts"] = restarts;
        }
    }
    op.stop("TERM").await;

    if scenarios.contains(&"failover") {
        // The Lease config/manager ships is this operator's: another (the reference) keeps its own.
        let lease = if args.operator.contains("{bin}") {
            shipped_lease_args().join(" ")
        } else {
            String::new()
        };
        let elect = format!(
            "{} --leader-elect --leader-election-namespace={} {lease}",
            args.operator_command(),
            memcached_operator::config::OPERATOR_NAMESPACE,
        );
        let mut gaps = BTreeMap::new();
        for (signal, target_size) in [("KILL", 3), ("TERM", 4)] {
            let mut leader = operator::start(cluster, &elect, &format!("leader-{signal}")).await?;
            operator::wait_leader(&leader, &client, Duration::from_secs(60)).await?;
            let follower = operator::start(cluster, &elect, &format!("follower-{signal}")).await?;
            follower
                .wait_health("/readyz", Duration::from_secs(60))
                .await?;
            let (ns, name) = &names[0];
            let started = Instant::now();
            leader.stop(signal).await;
            patch_size(&client, ns, name, target_size).await?;
            wait_replicas(
                &client,
                kind,
                ns,
                name,
                target_size,
                Duration::from_secs(120),
            )
            .await?;
            gaps.insert(
                format!("sig{}_seconds", signal.to_lowercase()),
                started.elapsed().as_secs_f64(),
            );
            let mut follower = follower;
            follower.stop("TERM").await;
        }
        results["failover"] = json!(gaps);
    }
    Ok(results)
}

async fn create(client: &Client, ns: &str, name: &str) -> Result<Memcached> {
    let spec: MemcachedSpec = serde_json::from_value(json!({"size": 1}))?;
    let mc = Memcached::new(name, spec);
    Ok(Api::<Memcached>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &mc)
        .await?)
}

/// How long the calibration took before the run (machine_facts), for the speed probe.
fn calibration(results: &Value) -> f64 {
    results["machine"]["calibration_seconds"]
        .as_f64()
        .unwrap_or(f64::NAN)
}

async fn patch_size(client: &Client, ns: &str, name: &str, size: i32) -> Result<()> {
    let patch = json!({"spec": {"size": size}});
    Api::<Memcached>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn wait_replicas(
    client: &Client,
    kind: workload::Kind,
    ns: &str,
    name: &str,
    replicas: i32,
    timeout: Duration,
) -> Result<()> {
    let api: Api<Workload> = Api::namespaced_with(client.clone(), ns, &kind.api_resource());
    let deadline = Instant::now() + timeout;
    let watched = kind.watched_name(name, replicas);
    loop {
        if api
            .get_opt(&watched)
            .await?
            .is_some_and(|w| kind.reached(&w, replicas))
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{ns}/{name} never reached {replicas} replicas");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A cache of every object `api` lists, kept current by a watch, so waiting costs the API server
/// nothing.
async fn watched<K>(api: Api<K>, dynamic_type: K::DynamicType) -> Store<K>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let writer = reflector::store::Writer::new(dynamic_type);
    let reader = writer.as_reader();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    let _ = reader.wait_until_ready().await;
    reader
}

/// Waits until `want` cached objects satisfy `pred`.
async fn wait_count<K>(
    store: &Store<K>,
    what: &str,
    want: usize,
    timeout: Duration,
    pred: impl Fn(&K) -> bool,
) -> Result<()>
where
    K: kube::Resource + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let deadline = Instant::now() + timeout;
    loop {
        let n = store.state().iter().filter(|o| pred(o)).count();
        if n >= want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out: {n}/{want} {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn is_available(m: &Memcached) -> bool {
    m.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Available" && c.status == "True")
    })
}

/// One size change: when the benchmark sent it and when its workload had it.
struct Change {
    key: (String, String),
    sent: Timestamp,
    seen: Timestamp,
}

impl Change {
    fn latency_ms(&self) -> f64 {
        millis(self.sent, self.seen)
    }
}

fn millis(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64() * 1000.0
}

fn changes_began(changes: &[Change]) -> Timestamp {
    changes
        .iter()
        .map(|c| c.sent)
        .min()
        .unwrap_or_else(Timestamp::now)
}

/// Changes the size of each CR, one after another, and returns when each one's workload had
/// it: watched while the rest are still being sent, so a change's latency is its own.
async fn size_change(
    client: &Client,
    workloads: &Store<Workload>,
    kind: workload::Kind,
    crs: &[&(String, String)],
    size: i32,
    timeout: Duration,
) -> Result<Vec<Change>> {
    let resource = kind.api_resource();
    let sent = std::sync::Mutex::new(BTreeMap::new());
    let send = async {
        for (ns, name) in crs {
            patch_size(client, ns, name, size).await?;
            sent.lock()
                .unwrap()
                .insert((ns.clone(), name.clone()), Timestamp::now());
        }
        anyhow::Ok(())
    };
    let watch = async {
        let mut changes = Vec::new();
        let deadline = Instant::now() + timeout;
        while changes.len() < crs.len() {
            // Only the objects still waited for: scanning the whole cache every few milliseconds
            // would take a core from the control plane being measured.
            sent.lock().unwrap().retain(|(ns, name), at| {
                let watched = kind.watched_name(name, size);
                let reached = workloads
                    .get(&ObjectRef::new_with(&watched, resource.clone()).within(ns))
                    .is_some_and(|w| kind.reached(&w, size));
                if reached {
                    changes.push(Change {
                        key: (ns.clone(), name.clone()),
                        sent: *at,
                        seen: Timestamp::now(),
                    });
                }
                !reached
            });
            if Instant::now() > deadline {
                bail!(
                    "{} size changes never reached their {}",
                    crs.len() - changes.len(),
                    resource.plural
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(changes)
    };
    let ((), changes) = tokio::try_join!(send, watch)?;
    Ok(changes)
}

/// The first write of something per Memcached, keyed by its namespace and name.
type FirstWrites = BTreeMap<(String, String), audit::Write>;

/// Since `since`, per Memcached: the operator's first write of its workload (of its first
/// member, where the operator keeps the pods itself), and its workload controller's first write
/// (none there).
fn first_writes(
    cluster: &Cluster,
    kind: workload::Kind,
    since: Timestamp,
) -> (FirstWrites, FirstWrites) {
    let mut operator = cluster.first_writes(audit::By::Operator, kind.plural(), since);
    if kind == workload::Kind::Pods {
        operator = workload::by_workload(operator);
    }
    let controller = match kind.controller() {
        Some((by, resource)) => workload::by_workload(cluster.first_writes(by, resource, since)),
        None => BTreeMap::new(),
    };
    (operator, controller)
}

/// Where each change's time went, from the operator's write of its workload in the audit log:
/// until the operator sent it (watch delivery, queue, reconcile), the API server answering it,
/// and until the benchmark's watch showed it; and the first two together, until the workload
/// was updated in the API server. Beside the benchmark's watch, another watcher of the same
/// workload: its controller in the control plane, until it acted (`scaled`: the deployment
/// controller's ReplicaSet write, the statefulset controller's pod create). p50 and p99 of
/// each, in milliseconds.
fn breakdown(
    changes: &[Change],
    writes: &BTreeMap<(String, String), audit::Write>,
    scaled: &BTreeMap<(String, String), audit::Write>,
) -> Value {
    let mut reacted = Vec::new();
    let mut answered = Vec::new();
    let mut delivered = Vec::new();
    let mut updated = Vec::new();
    let mut controller = Vec::new();
    for change in changes {
        if let Some(write) = writes.get(&change.key) {
            updated.push(millis(change.sent, write.answered));
            reacted.push(millis(change.sent, write.received));
            answered.push(millis(write.received, write.answered));
            delivered.push(millis(write.answered, change.seen));
            if let Some(scale) = scaled.get(&change.key) {
                controller.push(millis(write.answered, scale.received));
            }
        }
    }
    json!({
        "matched": reacted.len(),
        "until_operator_wrote": p50_p99(&reacted),
        "api_server_answering": p50_p99(&answered),
        "until_benchmark_saw": p50_p99(&delivered),
        "until_updated": p50_p99(&updated),
        "until_workload_controller_wrote": p50_p99(&controller),
    })
}

/// Where a new Memcached's time to Available goes, per CR (p50 and p99): from its create answered
/// until the operator's first write of its workload was received, that write's answer, from
/// it until the workload's controller first wrote (its pod, or its ReplicaSet), and from that
/// until the Memcached's Available condition (whole seconds: a condition's time has no more).
fn converge_breakdown(
    created: &BTreeMap<(String, String), Timestamp>,
    workloads: &BTreeMap<(String, String), audit::Write>,
    controller: &BTreeMap<(String, String), audit::Write>,
    available: &BTreeMap<(String, String), Timestamp>,
) -> Value {
    let (mut reacted, mut answered, mut controlled, mut until_available) =
        (vec![], vec![], vec![], vec![]);
    for (key, created) in created {
        let Some(write) = workloads.get(key) else {
            continue;
        };
        reacted.push(millis(*created, write.received));
        answered.push(millis(write.received, write.answered));
        if let Some(first) = controller.get(key) {
            controlled.push(millis(write.answered, first.received));
            if let Some(available) = available.get(key) {
                until_available.push(millis(first.received, *available));
            }
        }
    }
    json!({
        "matched": reacted.len(),
        "until_operator_wrote_workload": p50_p99(&reacted),
        "api_server_answering": p50_p99(&answered),
        "until_workload_controller_wrote": p50_p99(&controlled),
        "then_until_available": p50_p99(&until_available),
    })
}

/// When the Memcached's Available condition last became True.
fn available_since(mc: &Memcached) -> Option<Timestamp> {
    let available = mc
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Available" && c.status == "True")?;
    Some(available.last_transition_time.0)
}

/// Waits until the control plane (API server, controller manager, scheduler, etcd, kwok) uses
/// under a tenth of a core over two seconds, or `timeout`; returns the cores it used last.
async fn wait_quiet_control_plane(timeout: Duration) -> f64 {
    const CONTROL_PLANE: [&str; 5] = [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "etcd",
        "kwok",
    ];
    let window = Duration::from_secs(2);
    let deadline = Instant::now() + timeout;
    loop {
        let before = procs::snapshot();
        tokio::time::sleep(window).await;
        let used: f64 = before
            .used_since(&procs::snapshot(), &[])
            .iter()
            .filter(|(name, _)| CONTROL_PLANE.contains(&name.as_str()))
            .map(|(_, seconds)| seconds)
            .sum();
        let cores = used / window.as_secs_f64();
        if cores < 0.1 || Instant::now() > deadline {
            return cores;
        }
    }
}

/// CPU by process since `before`, the operator and the benchmark named as such.
fn cpu_since(before: &procs::Snapshot, op: &OperatorProcess) -> Vec<(String, f64)> {
    before.used_since(
        &procs::snapshot(),
        &[(op.pid(), "operator"), (std::process::id(), "benchmark")],
    )
}

/// The processes that used the most CPU, as a JSON object.
fn top_cpu(used: &[(String, f64)]) -> Value {
    Value::Object(
        used.iter()
            .take(8)
            .map(|(name, s)| (name.clone(), json!(s)))
            .collect(),
    )
}

/// `{"p50": …, "p99": …}` of `values`.
fn p50_p99(values: &[f64]) -> Value {
    json!({"p50": percentile(values, 0.50), "p99": percentile(values, 0.99)})
}

/// Nearest-rank percentile. Latencies include up to 5 ms of polling the local cache.
fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// The operator binary's size and linkage (static: no ELF interpreter), so a result says which
/// build it measured.
fn binary_facts(path: &std::path::Path) -> Value {
    let Ok(elf) = std::fs::read(path) else {
        return Value::Null;
    };
    let u = |at: usize, n: usize| {
        elf.get(at..at + n).map_or(0, |b| {
            b.iter().rev().fold(0u64, |v, &x| (v << 8) | u64::from(x))
        })
    };
    let (phoff, phentsize, phnum) = (u(32, 8) as usize, u(54, 2) as usize, u(56, 2) as usize);
    let interpreter = (0..phnum).any(|i| u(phoff + i * phentsize, 4) == 3);
    json!({ "path": path, "bytes": elf.len(), "static": elf.starts_with(b"\x7fELF") && !interpreter })
}

fn machine_facts() -> Value {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let versions = std::fs::read_to_string("hack/versions.env").unwrap_or_default();
    json!({
        "cores": cores,
        "memory_gib": mem_kib as f64 / 1024.0 / 1024.0,
        "calibration_seconds": speed::calibration_seconds(),
        "control_plane": versions.lines().filter(|l| l.contains("_VERSION=")).collect::<Vec<_>>(),
    })
}

fn print_table(results: &Value) {
    let bin = &results["operator_binary"];
    if let (Some(bytes), Some(is_static)) = (bin["bytes"].as_u64(), bin["static"].as_bool()) {
        let linkage = if is_static { "static" } else { "dynamic" };
        println!(
            "\noperator: {} ({linkage}, {:.1} MiB)",
            bin["path"].as_str().unwrap_or("?"),
            bytes as f64 / 1048576.0
        );
    }
    let kind = results["workload"].as_str().unwrap_or("workloads");
    println!("\nworkload: {kind}");
    println!("\n{:<48} {:>14}", "figure", "value");
    let created = format!("converge: all {kind} created (s)");
    let rows = [
        (created.as_str(), "/converge/workloads_seconds"),
        (
            "converge: all pods Ready (s)",
            "/converge/pods_ready_seconds",
        ),
        (
            "converge: all CRs Available (s)",
            "/converge/available_seconds",
        ),
        (
            "  created until operator wrote workload, p50 (ms)",
            "/converge/parts_ms/until_operator_wrote_workload/p50",
        ),
        (
            "  created until operator wrote workload, p99 (ms)",
            "/converge/parts_ms/until_operator_wrote_workload/p99",
        ),
        (
            "  the API server answering it, p99 (ms)",
            "/converge/parts_ms/api_server_answering/p99",
        ),
        (
            "  then until its controller wrote, p50 (ms)",
            "/converge/parts_ms/until_workload_controller_wrote/p50",
        ),
        (
            "  then until its controller wrote, p99 (ms)",
            "/converge/parts_ms/until_workload_controller_wrote/p99",
        ),
        (
            "  then until Available, p50 (ms)",
            "/converge/parts_ms/then_until_available/p50",
        ),
        (
            "  then until Available, p99 (ms)",
            "/converge/parts_ms/then_until_available/p99",
        ),
        ("converge: writes per CR", "/converge/writes_per_cr"),
        ("converge: 409 conflicts", "/converge/conflicts_409"),
        ("converge: peak RSS (MiB)", "/converge/rss_peak_mib"),
        (
            "converge: a core's slowdown against the calibration",
            "/converge/speed/slowdown_p50",
        ),
        ("steady: idle RSS (MiB)", "/steady/idle_rss_mib"),
        ("steady: idle CPU (s)", "/steady/idle_cpu_seconds"),
        ("steady: idle writes", "/steady/idle_writes"),
        ("steady: size change p50 (ms)", "/steady/size_change_p50_ms"),
        ("steady: size change p99 (ms)", "/steady/size_change_p99_ms"),
        (
            "  until updated in the API server, p99 (ms)",
            "/steady/size_change_parts_ms/until_updated/p99",
        ),
        (
            "  of which until the operator wrote, p99 (ms)",
            "/steady/size_change_parts_ms/until_operator_wrote/p99",
        ),
        (
            "  of which the API server answering, p99 (ms)",
            "/steady/size_change_parts_ms/api_server_answering/p99",
        ),
        (
            "  updated until the benchmark saw it, p99 (ms)",
            "/steady/size_change_parts_ms/until_benchmark_saw/p99",
        ),
        (
            "  updated until its controller wrote, p99 (ms)",
            "/steady/size_change_parts_ms/until_workload_controller_wrote/p99",
        ),
        ("steady: loaded RSS (MiB)", "/steady/loaded_rss_mib"),
        ("steady: CPU total (s)", "/steady/cpu_seconds_total"),
        (
            "autoscaling: all Steady after (s)",
            "/autoscaling/steady_after_seconds",
        ),
        (
            "floor: objects created, no operator (s)",
            "/floor/objects_created_seconds",
        ),
        ("floor: all pods Ready (s)", "/floor/pods_ready_seconds"),
        ("floor: CPU, every process (s)", "/floor/cpu_seconds_all"),
        ("autoscaling: window (s)", "/autoscaling/window_seconds"),
        ("autoscaling on: CPU (s)", "/autoscaling/on/cpu_seconds"),
        (
            "autoscaling on: % of a core",
            "/autoscaling/cpu_percent_of_a_core_on",
        ),
        ("autoscaling off: CPU (s)", "/autoscaling/off/cpu_seconds"),
        (
            "autoscaling off: % of a core",
            "/autoscaling/cpu_percent_of_a_core_off",
        ),
        (
            "autoscaling: CPU difference (s)",
            "/autoscaling/cpu_seconds_difference",
        ),
        (
            "autoscaling: difference, % of a core",
            "/autoscaling/cpu_percent_of_a_core_difference",
        ),
        (
            "autoscaling on: stats reads/s",
            "/autoscaling/on/stats_reads_per_second",
        ),
        (
            "autoscaling off: stats reads/s",
            "/autoscaling/off/stats_reads_per_second",
        ),
        (
            "autoscaling on: status writes",
            "/autoscaling/on/status_writes",
        ),
        ("autoscaling on: writes", "/autoscaling/on/writes"),
        (
            "autoscaling off: status writes",
            "/autoscaling/off/status_writes",
        ),
        ("autoscaling off: writes", "/autoscaling/off/writes"),
        ("autoscaling on: RSS (MiB)", "/autoscaling/on/rss_mib"),
        ("autoscaling off: RSS (MiB)", "/autoscaling/off/rss_mib"),
        (
            "autoscaling: peak RSS (MiB)",
            "/autoscaling/off/rss_peak_mib",
        ),
        (
            "autoscaling: Steady at end of window",
            "/autoscaling/steady_at_end_of_window",
        ),
        (
            "autoscaling: writes until Steady",
            "/autoscaling/until_steady_writes",
        ),
        (
            "autoscaling: one status message",
            "/autoscaling/status_autoscaling_sample/message",
        ),
        (
            "restart: control plane quiet after (s)",
            "/restart/quiet_after_seconds",
        ),
        ("restart: time to ready (s)", "/restart/ready_seconds"),
        (
            "restart: operator CPU until ready (s)",
            "/restart/until_ready_cpu_seconds/operator",
        ),
        (
            "restarts: operator CPU until ready, p50 (s)",
            "/restarts/operator/operator_cpu_until_ready_p50",
        ),
        (
            "restarts: compare's CPU until ready, p50 (s)",
            "/restarts/compare/operator_cpu_until_ready_p50",
        ),
        (
            "restarts: time to ready, p50 (s)",
            "/restarts/operator/ready_seconds_p50",
        ),
        (
            "restarts: compare's time to ready, p50 (s)",
            "/restarts/compare/ready_seconds_p50",
        ),
        ("restart: writes", "/restart/writes"),
        ("failover: SIGKILL gap (s)", "/failover/sigkill_seconds"),
        ("failover: SIGTERM gap (s)", "/failover/sigterm_seconds"),
    ];
    for (label, pointer) in rows {
        if let Some(v) = results.pointer(pointer) {
            let text = match v.as_f64() {
                Some(f) if f.fract() != 0.0 => format!("{f:.3}"),
                _ => v.to_string(),
            };
            println!("{label:<48} {text:>14}");
        }
    }
    println!("machine: {}", results["machine"]);
}

/// The Lease flags config/manager ships (`--leader-election-*`), so that the failover measured
/// is the installed operator's.
fn shipped_lease_args() -> Vec<String> {
    let manager = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/manager/manager.yaml"
    );
    std::fs::read_to_string(manager)
        .expect("config/manager/manager.yaml")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter(|arg| arg.starts_with("--leader-election-"))
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_this_operators_pods_unless_told() {
        let args = Args::try_parse_from(["bench"]).unwrap();
        assert_eq!(args.workload, workload::Kind::Pods);
        let args = Args::try_parse_from(["bench", "--workload", "deployments"]).unwrap();
        assert_eq!(args.workload, workload::Kind::Deployments);
        let args = Args::try_parse_from([
            "bench",
            "--workload",
            "deployments",
            "--workload",
            "statefulsets",
        ])
        .unwrap();
        assert_eq!(args.workload, workload::Kind::StatefulSets, "the last wins");
        assert!(Args::try_parse_from(["bench", "--workload", "replicasets"]).is_err());
    }

    #[test]
    fn a_new_memcacheds_way_to_available_is_split_at_each_first_write() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let key = |name: &str| ("bench-0".to_string(), name.to_string());
        let write = |received: &str, answered: &str| audit::Write {
            received: at(received),
            answered: at(answered),
        };
        let created = BTreeMap::from([
            (key("mc-00000"), at("2026-01-01T00:00:00Z")),
            // Never written: not counted.
            (key("mc-00001"), at("2026-01-01T00:00:00Z")),
        ]);
        let workloads = BTreeMap::from([(
            key("mc-00000"),
            write("2026-01-01T00:00:00.400Z", "2026-01-01T00:00:00.450Z"),
        )]);
        let controller = BTreeMap::from([(
            key("mc-00000"),
            write("2026-01-01T00:00:00.650Z", "2026-01-01T00:00:00.700Z"),
        )]);
        let available = BTreeMap::from([(key("mc-00000"), at("2026-01-01T00:00:02Z"))]);
        let parts = converge_breakdown(&created, &workloads, &controller, &available);
        assert_eq!(parts["matched"], 1);
        assert_eq!(parts["until_operator_wrote_workload"]["p50"], 400.0);
        assert_eq!(parts["api_server_answering"]["p50"], 50.0);
        assert_eq!(parts["until_workload_controller_wrote"]["p50"], 200.0);
        assert_eq!(parts["then_until_available"]["p99"], 1350.0);
    }

    #[test]
    fn a_size_change_is_split_at_the_operators_write_and_its_controllers() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let key = |name: &str| ("bench-1".to_string(), name.to_string());
        let changes = [
            Change {
                key: key("mc-00001"),
                sent: at("2026-01-01T00:00:00Z"),
                seen: at("2026-01-01T00:00:00.100Z"),
            },
            Change {
                key: key("mc-00011"),
                sent: at("2026-01-01T00:00:01Z"),
                seen: at("2026-01-01T00:00:01.300Z"),
            },
        ];
        let writes = BTreeMap::from([
            (
                key("mc-00001"),
                audit::Write {
                    received: at("2026-01-01T00:00:00.040Z"),
                    answered: at("2026-01-01T00:00:00.060Z"),
                },
            ),
            (
                key("mc-00011"),
                audit::Write {
                    received: at("2026-01-01T00:00:01.200Z"),
                    answered: at("2026-01-01T00:00:01.250Z"),
                },
            ),
        ]);
        // The statefulset controller created the new member of one of them.
        let pods = BTreeMap::from([(
            key("mc-00001-1"),
            audit::Write {
                received: at("2026-01-01T00:00:00.090Z"),
                answered: at("2026-01-01T00:00:00.095Z"),
            },
        )]);
        let parts = breakdown(&changes, &writes, &workload::by_workload(pods));
        assert_eq!(parts["matched"], 2);
        assert_eq!(parts["until_operator_wrote"]["p50"], 40.0);
        assert_eq!(parts["until_operator_wrote"]["p99"], 200.0);
        assert_eq!(parts["until_updated"]["p99"], 250.0);
        assert_eq!(parts["until_benchmark_saw"]["p50"], 40.0);
        assert_eq!(parts["until_workload_controller_wrote"]["p50"], 30.0);
        assert_eq!(parts["until_workload_controller_wrote"]["p99"], 30.0);
    }
}
