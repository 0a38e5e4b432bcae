//! New settings in the same pod, the items kept: a larger cache, other threads or connections.
//!
//! memcached cannot grow a cache in a memory file at run time (`cache_memlimit` is refused when
//! memory is preallocated, as `-e` does), and refuses to restore a file saved under another `-m`.
//! But a restore walks the whole file and takes pages it never used as free memory, so a file
//! saved at 64 MiB comes back whole at 128 once `maxbytes` in its metadata says 128. `-t` and
//! `-c` it does not check against the file: a restart under others keeps every item.
//!
//! memcached takes these settings from pod annotations (`warm_restart::SETTINGS`), which the
//! agent sees as files. When one says another value than memcached runs with (for the memory, a
//! larger one), the agent has memcached save and exit (SIGUSR1), rewrites the metadata before the
//! kubelet starts it again (it notices an exit within a second, its restart takes longer) with
//! the new size and a `stop_time` one second earlier (a start in the same second would refuse the
//! file), and the kubelet restarts memcached with the annotations' settings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::passwords::write_file;
use super::save::{Saver, Stopped};
use super::{is_alive, processes_named};
use crate::resources::warm_restart::{MEMORY, SETTINGS};

/// How often the agent reads the annotations' files.
const POLL: Duration = Duration::from_secs(1);
/// How often it looks whether memcached has exited: the metadata must be rewritten before the
/// kubelet starts the next one.
const EXIT_POLL: Duration = Duration::from_millis(2);
const MIB: u64 = 1024 * 1024;

/// Tries for one set of settings at most: a memcached that came back with the old ones all the
/// same (its start did not read the annotations) would otherwise be restarted for ever.
const TRIES: u32 = 3;

/// Settings by flag.
type Values = BTreeMap<&'static str, u64>;

/// Restarts memcached with its items whenever the files beside `memory_file` (the memory's)
/// ask for other settings than it runs with.
pub(super) async fn watch(saver: Arc<Saver>, memory_file: PathBuf) {
    let mut tried = (Values::new(), 0);
    loop {
        tokio::time::sleep(POLL).await;
        let wanted = read_wanted(&memory_file);
        let Some(running) = running(&saver.process) else {
            continue;
        };
        if tried.0 != wanted {
            tried = (wanted.clone(), 0);
        }
        let changed = changed(&running, &wanted);
        if changed.is_empty() || tried.1 >= TRIES {
            continue;
        }
        tried.1 += 1;
        info!(
            ?running,
            ?changed,
            "other settings asked for: restarting memcached with its items"
        );
        let grow_to = changed.get(MEMORY.flag).copied();
        if let Err(error) = saver.restart_with(grow_to).await {
            warn!(%error, ?changed, "memcached was not restarted with its items");
        }
    }
}

/// The settings of `wanted` that memcached takes by a restart: another value than it runs with,
/// a larger one for the memory (a smaller one is a new pod's, the operator's doing).
fn changed(running: &Values, wanted: &Values) -> Values {
    wanted
        .iter()
        .filter(|(flag, value)| match running.get(*flag) {
            None => false,
            Some(now) if **flag == MEMORY.flag => *value > now,
            Some(now) => *value != now,
        })
        .map(|(flag, value)| (*flag, *value))
        .collect()
}

impl Saver {
    /// memcached saved and stopped, its metadata rewritten for a restart at once, and for
    /// `grow_to` MiB if given.
    async fn restart_with(&self, grow_to: Option<u64>) -> Result<(), String> {
        let _turn = self.turn.lock().await;
        match self.stop_saving(EXIT_POLL).await {
            Stopped::Exited(after) => {
                let text = std::fs::read_to_string(&self.meta).map_err(|e| e.to_string())?;
                let rewritten = rewritten_meta(&text, grow_to.map(|mib| mib * MIB))
                    .ok_or("no maxbytes or stop_time")?;
                // One started meanwhile has read (and removed) the file, at the old size: its
                // memory file is new, and the metadata must not come back for it.
                if !processes_named(&self.process)
                    .map_err(|e| e.to_string())?
                    .is_empty()
                {
                    return Err("memcached started again before its metadata was rewritten".into());
                }
                // memcached reads the file as it starts: never half written.
                write_file(&self.meta, &rewritten).map_err(|e| e.to_string())?;
                info!(?grow_to, exited_after = ?after, "saved and rewritten for the restart");
                Ok(())
            }
            Stopped::NoneRunning => Err("memcached is not running".into()),
            Stopped::Failed(message) => Err(message),
        }
    }
}

/// The settings the annotations' files beside `memory_file` ask for (a file not there, as in a
/// pod made before its setting came from an annotation, asks nothing).
fn read_wanted(memory_file: &Path) -> Values {
    SETTINGS
        .iter()
        .filter_map(|s| {
            let text = std::fs::read_to_string(memory_file.with_file_name(s.file)).ok()?;
            Some((s.flag, text.trim().parse().ok()?))
        })
        .collect()
}

