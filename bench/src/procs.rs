//! CPU used by every process on the machine over a window, by command name: where the cores went
//! while the operator waited (the API server, etcd, the controller manager, kwok, the benchmark).
//! The control plane's components are one binary (hack/controlplane): they are told apart by the
//! subcommand each was started with.

use std::collections::{BTreeMap, HashMap};

const CLOCK_TICKS: f64 = 100.0;

/// CPU ticks per process at one moment.
pub struct Snapshot(HashMap<u32, (String, u64)>);

pub fn snapshot() -> Snapshot {
    let mut procs = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some((comm, ticks)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| parse_stat(&s))
        {
            let name = std::fs::read(entry.path().join("cmdline"))
                .ok()
                .and_then(|cmdline| subcommand(&comm, &cmdline))
                .unwrap_or(comm);
            procs.insert(pid, (name, ticks));
        }
    }
    Snapshot(procs)
}

/// `(comm, utime + stime)` from a /proc/<pid>/stat line; the name is in parentheses and may
/// hold spaces or parentheses itself.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let (head, rest) = stat.rsplit_once(") ")?;
    let comm = head.split_once(" (")?.1.to_string();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat, so 12 and 13 after the name.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((comm, ticks))
}

/// `kube-apiserver`, `kube-controller-manager` or `kube-scheduler` for the control plane's binary
/// (its name truncated to 15 characters in stat), from its NUL-separated command line.
fn subcommand(comm: &str, cmdline: &[u8]) -> Option<String> {
    if !"kube-controlplane".starts_with(comm) || comm.len() < 15 {
        return None;
    }
    let arg = cmdline.split(|b| *b == 0).nth(1)?;
    Some(String::from_utf8_lossy(arg).into_owned()).filter(|a| a.starts_with("kube-"))
}

impl Snapshot {
    /// Seconds of CPU each command used since `self`, the largest first; `names` relabels pids (two processes can share a truncated command name). Processes
    /// that started during the window count from zero; those that ended are lost.
    pub fn used_since(&self, later: &Snapshot, names: &[(u32, &str)]) -> Vec<(String, f64)> {
        let mut by_name: BTreeMap<String, u64> = BTreeMap::new();
        for (pid, (comm, ticks)) in &later.0 {
            let before = self.0.get(pid).map_or(0, |(_, t)| *t);
            let used = ticks.saturating_sub(before);
            if used == 0 {
                continue;
            }
            let name = names
                .iter()
                .find(|(p, _)| p == pid)
                .map_or(comm.as_str(), |(_, n)| n);
            *by_name.entry(name.to_string()).or_default() += used;
        }
        let mut used: Vec<(String, f64)> = by_name
            .into_iter()
            .map(|(name, ticks)| (name, ticks as f64 / CLOCK_TICKS))
            .collect();
        used.sort_by(|a, b| b.1.total_cmp(&a.1));
        used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_command_and_cpu_ticks() {
        let line = "4242 (kube-apiserver) S 1 4242 4242 0 -1 4194560 1 0 0 0 700 42 0 0 20 0 9 0";
        assert_eq!(parse_stat(line), Some(("kube-apiserver".into(), 742)));
        let odd = "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 5 6 0 0 20 0 1 0";
        assert_eq!(parse_stat(odd), Some(("a (b) c".into(), 11)));
    }

    #[test]
    fn control_plane_components_are_named_by_their_subcommand() {
        let apiserver = b"/cache/kube-controlplane\0kube-apiserver\0--etcd-servers=x\0";
        assert_eq!(
            subcommand("kube-controlpla", apiserver),
            Some("kube-apiserver".into())
        );
        assert_eq!(subcommand("etcd", b"etcd\0--data-dir=x\0"), None);
        assert_eq!(subcommand("kube-controlpla", b"kube-controlplane\0"), None);
    }

    #[test]
    fn cpu_is_summed_by_name_since_the_first_snapshot() {
        let before = Snapshot(HashMap::from([
            (1, ("etcd".into(), 100)),
            (2, ("memcached-opera".into(), 10)),
            (3, ("idle".into(), 5)),
        ]));
        let after = Snapshot(HashMap::from([
            (1, ("etcd".into(), 350)),
            (2, ("memcached-opera".into(), 60)),
            (3, ("idle".into(), 5)),
            (4, ("etcd".into(), 50)),
        ]));
        assert_eq!(
            before.used_since(&after, &[(2, "operator")]),
            vec![("etcd".into(), 3.0), ("operator".into(), 0.5)]
        );
    }
}
