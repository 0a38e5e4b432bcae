//! memcached's warm restart: its items saved when the kubelet stops it (`GET /save`).
//!
//! memcached keeps its items in a memory-mapped file (`-e`) on a memory-backed emptyDir, which
//! outlives the container. A new memcached restores them only if the previous one saved them,
//! which it does on SIGUSR1 (the kubelet's SIGTERM saves nothing), writing `<file>.meta`; and
//! only if the wall clock, in whole seconds, is then past the `stop_time` recorded there.
//! memcached's preStop hook asks the agent to save: the agent signals memcached, waits for it to
//! exit and for the clock to pass `stop_time`, and only then answers, since the kubelet starts
//! the next container as soon as the hook returns.
//!
//! The same endpoint (endpoint.rs), with the same token, answers the operator's autoscaler with
//! memcached's `stats` (`GET /stats`), read over the pod's loopback and logged in where memcached
//! wants it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::StatusCode;
use tokio::sync::{Mutex, watch};
use tokio::time::{Instant, sleep};
use tracing::{info, warn};

use super::loopback;
use super::passwords::Credentials;
use super::{Signal, is_alive, processes_named, signal_processes};
/// How long memcached may take to write its file's metadata and exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
const EXIT_POLL: Duration = Duration::from_millis(50);
/// Past the second after `stop_time`, so that the next memcached's start, which only follows
/// the answer, is in a later second even if the clock is slewed meanwhile.
const MARGIN: Duration = Duration::from_millis(150);
/// Without a readable `stop_time`: a wait long enough for any `stop_time` memcached could have
/// written while it exited.
const NO_META_WAIT: Duration = Duration::from_secs(2);
/// A `stop_time` further ahead than this means the clock was stepped back: waiting would hold
/// the kubelet for as long, so the save is reported failed instead.
const MAX_CLOCK_WAIT: Duration = Duration::from_secs(10);
/// How often the agent, terminating, looks whether memcached is gone.
const OUTLIVE_POLL: Duration = Duration::from_millis(100);
/// The kubelet stops a deleted pod's containers at once, memcached's through its preStop hook,
/// which asks for a save within this of the agent's SIGTERM. With none asked by then and
/// memcached running, only the agent is stopping (its image changed in place): it has nothing
/// to outlive, and waiting would only hold its restart until the grace period's SIGKILL.
pub(super) const SAVE_EXPECTED_WITHIN: Duration = Duration::from_secs(5);
/// The same the other way: a deleted pod's agent gets its SIGTERM along with memcached's preStop.
/// Without one by then, only memcached is restarting, in place (its image changed, or a probe
/// failed), and keeps its address: no client has it cached to drain, so the delay is skipped.
const STOP_SEEN_WITHIN: Duration = Duration::from_secs(2);

/// Saves memcached's items, one save at a time.
pub(super) struct Saver {
    /// memcached's `<memory file>.meta`.
    pub(super) meta: PathBuf,
    /// The name of the processes signalled: memcached (another in tests).
    pub(super) process: String,
    exit_timeout: Duration,
    /// Held through a save: a second caller then finds memcached gone (or a new one, which it
    /// saves in turn) rather than signalling one that is still saving.
    pub(super) turn: Mutex<()>,
    /// Saves asked for and not yet answered, which the agent outlives.
    in_flight: AtomicUsize,
    /// memcached's loopback listener and the logins it takes, for `GET /stats`.
    stats: Option<(SocketAddr, watch::Receiver<Vec<Credentials>>)>,
    /// Set once the agent has its SIGTERM: the pod is going away.
    stopping: watch::Sender<bool>,
    stop_seen_within: Duration,
}

impl Saver {
    pub(super) fn new(memory_file: &Path, process: &str) -> Saver {
        let mut meta = memory_file.as_os_str().to_owned();
        meta.push(".meta");
        Saver {
            meta: meta.into(),
            process: process.to_string(),
            exit_timeout: EXIT_TIMEOUT,
            turn: Mutex::new(()),
            in_flight: AtomicUsize::new(0),
            stats: None,
            stopping: watch::Sender::new(false),
            stop_seen_within: STOP_SEEN_WITHIN,
        }
    }

