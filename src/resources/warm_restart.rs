//! memcached's warm restart: item memory in a file on a memory-backed `emptyDir` (`-e`), saved
//! on SIGUSR1 and restored by the next process started with the same file and settings. A
//! container restarted in its pod (an image patched in place) keeps the `emptyDir`, and so the
//! cache. The kubelet stops a container with SIGTERM, which does not save: memcached's `preStop`
//! asks the agent beside it to send SIGUSR1 and to answer only once memcached has saved and the
//! clock has passed the stop time it wrote (a restart in the same second starts empty).

use k8s_openapi::api::core::v1::{
    DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, HTTPHeader, Lifecycle, LifecycleHandler, ObjectFieldSelector, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::Memcached;

use super::mount;
use super::ports::LocalPorts;

/// memcached preallocates its whole memory with `-e`, a page per slab class at least: below this
/// it refuses to start.
pub const MIN_MEMORY_MIB: i32 = 39;
pub const VOLUME: &str = "cache";
const DIR: &str = "/cache";
pub const MEMORY_FILE: &str = "/cache/memory_file";
/// The header the agent's save endpoint wants, with the value in the agent's environment.
pub const TOKEN_HEADER: &str = "X-Save-Token";
pub const TOKEN_ENV: &str = "AGENT_SAVE_TOKEN";

/// Whether the Memcached's members keep their cache through a container restart.
pub fn enabled(mc: &Memcached) -> bool {
    mc.spec.max_memory_mib >= MIN_MEMORY_MIB
}

pub fn memcached_args() -> [String; 2] {
    ["-e".to_string(), MEMORY_FILE.to_string()]
}

/// A memcached setting a running member takes from a pod annotation. A container's args cannot
/// change in a running pod, an annotation can: memcached reads it through an environment
/// variable, which the kubelet evaluates at each start, so another value is a restart in the
/// same pod, with the items kept (the agent, which sees the annotations through its own volume,
/// restarts memcached for it). Only settings memcached does not check against its memory file
/// (and `-m`, larger, whose check the agent satisfies) may be here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setting {
    pub flag: &'static str,
    pub annotation: &'static str,
    pub env: &'static str,
    /// The annotation's file in the agent's volume.
    pub file: &'static str,
    /// What memcached runs with when its args leave the flag out (none for `-m`: always set).
    pub default: Option<i32>,
}

impl Setting {
    /// memcached's argument after `flag`, expanded by the kubelet from `env`.
    pub fn arg(&self) -> String {
        format!("$({})", self.env)
    }

    /// The value a Memcached gives it: memcached's own default written out when the spec leaves
    /// it unset, so that setting it later changes a value, not the args.
    pub fn value(&self, mc: &Memcached) -> i32 {
        let set = match *self {
            MEMORY => Some(mc.spec.max_memory_mib),
            THREADS => mc.spec.threads,
            _ => mc.spec.max_connections,
        };
        set.or(self.default).unwrap_or_default()
    }