/// The settings of the memcached running in the pod (the smallest, should there be two).
fn running(process: &str) -> Option<Values> {
    processes_named(process)
        .ok()?
        .into_iter()
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.as_raw_nonzero())).ok()?;
            let values = flags(&cmdline);
            is_alive(pid, process).then_some(values)
        })
        .min_by_key(|values| values.get(MEMORY.flag).copied())
}

/// The settings' flags in a NUL-separated command line.
fn flags(cmdline: &[u8]) -> Values {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    SETTINGS
        .iter()
        .filter_map(|s| {
            let at = args.iter().position(|a| *a == s.flag.as_bytes())?;
            let value = std::str::from_utf8(args.get(at + 1)?).ok()?.parse().ok()?;
            Some((s.flag, value))
        })
        .collect()
}

/// memcached's metadata (`K<key> <value>` lines) with `maxbytes` set (if given) and `stop_time`
/// a second earlier; None without either line.
fn rewritten_meta(meta: &str, maxbytes: Option<u64>) -> Option<String> {
    let mut seen = (false, false);
    let lines: Vec<String> = meta
        .lines()
        .map(|line| {
            if line.starts_with("Kmaxbytes ") {
                seen.0 = true;
                match maxbytes {
                    Some(maxbytes) => format!("Kmaxbytes {maxbytes}"),
                    None => line.to_string(),
                }
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
        let grown = rewritten_meta(META, Some(128 * MIB)).unwrap();
        assert_eq!(
            grown,
            "T memcached\nKversion 1.6.45\nKmaxbytes 134217728\nKstop_time 1764299999\nKcurrent_time 97\n"
        );
    }

    #[test]
    fn a_restart_for_other_threads_keeps_the_size_and_starts_a_second_earlier() {
        let kept = rewritten_meta(META, None).unwrap();
        assert_eq!(
            kept,
            "T memcached\nKversion 1.6.45\nKmaxbytes 67108864\nKstop_time 1764299999\nKcurrent_time 97\n"
        );
    }

    #[test]
    fn metadata_without_the_size_is_left_alone() {
        assert_eq!(
            rewritten_meta("T memcached\nKstop_time 5\n", Some(MIB)),
            None
        );
        assert_eq!(rewritten_meta("T memcached\nKmaxbytes 5\n", None), None);
    }

    #[test]
    fn the_running_settings_are_read_from_the_command_line() {
        assert_eq!(
            flags(b"memcached\x00-m\x0064\x00-p\x0011211\x00-t\x004\x00-c\x001024\x00-e\x00/cache/memory_file\x00"),
            [("-m", 64), ("-t", 4), ("-c", 1024)].into()
        );
        assert_eq!(flags(b"memcached\x00-p\x0011211\x00"), Values::new());
        assert_eq!(flags(b"memcached\0-m\0"), Values::new());
    }

    #[test]
    fn memcached_restarts_for_a_larger_memory_and_for_other_threads_or_connections() {
        let running: Values = [("-m", 64), ("-t", 4), ("-c", 1024)].into();
        let with = |flag, value| {
            let mut wanted = running.clone();
            wanted.insert(flag, value);
            changed(&running, &wanted)
        };
        assert_eq!(changed(&running, &running), Values::new());
        assert_eq!(with("-m", 128), [("-m", 128)].into());
        assert_eq!(
            with("-m", 32),
            Values::new(),
            "a smaller memory is a new pod"
        );
        assert_eq!(with("-t", 2), [("-t", 2)].into());
        assert_eq!(with("-c", 2048), [("-c", 2048)].into());
    }

    #[test]
    fn a_setting_memcached_does_not_take_from_an_annotation_restarts_nothing() {
        // A member made before threads came from an annotation: -t is not on its command line.
        let running: Values = [("-m", 64)].into();
        let wanted: Values = [("-m", 64), ("-t", 2)].into();
        assert_eq!(changed(&running, &wanted), Values::new());
    }

    #[test]
    fn the_wanted_settings_are_the_files_beside_the_memorys() {
        let dir = std::env::temp_dir().join(format!("agent-settings-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("mib"), "128").unwrap();
        std::fs::write(dir.join("threads"), "2\n").unwrap();
        assert_eq!(
            read_wanted(&dir.join("mib")),
            [("-m", 128), ("-t", 2)].into(),
            "no connections file: nothing asked"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_rewrite_replaces_the_file_whole() {
        let dir = std::env::temp_dir().join(format!("agent-grow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let meta = dir.join("memory_file.meta");
        std::fs::write(&meta, META).unwrap();
        write_file(&meta, &rewritten_meta(META, Some(128 * MIB)).unwrap()).unwrap();
        let text = std::fs::read_to_string(&meta).unwrap();
        assert!(text.contains("Kmaxbytes 134217728\n"), "{text}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