    /// The agent is stopping, and with it the pod.
    pub(super) fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// A preStop's save: counted until answered (the agent outlives it), after the `delay` if
    /// the pod is going away.
    pub(super) async fn save_after(&self, delay: Duration) -> (StatusCode, String) {
        let _in_flight = self.enter();
        if !delay.is_zero() {
            self.drain(delay).await;
        }
        self.save().await
    }

    /// Waits out a preStop's `delay` if the pod is going away (see `STOP_SEEN_WITHIN`).
    async fn drain(&self, delay: Duration) {
        let asked = Instant::now();
        let mut stopping = self.stopping.subscribe();
        let seen = tokio::time::timeout(
            self.stop_seen_within.min(delay),
            stopping.wait_for(|stopping| *stopping),
        )
        .await
        .is_ok_and(|seen| seen.is_ok());
        if seen {
            // memcached keeps serving the clients that still have its address meanwhile.
            info!(
                ?delay,
                "save asked for by a stopping pod: serving out the delay first"
            );
            tokio::time::sleep_until(asked + delay).await;
        } else {
            info!(
                ?delay,
                "save asked for by memcached's restart in place: no delay"
            );
        }
    }

    /// Answers `GET /stats` from memcached at `memcached`, logged in with `login`'s current.
    pub(super) fn with_stats(
        mut self,
        memcached: SocketAddr,
        login: watch::Receiver<Vec<Credentials>>,
    ) -> Saver {
        self.stats = Some((memcached, login));
        self
    }

    pub(super) async fn stats(&self) -> (StatusCode, String) {
        let Some((memcached, login)) = &self.stats else {
            return (StatusCode::NOT_FOUND, "not found\n".to_string());
        };
        let logins = login.borrow().clone();
        match loopback::stats(*memcached, &logins).await {
            Ok(answer) => (StatusCode::OK, answer),
            Err(error) => (StatusCode::BAD_GATEWAY, format!("memcached: {error}\n")),
        }
    }

    /// SIGUSR1 to memcached, then the answer once it has exited and the clock is past its
    /// `stop_time`.
    async fn save(&self) -> (StatusCode, String) {
        let _turn = self.turn.lock().await;
        let asked = SystemTime::now();
        let exited_after = match self.stop_saving(EXIT_POLL).await {
            Stopped::Exited(after) => after,
            Stopped::NoneRunning => return (StatusCode::OK, "nothing to save\n".to_string()),
            Stopped::Failed(message) => return failed(message),
        };
        let clock_started = Instant::now();
        let stop_time = match self.read_stop_time() {
            Ok(stop_time) => stop_time,
            Err(error) => {
                warn!(meta = %self.meta.display(), %error, wait = ?NO_META_WAIT, "no stop_time from the memory file's metadata; waiting instead");
                sleep(NO_META_WAIT).await;
                info!(?exited_after, clock_wait = ?clock_started.elapsed(), "saved (stop_time unknown)");
                return (StatusCode::OK, "saved; stop_time unknown\n".to_string());
            }
        };
        // memcached reads the clock for stop_time after the signal: an earlier one is a previous
        // stop's, left because this one wrote nothing.
        if UNIX_EPOCH + Duration::from_secs(stop_time.saturating_add(1)) <= asked {
            warn!(
                meta = %self.meta.display(),
                stop_time,
                "the memory file's metadata predates this save: memcached may not have saved"
            );
        }
        if let Err(wait) = wait_for_clock(stop_time).await {
            warn!(
                stop_time,
                ?wait,
                "the clock is far behind memcached's stop_time: not waiting for it"
            );
            return failed(format!(
                "saved, but the clock would pass stop_time={stop_time} only in {wait:?}: a start before then does not restore"
            ));
        }
        info!(stop_time, ?exited_after, clock_wait = ?clock_started.elapsed(), "saved");
        (StatusCode::OK, format!("saved; stop_time={stop_time}\n"))
    }

