//! memcached's warm restart: item memory in a file on a memory-backed `emptyDir` (`-e`), saved
//! on SIGUSR1 and restored by the next process started with the same file and settings. A
//! container restarted in its pod (an image patched in place) keeps the `emptyDir`, and so the
//! cache. The kubelet stops a container with SIGTERM, which does not save: memcached's `preStop`
//! asks the agent beside it to send SIGUSR1 and to answer only once memcached has saved and the
//! clock has passed the stop time it wrote (a restart in the same second starts empty).

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, EnvVar, HTTPGetAction, HTTPHeader, Lifecycle, LifecycleHandler, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::Memcached;

use super::agent::LocalPorts;
use super::mount;

/// memcached preallocates its whole memory with `-e`, a page per slab class at least: below this
/// it refuses to start.
pub const MIN_MEMORY_MIB: i32 = 39;
const VOLUME: &str = "cache";
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

/// The memory-backed `emptyDir` of the file: charged to the pod's memory as memcached touches
/// it, never written to a disk. Room for the file (`-m`) and its metadata.
pub fn volume(mc: &Memcached) -> Volume {
    Volume {
        name: VOLUME.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".to_string()),
            size_limit: Some(Quantity(format!("{}Mi", mc.spec.max_memory_mib + 1))),
        }),
        ..Volume::default()
    }
}

pub fn memcached_mount() -> VolumeMount {
    mount(VOLUME, DIR, false)
}

/// The agent reads the stop time memcached saved beside the file.
pub fn agent_mount() -> VolumeMount {
    mount(VOLUME, DIR, true)
}

/// Not a secret from whoever may read the pod, but nobody else can make memcached stop:
/// the endpoint listens on the pod's address, where the kubelet calls it.
pub fn token(mc: &Memcached) -> String {
    mc.metadata.uid.clone().unwrap_or_default()
}

pub fn agent_args(mc: &Memcached) -> Vec<String> {
    vec![
        format!("--save-listen=0.0.0.0:{}", LocalPorts::of(mc).save),
        format!("--memory-file={MEMORY_FILE}"),
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
