//! Command-line flags and environment, with controller-runtime's names so manifests look familiar.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand};

use operator_runtime::telemetry::LogFormat;
use operator_runtime::watch_namespace::WatchNamespace;

/// The namespace `config/default` installs the operator into (`make deploy`, the e2e suites).
pub const OPERATOR_NAMESPACE: &str = "memcached-operator-system";
/// The operator's ServiceAccount there (kustomize's name prefix + `controller-manager`).
pub const SERVICE_ACCOUNT: &str = "memcached-operator-controller-manager";
/// The default name of the leader-election Lease (`--leader-election-id`).
pub const LEASE_NAME: &str = "memcached-operator-lock";

#[derive(Parser, Debug)]
#[command(
    name = "memcached-operator",
    version,
    about = "Kubernetes operator for Memcached"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the Memcached CustomResourceDefinition as YAML.
    Crd,
    /// The agent beside memcached in pods with spec.auth (not for direct use).
    #[command(subcommand, hide = true)]
    Agent(crate::agent::Command),
}

#[derive(Parser, Debug, Clone)]
pub struct RunArgs {
    /// Address of the /metrics endpoint, e.g. ":8080" or "127.0.0.1:8080"; "0" disables it.
    #[arg(long, default_value = ":8080", value_parser = parse_bind_address)]
    pub metrics_bind_address: BindAddress,

    /// Address of the /healthz and /readyz endpoints; "0" disables them.
    #[arg(long, default_value = ":8081", value_parser = parse_bind_address)]
    pub health_probe_bind_address: BindAddress,

    /// Take a Lease before reconciling, so only one replica acts at a time.
    #[arg(long, default_value_t = false)]
    pub leader_elect: bool,

    /// Name of the Lease used for leader election.
    #[arg(long, default_value = LEASE_NAME)]
    pub leader_election_id: String,

    /// Namespace of the Lease. Default: POD_NAMESPACE, else the in-cluster service account's namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// How long a Lease is valid without renewal; followers wait this long after a crash.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// The leader stops (and exits) if it cannot renew within this time.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub leader_election_renew_deadline: Duration,

    /// How often to try to acquire or renew the Lease.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub leader_election_retry_period: Duration,

    /// Reconciles that may run at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub max_concurrent_reconciles: u16,

    /// Memcacheds that may be rolling at once before the operator starts a rollout of its own
    /// (a new default image or pod template after an upgrade); 0 for no limit. Rollouts a
    /// Memcached's spec asks for never wait.
    #[arg(long, env = "MAX_CONCURRENT_ROLLOUTS", default_value_t = 10)]
    pub max_concurrent_rollouts: u16,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Serve /metrics over HTTPS, only to callers whose bearer token passes a TokenReview and a
    /// SubjectAccessReview for get on /metrics. Off by default, as in controller-runtime, so local
    /// runs and plain scrapers work; the shipped manifests turn it on.
    #[arg(long, default_value_t = false)]
    pub metrics_secure: bool,

    /// Directory with tls.crt and tls.key for --metrics-secure; a self-signed certificate otherwise.
    #[arg(long)]
    pub metrics_cert_path: Option<std::path::PathBuf>,

    /// How long a shutdown waits for running reconciles before exiting anyway.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub graceful_shutdown_timeout: Duration,

    /// Namespaces to watch: empty for all, one name, or a comma-separated list (OLM sets this from
    /// the OperatorGroup's target namespaces).
    #[arg(long, env = "WATCH_NAMESPACE", default_value = "", value_parser = WatchNamespace::parse)]
    pub watch_namespace: WatchNamespace,

    /// memcached image for Memcacheds that set no spec.image.
    #[arg(long, env = "RELATED_IMAGE_MEMCACHED", default_value = crate::resources::FALLBACK_MEMCACHED_IMAGE)]
    pub memcached_image: String,

    /// memcached exporter image for Memcacheds with monitoring that set no
    /// spec.monitoring.image.
    #[arg(long, env = "RELATED_IMAGE_MEMCACHED_EXPORTER", default_value = crate::resources::FALLBACK_EXPORTER_IMAGE)]
    pub exporter_image: String,

    /// Image of the agent beside memcached for Memcacheds with spec.auth: the operator's own
    /// image (`make deploy` sets it to IMG).
    #[arg(long, env = "RELATED_IMAGE_AGENT", default_value = crate::resources::FALLBACK_AGENT_IMAGE)]
    pub agent_image: String,

    /// This process's identity in Leases and Events. Default: POD_NAME, else the host name with
    /// a random suffix.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

impl RunArgs {
    /// This process's identity: --identity/POD_NAME, else `<host name>_<random>` as
    /// controller-runtime makes it. Never the bare host name: two processes on one host would
    /// then both take themselves for the Lease's holder.
    pub fn identity(&self) -> String {
        self.identity
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| {
                let host = operator_runtime::host_name()
                    .unwrap_or_else(|| "memcached-operator".to_string());
                format!("{host}_{:08x}", rand::random::<u32>())
            })
    }
}

/// A listen address, or none when the endpoint is disabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindAddress(pub Option<SocketAddr>);

/// Go-style bind addresses: ":8080" listens on all interfaces, "0" disables.
fn parse_bind_address(s: &str) -> Result<BindAddress, String> {
    let addr = match s {
        "0" | "" => return Ok(BindAddress(None)),
        s if s.starts_with(':') => format!("0.0.0.0{s}")
            .parse()
            .map_err(|e| format!("{s:?}: {e}")),
        s => s
            .parse()
            .map_err(|e| format!("{s:?} is not host:port ({e})")),
    };
    addr.map(|a| BindAddress(Some(a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses_follow_controller_runtime() {
        assert_eq!(
            parse_bind_address(":8080"),
            Ok(BindAddress(Some("0.0.0.0:8080".parse().unwrap())))
        );
        assert_eq!(
            parse_bind_address("127.0.0.1:9"),
            Ok(BindAddress(Some("127.0.0.1:9".parse().unwrap())))
        );
        assert_eq!(parse_bind_address("0"), Ok(BindAddress(None)));
        assert!(parse_bind_address("nonsense").is_err());
    }

    #[test]
    fn defaults_match_controller_runtime() {
        let cli = Cli::try_parse_from(["memcached-operator"]).unwrap();
        let r = cli.run;
        assert_eq!(r.leader_election_lease_duration, Duration::from_secs(15));
        assert_eq!(r.leader_election_renew_deadline, Duration::from_secs(10));
        assert_eq!(r.leader_election_retry_period, Duration::from_secs(2));
        assert!(!r.leader_elect);
        assert_eq!(
            r.metrics_bind_address,
            BindAddress(Some("0.0.0.0:8080".parse().unwrap()))
        );
    }

    #[test]
    fn processes_without_a_given_identity_get_distinct_ones() {
        let args = || Cli::try_parse_from(["memcached-operator"]).unwrap().run;
        let (a, b) = (args(), args());
        if a.identity.is_none() {
            assert_ne!(a.identity(), b.identity());
        }
        let named = Cli::try_parse_from(["memcached-operator", "--identity", "pod-1"]).unwrap();
        assert_eq!(named.run.identity(), "pod-1");
    }

    #[test]
    fn bad_flag_values_are_usage_errors() {
        let err =
            Cli::try_parse_from(["memcached-operator", "--watch-namespace", "UPPER"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("UPPER"));
        let err = Cli::try_parse_from(["memcached-operator", "--max-concurrent-reconciles", "0"])
            .unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }
}