    /// SIGUSR1 to every memcached, and the wait (looking every `poll`) until they have exited.
    /// The caller holds the turn.
    pub(super) async fn stop_saving(&self, poll: Duration) -> Stopped {
        let signalled = match signal_processes(&self.process, Signal::USR1) {
            Ok(signalled) => signalled,
            Err(error) => {
                warn!(%error, "cannot list the pod's processes; nothing saved");
                return Stopped::Failed(format!("cannot list processes: {error}"));
            }
        };
        if signalled.pids.is_empty() {
            if signalled.failed > 0 {
                return Stopped::Failed(format!("cannot signal {}", self.process));
            }
            info!(process = %self.process, "save asked for, but none is running");
            return Stopped::NoneRunning;
        }
        let pids: Vec<i32> = signalled
            .pids
            .iter()
            .map(|pid| pid.as_raw_nonzero().get())
            .collect();
        info!(process = %self.process, ?pids, "saving: signalled to save and stop");
        let signalled_at = Instant::now();
        while signalled
            .pids
            .iter()
            .any(|&pid| is_alive(pid, &self.process))
        {
            if signalled_at.elapsed() >= self.exit_timeout {
                warn!(process = %self.process, ?pids, timeout = ?self.exit_timeout, "did not exit after the save signal");
                return Stopped::Failed(format!(
                    "{} did not exit within {:?}",
                    self.process, self.exit_timeout
                ));
            }
            sleep(poll).await;
        }
        Stopped::Exited(signalled_at.elapsed())
    }

    fn read_stop_time(&self) -> Result<u64, String> {
        let text = std::fs::read_to_string(&self.meta).map_err(|e| e.to_string())?;
        parse_stop_time(&text).ok_or_else(|| "no stop_time line".to_string())
    }

    /// Counts a save until it is answered.
    fn enter(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.in_flight)
    }
}

