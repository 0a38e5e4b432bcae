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

/// The pod annotation holding memcached's `-m`. A container's args cannot change in a running
/// pod, an annotation can: memcached reads it through `MEMORY_ENV`, which the kubelet evaluates
/// at each start, so a larger cache is a restart in the same pod, with the items kept (the
/// agent, which sees the annotation through its own volume, restarts memcached for it).
pub const MEMORY_ANNOTATION: &str = "cache.example.com/max-memory-mib";
pub const MEMORY_ENV: &str = "MEMCACHED_MAX_MEMORY_MIB";
/// memcached's `-m` value, expanded by the kubelet from `MEMORY_ENV`.
pub const MEMORY_ARG: &str = "$(MEMCACHED_MAX_MEMORY_MIB)";
pub const MEMORY_VOLUME: &str = "max-memory";
const MEMORY_DIR: &str = "/etc/memcached-agent/max-memory";
const MEMORY_FILE_NAME: &str = "mib";

pub fn memory_env() -> EnvVar {
    EnvVar {
        name: MEMORY_ENV.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(annotation_field()),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// With the `apiVersion` the API server would default: the volume's `items` is an atomic list,
/// all of it ours, so a default added there would read as drift after every restart.
fn annotation_field() -> ObjectFieldSelector {
    ObjectFieldSelector {
        api_version: Some("v1".to_string()),
        field_path: format!("metadata.annotations['{MEMORY_ANNOTATION}']"),
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

/// The annotation `MEMORY_ANNOTATION` as a file for the agent, refreshed by the kubelet when it
/// changes (so once the kubelet has it, which memcached's next start then reads too).
pub fn memory_volume() -> Volume {
    Volume {
        name: MEMORY_VOLUME.to_string(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(vec![DownwardAPIVolumeFile {
                path: MEMORY_FILE_NAME.to_string(),
                field_ref: Some(annotation_field()),
                ..DownwardAPIVolumeFile::default()
            }]),
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

/// The agent's flag naming the file of `MEMORY_ANNOTATION`.
pub const MEMORY_FILE_FLAG: &str = "--max-memory-file=";

pub fn agent_args(mc: &Memcached) -> Vec<String> {
    vec![
        format!("--save-listen=0.0.0.0:{}", LocalPorts::of(mc).save),
        format!("--memory-file={MEMORY_FILE}"),
        format!("{MEMORY_FILE_FLAG}{MEMORY_DIR}/{MEMORY_FILE_NAME}"),
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
