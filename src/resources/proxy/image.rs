//! The proxy's image: one that cannot run memcached's proxy is told by its tag (a version too
//! old), or by its pods (the check `CHECK_CONTAINER` runs first in each), and named with the
//! field that chose it.

use k8s_openapi::api::core::v1::Pod;

use super::{CHECK_CONTAINER, spec};
use crate::api::{Memcached, ProxySpec};

/// The first memcached with the proxy and its route library embedded (`proxy_config=routelib`,
/// which the proxy's pods run; the proxy itself is older, 1.6.23).
pub const FIRST_VERSION: (u32, u32, u32) = (1, 6, 33);

/// The memcached version `image`'s tag names (`memcached:1.6.18-bookworm` → 1.6.18), when it
/// is older than the proxy; None for a newer one, or a tag that names no version (a digest, a
/// name of one's own), which the proxy's pods themselves will tell.
pub fn too_old(image: &str) -> Option<String> {
    let tag = image.rsplit_once(':').map(|(_, tag)| tag)?;
    if tag.contains('/') || image.contains('@') {
        return None;
    }
    let numbers: Vec<u32> = tag
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    let [major, minor, patch] = numbers[..] else {
        return None;
    };
    let version = format!("{major}.{minor}.{patch}");
    tag.starts_with(&version)
        .then_some(())
        .filter(|()| (major, minor, patch) < FIRST_VERSION)
        .map(|()| version)
}

/// The field that chose the proxy's image, and the image.
fn image_field<'a>(
    proxy: &'a ProxySpec,
    mc: &'a Memcached,
    memcached_image: &'a str,
) -> (&'static str, &'a str) {
    match (&proxy.image, &mc.spec.image) {
        (Some(image), _) => ("spec.proxy.image", image.as_str()),
        (None, Some(image)) => ("spec.image (the proxy's default)", image.as_str()),
        (None, None) => (
            "the operator's default memcached image (the proxy's default)",
            memcached_image,
        ),
    }
}

/// Why the proxy cannot run, naming the field that chose its image: one too old for the proxy.
pub fn invalid_image(mc: &Memcached, memcached_image: &str) -> Option<String> {
    let (field, image) = image_field(spec(mc)?, mc, memcached_image);
    let version = too_old(image)?;
    let (a, b, c) = FIRST_VERSION;
    Some(format!(
        "{field}: {image} is memcached {version}, which has no proxy with its route library (memcached {a}.{b}.{c} or later has it); set spec.proxy.image to one that does"
    ))
}

/// Why the proxy cannot run, from its pods: `said` is what memcached answered the check of the
/// image (`CHECK_CONTAINER`), naming the field that chose the image.
pub fn refused_image(mc: &Memcached, memcached_image: &str, said: &str) -> Option<String> {
    let (field, image) = image_field(spec(mc)?, mc, memcached_image);
    Some(format!(
        "{field}: {image} cannot run memcached's proxy (memcached says: {said}); set spec.proxy.image to a memcached {a}.{b}.{c} or later built with it",
        said = said.trim(),
        a = FIRST_VERSION.0,
        b = FIRST_VERSION.1,
        c = FIRST_VERSION.2,
    ))
}

/// Why the proxy cannot run, as one of its `pods` told by failing the check of the image wanted
/// now; None if none did.
pub fn refused_by(mc: &Memcached, memcached_image: &str, pods: &[Pod]) -> Option<String> {
    let (_, image) = image_field(spec(mc)?, mc, memcached_image);
    refused_image(mc, memcached_image, &failed_check(pods, image)?)
}

/// What memcached answered the image check in one of `pods` that failed it, if any did with
/// `image` (the one wanted now: a pod of an image since changed says nothing of this one).
pub fn failed_check(pods: &[Pod], image: &str) -> Option<String> {
    pods.iter().find_map(|pod| {
        let checked = pod
            .spec
            .as_ref()?
            .init_containers
            .as_ref()?
            .iter()
            .any(|c| c.name == CHECK_CONTAINER && c.image.as_deref() == Some(image));
        if !checked {
            return None;
        }
        let status = pod
            .status
            .as_ref()?
            .init_container_statuses
            .as_ref()?
            .iter()
            .find(|s| s.name == CHECK_CONTAINER)?;
        // A check that failed once and passed since (its pod restarted) says nothing: only one
        // failing now, or waiting to be run again after failing, does.
        let now = status.state.as_ref()?;
        let passed =
            now.running.is_some() || now.terminated.as_ref().is_some_and(|t| t.exit_code == 0);
        if passed {
            return None;
        }
        let ended = [status.state.as_ref(), status.last_state.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|s| s.terminated.as_ref())
            .find(|t| t.exit_code != 0)?;
        Some(
            ended
                .message
                .clone()
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| format!("exit code {}", ended.exit_code)),
        )
    })
}