    fn env_var(&self) -> EnvVar {
        EnvVar {
            name: self.env.to_string(),
            value_from: Some(EnvVarSource {
                field_ref: Some(annotation_field(self.annotation)),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }
    }
}

/// memcached's `-m`: only a larger one is taken in place (the agent rewrites the size its file
/// records); the annotation is named for it alone, as 0.6.0 made it.
pub const MEMORY: Setting = Setting {
    flag: "-m",
    annotation: "cache.example.com/max-memory-mib",
    env: "MEMCACHED_MAX_MEMORY_MIB",
    file: "mib",
    default: None,
};
pub const THREADS: Setting = Setting {
    flag: "-t",
    annotation: "cache.example.com/threads",
    env: "MEMCACHED_THREADS",
    file: "threads",
    default: Some(DEFAULT_THREADS),
};
pub const MAX_CONNECTIONS: Setting = Setting {
    flag: "-c",
    annotation: "cache.example.com/max-connections",
    env: "MEMCACHED_MAX_CONNECTIONS",
    file: "max-connections",
    default: Some(DEFAULT_MAX_CONNECTIONS),
};
/// Every setting a member takes in place, in the order of memcached's args.
pub const SETTINGS: [Setting; 3] = [MEMORY, THREADS, MAX_CONNECTIONS];
/// memcached's defaults of `-t` and `-c` (1.6).
pub const DEFAULT_THREADS: i32 = 4;
pub const DEFAULT_MAX_CONNECTIONS: i32 = 1024;

pub const MEMORY_ANNOTATION: &str = MEMORY.annotation;
/// The agent's volume of the settings' annotations (named for the memory, its first).
pub const MEMORY_VOLUME: &str = "max-memory";
const MEMORY_DIR: &str = "/etc/memcached-agent/max-memory";

/// The environment memcached reads its settings from.
pub fn settings_env() -> Vec<EnvVar> {
    SETTINGS.iter().map(Setting::env_var).collect()
}

/// The settings' annotations a member's pod carries.
pub fn annotations(mc: &Memcached) -> impl Iterator<Item = (String, String)> + '_ {
    SETTINGS
        .iter()
        .map(|s| (s.annotation.to_string(), s.value(mc).to_string()))
}

/// With the `apiVersion` the API server would default: the volume's `items` is an atomic list,
/// all of it ours, so a default added there would read as drift after every restart.
fn annotation_field(annotation: &str) -> ObjectFieldSelector {
    ObjectFieldSelector {
        api_version: Some("v1".to_string()),
        field_path: format!("metadata.annotations['{annotation}']"),
    }
}

/// The memory-backed `emptyDir` of the file: charged to the pod's memory as memcached touches
/// it, never written to a disk. No `sizeLimit`: a volume's cannot change in a running pod, and
/// the file grows with `-m`.
pub fn volume() -> Volume {
    Volume {
        name: VOLUME.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".to_string()),
            size_limit: None,
        }),
        ..Volume::default()
    }
}

/// The settings' annotations as files for the agent, refreshed by the kubelet when they change
/// (so once the kubelet has them, which memcached's next start then reads too).
pub fn memory_volume() -> Volume {
    Volume {
        name: MEMORY_VOLUME.to_string(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(
                SETTINGS
                    .iter()
                    .map(|s| DownwardAPIVolumeFile {
                        path: s.file.to_string(),
                        field_ref: Some(annotation_field(s.annotation)),
                        ..DownwardAPIVolumeFile::default()
                    })
                    .collect(),
            ),
            ..DownwardAPIVolumeSource::default()
        }),
        ..Volume::default()
    }
}

pub fn memcached_mount() -> VolumeMount {
    mount(VOLUME, DIR, false)
}

/// The agent reads the stop time memcached saved beside the file, and for a larger cache
/// rewrites the size recorded there.
pub fn agent_mounts() -> [VolumeMount; 2] {
    [
        mount(VOLUME, DIR, false),
        mount(MEMORY_VOLUME, MEMORY_DIR, true),
    ]
}

/// Not a secret from whoever may read the pod, but nobody else can make memcached stop:
/// the endpoint listens on the pod's address, where the kubelet calls it.
pub fn token(mc: &Memcached) -> String {
    mc.metadata.uid.clone().unwrap_or_default()
}

/// The agent's flag naming the file of `MEMORY`; the other settings' files are beside it.
pub const MEMORY_FILE_FLAG: &str = "--max-memory-file=";

pub fn agent_args(mc: &Memcached) -> Vec<String> {
    vec![
        format!("--save-listen=0.0.0.0:{}", LocalPorts::of(mc).save),
        format!("--memory-file={MEMORY_FILE}"),
        format!("{MEMORY_FILE_FLAG}{MEMORY_DIR}/{}", MEMORY.file),
    ]
}

pub fn agent_env(mc: &Memcached) -> EnvVar {
    EnvVar {
        name: TOKEN_ENV.to_string(),
        value: Some(token(mc)),
        ..EnvVar::default()
    }
}

/// memcached's `preStop`: the agent waits `delay_seconds` (clients that still hold the address
/// are served meanwhile), then has memcached save, and answers once a restart would keep it.
pub fn pre_stop(mc: &Memcached, delay_seconds: i32) -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            http_get: Some(HTTPGetAction {
                path: Some(format!("/save?delay={delay_seconds}")),
                port: IntOrString::Int(LocalPorts::of(mc).save),
                http_headers: Some(vec![HTTPHeader {
                    name: TOKEN_HEADER.to_string(),
                    value: token(mc),
                }]),
                ..HTTPGetAction::default()
            }),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    }
}

/// Seconds a save takes at most past the delay: memcached writes its metadata at once, and the
/// agent waits for the clock to pass the stop time (under 2 s).
pub const SAVE_SECONDS: i64 = 5;
