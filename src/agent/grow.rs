//! A larger cache in the same pod, its items kept.
//!
//! memcached cannot grow a cache in a memory file at run time (`cache_memlimit` is refused when
//! memory is preallocated, as `-e` does), and refuses to restore a file saved under another `-m`.
//! But a restore walks the whole file and takes pages it never used as free memory, so a file
//! saved at 64 MiB comes back whole at 128 once `maxbytes` in its metadata says 128.
//!
//! memcached takes `-m` from a pod annotation, which the agent sees as a file. When it holds more
//! than memcached runs with, the agent has memcached save and exit (SIGUSR1), rewrites the
//! metadata before the kubelet starts it again (it notices an exit within a second, its restart
//! takes longer) with the new size and a `stop_time` one second earlier (a start in the same
//! second would refuse the file), and the kubelet restarts memcached with the annotation's size.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::passwords::write_file;
use super::save::{Saver, Stopped};
use super::{is_alive, processes_named};

/// How often the agent reads the annotation's file.
const POLL: Duration = Duration::from_secs(1);
/// How often it looks whether memcached has exited: the metadata must be rewritten before the
/// kubelet starts the next one.
const EXIT_POLL: Duration = Duration::from_millis(2);
const MIB: u64 = 1024 * 1024;

/// Tries for one size at most: a memcached that came back smaller all the same (its start did
/// not read the annotation) would otherwise be restarted for ever.
const TRIES: u32 = 3;

/// Restarts memcached with its items whenever `file` asks for more memory than it runs with.
pub(super) async fn watch(saver: Arc<Saver>, file: PathBuf) {
    let mut tried = (0, 0);
    loop {
        tokio::time::sleep(POLL).await;
        let Some(wanted) = read_mib(&file) else {
            continue;
        };
        let Some(running) = running_mib(&saver.process) else {
            continue;
        };
        if tried.0 != wanted {
            tried = (wanted, 0);
        }
        if wanted <= running || tried.1 >= TRIES {
            continue;
        }
        tried.1 += 1;
        info!(
            running,
            wanted, "a larger cache asked for: restarting memcached with its items"
        );
        if let Err(error) = saver.grow(wanted).await {
            warn!(%error, wanted, "memcached was not restarted larger with its items");
        }
    }
}

impl Saver {
    /// memcached saved and stopped, its metadata rewritten for `mib`.
    async fn grow(&self, mib: u64) -> Result<(), String> {
        let _turn = self.turn.lock().await;
        match self.stop_saving(EXIT_POLL).await {
            Stopped::Exited(after) => {
                let text = std::fs::read_to_string(&self.meta).map_err(|e| e.to_string())?;
                let grown = grown_meta(&text, mib * MIB).ok_or("no maxbytes or stop_time")?;
                // One started meanwhile has read (and removed) the file, at the old size: its
                // memory file is new, and the metadata must not come back for it.
                if !processes_named(&self.process)
                    .map_err(|e| e.to_string())?
                    .is_empty()
                {
                    return Err("memcached started again before its metadata was rewritten".into());
                }
                // memcached reads the file as it starts: never half written.
                write_file(&self.meta, &grown).map_err(|e| e.to_string())?;
                info!(mib, exited_after = ?after, "saved and rewritten for the larger cache");
                Ok(())
            }
            Stopped::NoneRunning => Err("memcached is not running".into()),
            Stopped::Failed(message) => Err(message),
        }
    }
}

/// The annotation's value: MiB.
fn read_mib(file: &Path) -> Option<u64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// The `-m` of the memcached running in the pod (the smallest, should there be two).
fn running_mib(process: &str) -> Option<u64> {
    processes_named(process)
        .ok()?
        .into_iter()
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.as_raw_nonzero())).ok()?;
            let mib = memory_flag(&cmdline);
            is_alive(pid, process).then_some(mib).flatten()
        })
        .min()
}

/// `-m <MiB>` of a NUL-separated command line.
fn memory_flag(cmdline: &[u8]) -> Option<u64> {
    let mut args = cmdline.split(|b| *b == 0);
    args.find(|a| *a == b"-m")?;
    std::str::from_utf8(args.next()?).ok()?.parse().ok()
}

/// memcached's metadata (`K<key> <value>` lines) with `maxbytes` set and `stop_time` a second
/// earlier; None without either line.
fn grown_meta(meta: &str, maxbytes: u64) -> Option<String> {
    let mut seen = (false, false);
    let lines: Vec<String> = meta
        .lines()
        .map(|line| {
            if line.starts_with("Kmaxbytes ") {
                seen.0 = true;
                format!("Kmaxbytes {maxbytes}")
            } else if let Some(Ok(stop)) = line
                .strip_prefix("Kstop_time ")
                .map(|v| v.trim().parse::<u64>())
            {
                seen.1 = true;
                format!("Kstop_time {}", stop.saturating_sub(1))
            } else {
                line.to_string()
            }
        })
        .collect();
    (seen == (true, true)).then(|| lines.join("\n") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = "T memcached\nKversion 1.6.45\nKmaxbytes 67108864\nKstop_time 1764300000\nKcurrent_time 97\n";

    #[test]
    fn the_metadata_says_the_new_size_and_a_second_earlier() {
        let grown = grown_meta(META, 128 * MIB).unwrap();
        assert_eq!(
            grown,
            "T memcached\nKversion 1.6.45\nKmaxbytes 134217728\nKstop_time 1764299999\nKcurrent_time 97\n"
        );
    }

    #[test]
    fn metadata_without_the_size_is_left_alone() {
        assert_eq!(grown_meta("T memcached\nKstop_time 5\n", MIB), None);
        assert_eq!(grown_meta("T memcached\nKmaxbytes 5\n", MIB), None);
    }

    #[test]
    fn the_running_size_is_read_from_the_command_line() {
        assert_eq!(
            memory_flag(b"memcached\x00-m\x0064\x00-p\x0011211\x00-e\x00/cache/memory_file\x00"),
            Some(64)
        );
        assert_eq!(memory_flag(b"memcached\x00-p\x0011211\x00"), None);
        assert_eq!(memory_flag(b"memcached\0-m\0"), None);
    }

    #[test]
    fn the_rewrite_replaces_the_file_whole() {
        let dir = std::env::temp_dir().join(format!("agent-grow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let meta = dir.join("memory_file.meta");
        std::fs::write(&meta, META).unwrap();
        write_file(&meta, &grown_meta(META, 128 * MIB).unwrap()).unwrap();
        let text = std::fs::read_to_string(&meta).unwrap();
        assert!(text.contains("Kmaxbytes 134217728\n"), "{text}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
