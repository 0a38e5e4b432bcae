//! The README's quick start, run as a new user would: `make run-local` in the foreground, then
//! the commands of the README's block, one by one, with the KUBECONFIG it prints; then Ctrl-C
//! and `make cluster-down`. The commands are read from README.md, so a README that stops working
//! fails here. `make test-quick-start` runs it; with REAL_NODE=1 (root) on the real node too.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use memcached_operator_testkit::memcached::Connection;
use memcached_operator_testkit::net::http_get;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The README's quick start block, as lines of commands (comments and blanks dropped).
fn quick_start() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme
        .split_once("## Quick start")
        .expect("README.md has a Quick start")
        .1;
    let block = section
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the Quick start has a sh block")
        .0;
    block
        .lines()
        .map(|line| line.split_once('#').map_or(line, |(cmd, _)| cmd).trim())
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect()
}

/// `make ...` in the repository, on the test's own cluster directory (the README's default,
/// .cluster/local, may hold a developer's own cluster).
fn make(cluster: &Path, args: &str, real_node: bool) -> Command {
    let mut command = Command::new("make");
    command
        .current_dir(repo())
        .args(shlex::split(args).unwrap())
        .arg(format!("LOCAL_CLUSTER_DIR={}", cluster.display()));
    if real_node {
        command.arg("REAL_NODE=1");
    }
    command
}

/// A command line of the README run by the shell, with `kubeconfig` exported.
fn sh(line: &str, kubeconfig: &Path) -> (bool, String) {
    let out = Command::new("sh")
        .args(["-c", line])
        .current_dir(repo())
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("$ {line}\n{text}");
    (out.status.success(), text)
}

/// `make run-local` in a process group of its own (as a terminal's foreground job), its output
/// read line by line.
struct RunLocal {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl RunLocal {
    fn start(mut command: Command) -> RunLocal {
        let mut child = command
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    eprintln!("[run-local] {line}");
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        RunLocal { child, lines }
    }

    /// The first line that `pick` takes, within `timeout`.
    fn wait_for<T>(&self, timeout: Duration, pick: impl Fn(&str) -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(found) = pick(&line) {
                        return found;
                    }
                }
                Err(error) => {
                    panic!("make run-local: nothing expected within {timeout:?}: {error}")
                }
            }
        }
    }

    /// Ctrl-C, as the README says: SIGINT to the whole foreground job. Whether it had ended
    /// within `timeout`.
    fn interrupt(&mut self, timeout: Duration) -> bool {
        let pgid = self.child.id() as i32;
        // SAFETY: a signal to a process group this test made.
        unsafe { libc::kill(-pgid, libc::SIGINT) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: as above.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.wait();
        false
    }
}

/// What the quick start shows a user, and what they would check of it.
fn run_quick_start(real_node: bool) {
    // Beside the README's .cluster/local; short, as containerd's socket paths must be.
    let cluster = repo().join(".cluster").join(match real_node {
        true => "quick-start-real",
        false => "quick-start",
    });
    let lines = quick_start();
    assert_eq!(
        lines.first().map(String::as_str),
        Some("make run-local"),
        "the quick start begins with make run-local: {lines:?}"
    );
    assert_eq!(
        lines.last().map(String::as_str),
        Some("make cluster-down"),
        "the quick start ends with make cluster-down: {lines:?}"
    );
    // What a previous run left, if it was killed.
    let _ = make(&cluster, "cluster-down", real_node).status();

    let mut run = RunLocal::start(make(&cluster, "run-local", real_node));
    let kubeconfig = run.wait_for(Duration::from_secs(1800), |line| {
        line.trim()
            .strip_prefix("export KUBECONFIG=")
            .map(PathBuf::from)
    });
    for line in &lines[1..lines.len() - 1] {
        if line.starts_with("export KUBECONFIG=") {
            continue;
        }
        let (ok, out) = sh(line, &kubeconfig);
        assert!(ok, "{line} failed:\n{out}");
        if line == "kubectl get mc" {
            let row = out
                .lines()
                .find(|l| l.starts_with("memcached-sample "))
                .unwrap_or_else(|| panic!("kubectl get mc lists no memcached-sample:\n{out}"));
            let columns: Vec<&str> = row.split_whitespace().collect();
            // NAME SIZE READY AVAILABLE REASON AGE
            assert_eq!(
                columns.get(1),
                Some(&"3"),
                "size 3, as the sample asks: {row}"
            );
            assert_eq!(columns.get(2), Some(&"3"), "3 members ready: {row}");
            assert_eq!(
                columns.get(3),
                Some(&"True"),
                "the sample is Available: {row}"
            );
        }
    }
    // The endpoints the README names, served by the operator it runs.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let readyz = runtime.block_on(http_get(8081, "/readyz"));
    assert_eq!(
        readyz.as_ref().map(|(code, _)| *code),
        Some(200),
        "/readyz: {readyz:?}"
    );
    let metrics = runtime
        .block_on(http_get(8080, "/metrics"))
        .unwrap_or_default()
        .1;
    assert!(
        metrics.contains("controller_runtime_reconcile_total"),
        "/metrics serves the controller's series"
    );
    if real_node {
        members_answer_as_memcached(&runtime, &kubeconfig);
    }
    let stopped = run.interrupt(Duration::from_secs(30));
    let down = make(&cluster, "cluster-down", real_node).status().unwrap();
    assert!(stopped, "Ctrl-C stopped make run-local within 30 s");
    assert!(down.success(), "make cluster-down: {down}");
    let (up, _) = sh(
        "kubectl get --raw /readyz --request-timeout=5s",
        &kubeconfig,
    );
    assert!(!up, "the control plane is down after make cluster-down");
}

/// On the real node the sample's members are real memcached: each keeps a key and gives it
/// back at its pod IP, as run-local's message says.
fn members_answer_as_memcached(runtime: &tokio::runtime::Runtime, kubeconfig: &Path) {
    let (ok, ips) = sh(
        "kubectl get pods -l app.kubernetes.io/instance=memcached-sample \
         -o jsonpath='{range .items[*]}{.status.podIP}{\"\\n\"}{end}'",
        kubeconfig,
    );
    assert!(ok, "pod IPs: {ips}");
    let ips: Vec<&str> = ips.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(ips.len(), 3, "three members: {ips:?}");
    for ip in ips {
        runtime.block_on(async {
            let addr = format!("{ip}:11211").parse().unwrap();
            let mut conn = Connection::connect(addr).await.unwrap();
            conn.set("quick-start", ip.as_bytes()).await.unwrap();
            let got = conn.get("quick-start").await.unwrap();
            assert_eq!(
                got.as_deref(),
                Some(ip),
                "memcached at {ip} gives the key back"
            );
        });
    }
}

#[test]
fn the_readme_quick_start_works_as_written() {
    run_quick_start(false);
}

#[test]
fn the_readme_quick_start_works_with_a_real_node() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("REQUIRE_REAL_NODE").is_none(),
            "REQUIRE_REAL_NODE is set, but a real node needs root"
        );
        eprintln!("skipped: a real node needs root");
        return;
    }
    run_quick_start(true);
}