/// What SIGUSR1 to memcached came to.
pub(super) enum Stopped {
    /// Every memcached saved and exited, after this.
    Exited(Duration),
    NoneRunning,
    Failed(String),
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn failed(message: String) -> (StatusCode, String) {
    (StatusCode::INTERNAL_SERVER_ERROR, message + "\n")
}

/// `stop_time` of memcached's metadata file: lines `K<key> <value>`, among others.
fn parse_stop_time(meta: &str) -> Option<u64> {
    meta.lines()
        .find_map(|line| line.strip_prefix("Kstop_time "))
        .and_then(|value| value.trim().parse().ok())
}

/// How long from `now` until the wall clock's whole seconds are past `stop_time`, with a margin.
fn wait_past(stop_time: u64, now: SystemTime) -> Duration {
    let target = UNIX_EPOCH + Duration::from_secs(stop_time.saturating_add(1)) + MARGIN;
    target.duration_since(now).unwrap_or(Duration::ZERO)
}

/// Sleeps until `wait_past` is zero, measured again after each sleep: the sleep runs on the
/// monotonic clock, which the wall clock may drift from. Err: the wait it would have taken.
async fn wait_for_clock(stop_time: u64) -> Result<(), Duration> {
    let mut waited = Duration::ZERO;
    loop {
        let wait = wait_past(stop_time, SystemTime::now());
        if wait.is_zero() {
            return Ok(());
        }
        if waited + wait > MAX_CLOCK_WAIT {
            return Err(wait);
        }
        sleep(wait).await;
        waited += wait;
    }
}

/// After SIGTERM: returns once no memcached is left and no save is unanswered, or after `bound`;
/// or after `save_expected_within` with memcached running and no save unanswered (a save asked
/// for stays unanswered until memcached has exited).
pub(super) async fn outlive(saver: &Saver, save_expected_within: Duration, bound: Duration) {
    let started = Instant::now();
    let mut said = false;
    loop {
        let running = match processes_named(&saver.process) {
            Ok(pids) => !pids.is_empty(),
            Err(error) => {
                warn!(%error, "cannot list the pod's processes; stopping");
                return;
            }
        };
        let saving = saver.in_flight.load(Ordering::SeqCst) > 0;
        // The last answer is written in the same turn of the connection's task that ends the
        // save, so none is cut off here.
        if !running && !saving {
            return;
        }
        if running && !saving && started.elapsed() >= save_expected_within {
            info!("no save asked for: memcached runs on, only the agent stops");
            return;
        }
        if started.elapsed() >= bound {
            warn!(
                running,
                saving,
                ?bound,
                "stopping though memcached is still running or a save unanswered"
            );
            return;
        }
        if !said {
            info!(running, saving, "terminating once memcached has stopped");
            said = true;
        }
        sleep(OUTLIVE_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command};
    use std::sync::Arc;

    use clap::Parser;
    use rustix::process::Pid;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::super::endpoint::serve_save;
    use super::*;

    const TOKEN: &str = "s3cret-token";

    fn pid_of(child: &Child) -> Pid {
        Pid::from_raw(child.id() as i32).expect("a child's pid")
    }

    /// A process name no process has.
    fn absent_name() -> String {
        format!("fmc-gone-{:05x}", rand::random::<u32>() & 0xf_ffff)
    }

    /// A stand-in for memcached: `sleep` under a name of its own (a symlink's name becomes the
    /// process's), so tests running at once, and any real memcached, are not signalled.
    struct FakeMemcached {
        dir: PathBuf,
        name: String,
        child: Child,
    }

    impl FakeMemcached {
        /// Exits on SIGUSR1, as memcached does once it has saved.
        fn start() -> FakeMemcached {
            Self::spawn(|exe| {
                let mut command = Command::new(exe);
                command.arg("1000");
                command
            })
        }

        /// Ignores SIGUSR1 (an ignored signal stays ignored across exec).
        fn start_deaf() -> FakeMemcached {
            Self::spawn(|exe| {
                let mut command = Command::new("/bin/sh");
                command
                    .arg("-c")
                    .arg(r#"trap "" USR1; exec "$0" 1000"#)
                    .arg(exe);
                command
            })
        }

        fn spawn(command: impl FnOnce(&Path) -> Command) -> FakeMemcached {
            // At most 15 bytes: the kernel cuts longer names.
            let name = format!("fmc-{:08x}", rand::random::<u32>());
            let dir = std::env::temp_dir().join(format!("agent-save-{name}"));
            std::fs::create_dir_all(&dir).unwrap();
            let exe = dir.join(&name);
            let sleep = ["/bin/sleep", "/usr/bin/sleep"]
                .into_iter()
                .find(|p| Path::new(p).exists())
                .expect("sleep(1)");
            std::os::unix::fs::symlink(sleep, &exe).unwrap();
            let child = command(&exe).spawn().unwrap();
            let fake = FakeMemcached { dir, name, child };
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !fake.running() {
                assert!(std::time::Instant::now() < deadline, "the fake never ran");
                std::thread::sleep(Duration::from_millis(10));
            }
            fake
        }

        fn running(&self) -> bool {
            is_alive(pid_of(&self.child), &self.name)
        }

        fn memory_file(&self) -> PathBuf {
            self.dir.join("memory_file")
        }

        fn write_stop_time(&self, stop_time: u64) {
            std::fs::write(
                self.dir.join("memory_file.meta"),
                format!("Tmain\nKstop_time {stop_time}\nKcurrent_time 61\n"),
            )
            .unwrap();
        }

        fn saver(&self) -> Saver {
            Saver::new(&self.memory_file(), &self.name)
        }
    }

    impl Drop for FakeMemcached {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    async fn serving(saver: Saver) -> (SocketAddr, Arc<Saver>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let saver = Arc::new(saver);
        tokio::spawn(serve_save(listener, TOKEN.parse().unwrap(), saver.clone()));
        (addr, saver)
    }

    /// One request over a new connection: the status and the body.
    async fn request(
        addr: SocketAddr,
        method: &str,
        target: &str,
        token: Option<&str>,
    ) -> (u16, String) {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let header = token
            .map(|t| format!("X-Save-Token: {t}\r\n"))
            .unwrap_or_default();
        stream
            .write_all(
                format!(
                    "{method} {target} HTTP/1.1\r\nHost: agent\r\n{header}Connection: close\r\n\r\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response.split(' ').nth(1).unwrap().parse().unwrap();
        let body = response.split_once("\r\n\r\n").unwrap().1.to_string();
        (status, body)
    }

    async fn get(addr: SocketAddr, target: &str, token: Option<&str>) -> (u16, String) {
        request(addr, "GET", target, token).await
    }

    fn now_secs() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    #[test]
    fn the_stop_time_is_read_from_memcacheds_metadata() {
        let meta = "Tmain\nKversion 1.6.38\nKstop_time 1790000000\nKcurrent_time 70\n";
        assert_eq!(parse_stop_time(meta), Some(1790000000));
    }

    #[test]
    fn metadata_without_a_stop_time_gives_none() {
        assert_eq!(parse_stop_time("Tmain\nKcurrent_time 70\n"), None);
        assert_eq!(parse_stop_time("Kstop_time soon\n"), None);
        assert_eq!(parse_stop_time(""), None);
    }

    #[test]
    fn the_wait_ends_a_margin_past_the_second_after_stop_time() {
        let stop_time = 1_790_000_000;
        let at = |seconds: f64| UNIX_EPOCH + Duration::from_secs_f64(seconds);
        let stop = stop_time as f64;
        assert_eq!(
            wait_past(stop_time, at(stop)),
            Duration::from_secs(1) + MARGIN
        );
        let wait = wait_past(stop_time, at(stop + 0.5));
        assert!(
            (wait.as_secs_f64() - (0.5 + MARGIN.as_secs_f64())).abs() < 1e-6,
            "{wait:?}"
        );
        // A clock behind memcached's: the whole difference is waited for.
        let wait = wait_past(stop_time, at(stop - 2.0));
        assert!(
            (wait.as_secs_f64() - (3.0 + MARGIN.as_secs_f64())).abs() < 1e-6,
            "{wait:?}"
        );
        assert_eq!(
            wait_past(stop_time, at(stop + 1.0) + MARGIN),
            Duration::ZERO
        );
        assert_eq!(wait_past(stop_time, at(stop + 5.0)), Duration::ZERO);
    }

    /// A memcached that wants a login first, then answers `stats`.
    async fn memcached_wanting_a_login() -> SocketAddr {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let mut conn = BufReader::new(stream);
                let (mut set, mut data, mut command) =
                    (String::new(), String::new(), String::new());
                conn.read_line(&mut set).await.unwrap();
                conn.read_line(&mut data).await.unwrap();
                let ok = set.starts_with("set ") && data.trim_end() == "user pass";
                conn.get_mut()
                    .write_all(if ok {
                        b"STORED\r\n"
                    } else {
                        b"CLIENT_ERROR\r\n"
                    })
                    .await
                    .unwrap();
                conn.read_line(&mut command).await.unwrap();
                if ok && command == "stats\r\n" {
                    let answer = b"STAT uptime 5\r\nSTAT evictions 3\r\nEND\r\n";
                    conn.get_mut().write_all(answer).await.unwrap();
                }
            }
        });
        addr
    }

    #[tokio::test]
    async fn stats_are_read_logged_in_for_the_token_only() {
        let memcached = memcached_wanting_a_login().await;
        let login = Credentials {
            username: "user".into(),
            password: "pass".into(),
        };
        let (_keep, logins) = tokio::sync::watch::channel(vec![login]);
        let saver =
            Saver::new(Path::new("/nonexistent/file"), "none").with_stats(memcached, logins);
        let (addr, _) = serving(saver).await;
        let (status, body) = get(addr, "/stats", Some(TOKEN)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body, "STAT uptime 5\r\nSTAT evictions 3\r\nEND\r\n");
        assert_eq!(get(addr, "/stats", Some("wrong")).await.0, 403);
        assert_eq!(get(addr, "/stats", None).await.0, 403);
    }

    #[tokio::test]
    async fn a_save_without_the_right_token_is_forbidden_and_signals_nothing() {
        let fake = FakeMemcached::start();
        let (addr, _) = serving(fake.saver()).await;
        assert_eq!(get(addr, "/save", None).await.0, 403);
        assert_eq!(get(addr, "/save", Some("wrong")).await.0, 403);
        assert_eq!(get(addr, "/save", Some("s3cret-tokeN")).await.0, 403);
        // Another method is refused only to whoever holds the token.
        assert_eq!(request(addr, "POST", "/save", None).await.0, 403);
        assert_eq!(request(addr, "POST", "/save", Some(TOKEN)).await.0, 405);
        assert_eq!(get(addr, "/save?delay=soon", Some(TOKEN)).await.0, 400);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(fake.running());
    }

    #[tokio::test]
    async fn an_unknown_path_is_not_found() {
        let fake = FakeMemcached::start();
        let (addr, _) = serving(fake.saver()).await;
        assert_eq!(get(addr, "/", Some(TOKEN)).await.0, 404);
        assert_eq!(get(addr, "/save/now", Some(TOKEN)).await.0, 404);
        assert!(fake.running());
    }

    #[tokio::test]
    async fn a_save_signals_memcached_and_answers_once_it_has_exited_and_the_clock_passed_stop_time()
     {
        let mut fake = FakeMemcached::start();
        let stop_time = now_secs();
        fake.write_stop_time(stop_time);
        let (addr, _) = serving(fake.saver()).await;

        let (status, body) = get(addr, "/save", Some(TOKEN)).await;
        let answered = SystemTime::now();

        assert_eq!(
            (status, body.as_str()),
            (200, format!("saved; stop_time={stop_time}\n").as_str())
        );
        assert!(!fake.running());
        let exit = fake.child.try_wait().unwrap().expect("exited");
        assert_eq!(exit.signal(), Some(Signal::USR1.as_raw()));
        assert!(answered >= UNIX_EPOCH + Duration::from_secs(stop_time + 1) + MARGIN);
        assert!(answered < UNIX_EPOCH + Duration::from_secs(stop_time + 3));
    }

    #[tokio::test]
    async fn without_metadata_a_save_waits_two_seconds_after_memcached_exited() {
        let fake = FakeMemcached::start();
        let (addr, _) = serving(fake.saver()).await;
        let started = Instant::now();
        let (status, body) = get(addr, "/save", Some(TOKEN)).await;
        assert_eq!((status, body.as_str()), (200, "saved; stop_time unknown\n"));
        assert!(!fake.running());
        assert!(started.elapsed() >= NO_META_WAIT);
    }

    #[tokio::test]
    async fn a_save_with_memcached_not_running_answers_at_once() {
        let fake = FakeMemcached::start();
        let mut saver = fake.saver();
        saver.process = absent_name();
        let (addr, _) = serving(saver).await;
        let started = Instant::now();
        assert_eq!(
            get(addr, "/save", Some(TOKEN)).await,
            (200, "nothing to save\n".to_string())
        );
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(fake.running());
    }

    #[tokio::test]
    async fn a_stopping_pods_save_serves_out_its_delay_first() {
        let fake = FakeMemcached::start();
        let mut saver = fake.saver();
        saver.process = absent_name();
        saver.stop_seen_within = Duration::from_millis(500);
        let (addr, saver) = serving(saver).await;
        let started = Instant::now();
        // The agent's SIGTERM a little after memcached's preStop.
        tokio::spawn(async move {
            sleep(Duration::from_millis(100)).await;
            saver.stop();
        });
        assert_eq!(get(addr, "/save?delay=2", Some(TOKEN)).await.0, 200);
        assert!(started.elapsed() >= Duration::from_secs(2));
        assert!(fake.running());
    }

    #[tokio::test]
    async fn a_restart_in_place_saves_without_the_delay() {
        let fake = FakeMemcached::start();
        fake.write_stop_time(now_secs());
        let mut saver = fake.saver();
        saver.stop_seen_within = Duration::from_millis(500);
        let (addr, _) = serving(saver).await;
        let started = Instant::now();
        let (status, body) = get(addr, "/save?delay=60", Some(TOKEN)).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.starts_with("saved; stop_time="), "{body}");
        assert!(!fake.running());
        // The wait for a stop, then the clock's (under 2 s): not the minute asked for.
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_memcached_that_does_not_exit_fails_the_save() {
        let fake = FakeMemcached::start_deaf();
        let mut saver = fake.saver();
        saver.exit_timeout = Duration::from_millis(300);
        let (addr, _) = serving(saver).await;
        let (status, body) = get(addr, "/save", Some(TOKEN)).await;
        assert_eq!(status, 500, "{body}");
        assert!(body.contains("did not exit"), "{body}");
        assert!(fake.running());
    }

    #[tokio::test]
    async fn saves_at_once_take_turns_and_the_second_finds_memcached_gone() {
        let fake = FakeMemcached::start();
        fake.write_stop_time(now_secs());
        let (addr, _) = serving(fake.saver()).await;
        let (first, second) = tokio::join!(
            get(addr, "/save", Some(TOKEN)),
            get(addr, "/save", Some(TOKEN))
        );
        let mut bodies = [first.1, second.1];
        bodies.sort();
        assert!(bodies[0] == "nothing to save\n", "{bodies:?}");
        assert!(bodies[1].starts_with("saved; stop_time="), "{bodies:?}");
        assert!(!fake.running());
    }

    #[tokio::test]
    async fn the_terminating_agent_outlives_memcached() {
        let mut fake = FakeMemcached::start();
        let saver = fake.saver();
        let outlived = tokio::spawn(async move {
            outlive(&saver, Duration::from_secs(10), Duration::from_secs(10)).await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!outlived.is_finished());
        fake.child.kill().unwrap();
        fake.child.wait().unwrap();
        tokio::time::timeout(Duration::from_secs(2), outlived)
            .await
            .expect("done once memcached is gone")
            .unwrap();
    }

    #[tokio::test]
    async fn the_terminating_agent_waits_for_memcached_no_longer_than_its_bound() {
        let fake = FakeMemcached::start();
        let started = Instant::now();
        outlive(
            &fake.saver(),
            Duration::from_secs(10),
            Duration::from_millis(300),
        )
        .await;
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(fake.running());
    }

    #[tokio::test]
    async fn an_agent_stopped_alone_exits_once_no_save_is_asked_for_and_leaves_memcached_running() {
        let fake = FakeMemcached::start();
        let started = Instant::now();
        outlive(
            &fake.saver(),
            Duration::from_millis(300),
            Duration::from_secs(10),
        )
        .await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(
            waited < Duration::from_secs(5),
            "waited for its bound: {waited:?}"
        );
        assert!(fake.running(), "memcached was stopped");
    }

    #[tokio::test]
    async fn an_agent_asked_to_save_outlives_memcached_past_the_wait_for_a_save() {
        let mut fake = FakeMemcached::start_deaf();
        let (addr, saver) = serving(fake.saver()).await;
        // The preStop hook's save, then the SIGTERM: memcached ignores the save's signal here,
        // so only the kubelet's SIGKILL of it will end the save.
        let save = tokio::spawn(async move { get(addr, "/save", Some(TOKEN)).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let outlived = tokio::spawn(async move {
            outlive(&saver, Duration::from_millis(200), Duration::from_secs(10)).await
        });
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!outlived.is_finished(), "left while a save was unanswered");
        fake.child.kill().unwrap();
        fake.child.wait().unwrap();
        tokio::time::timeout(Duration::from_secs(5), outlived)
            .await
            .expect("done once memcached is gone and the save answered")
            .unwrap();
        save.await.unwrap();
    }

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        agent: super::super::Command,
    }

    #[test]
    fn saves_are_served_only_with_a_token_and_a_memory_file() {
        let parse = |extra: &[&str]| {
            let args = ["agent", "run", "--memcached=127.0.0.1:11211"];
            Cli::try_parse_from(args.iter().chain(extra))
        };
        assert!(parse(&[]).is_ok());
        assert!(
            parse(&[
                "--save-listen=0.0.0.0:8082",
                "--memory-file=/cache/memory_file"
            ])
            .is_err()
        );
        assert!(parse(&["--save-listen=0.0.0.0:8082", "--save-token=t"]).is_err());
        let cli = parse(&[
            "--save-listen=0.0.0.0:8082",
            "--save-token=t",
            "--memory-file=/cache/memory_file",
        ])
        .unwrap();
        let super::super::Command::Run(args) = cli.agent else {
            panic!("not run: {cli:?}");
        };
        assert!(
            !format!("{args:?}").contains("\"t\""),
            "the token is not logged"
        );
        assert_eq!(args.save_listen, Some("0.0.0.0:8082".parse().unwrap()));
        assert!(args.save_token.unwrap().matches(b"t"));
    }
}
