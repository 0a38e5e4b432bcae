//! memcached's ASCII authentication (`spec.auth`): the Secret the operator generates when the
//! user names none, the checks a Secret must pass before pods mount it, and what the pod gains:
//! an init container that writes memcached's `-Y` file, and the agent's part (see `agent.rs`),
//! which rewrites it and sends SIGHUP when the Secret changes.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, Secret, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::api::Memcached;

use super::{mount, owned_metadata};

/// The keys of a credentials Secret, as the Service Binding specification names them.
pub const USERNAME_KEY: &str = "username";
pub const PASSWORD_KEY: &str = "password";
/// The user name in Secrets the operator generates.
pub const GENERATED_USERNAME: &str = "memcached";
/// Where the agent reads the Secret, and where it writes memcached's `-Y` file.
pub const CREDENTIALS_DIR: &str = "/etc/memcached/credentials";
pub const AUTH_DIR: &str = "/run/memcached";
pub const AUTH_FILE: &str = "/run/memcached/auth";
/// memcached's file holds `user:password\n` lines read into 256-byte buffers.
const MAX_CREDENTIALS_BYTES: usize = 250;
const CREDENTIALS_VOLUME: &str = "credentials";
const AUTH_VOLUME: &str = "auth";

/// Whether the Memcached asks for authentication.
pub fn enabled(mc: &Memcached) -> bool {
    mc.spec.auth.as_ref().is_some_and(|a| a.enabled)
}

/// The Secret the pods mount: the user's, else the generated `<name>-auth`.
pub fn secret_name(mc: &Memcached) -> Option<String> {
    let auth = mc.spec.auth.as_ref().filter(|a| a.enabled)?;
    Some(
        auth.secret_name
            .clone()
            .unwrap_or_else(|| generated_secret_name(mc)),
    )
}

/// Whether the operator generates (and owns) the credentials Secret.
pub fn generates_secret(mc: &Memcached) -> bool {
    mc.spec
        .auth
        .as_ref()
        .is_some_and(|a| a.enabled && a.secret_name.is_none())
}

pub fn generated_secret_name(mc: &Memcached) -> String {
    format!("{}-auth", mc.name_any())
}

/// The Secret the operator creates once (never updates: that would change the password) when
/// the Memcached names none. Owned by the Memcached, so deleted with it.
pub fn generated_secret(mc: &Memcached, password: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(generated_secret_name(mc)),
            ..owned_metadata(mc)
        },
        type_: Some("Opaque".to_string()),
        string_data: Some(BTreeMap::from([
            (USERNAME_KEY.to_string(), GENERATED_USERNAME.to_string()),
            (PASSWORD_KEY.to_string(), password.to_string()),
        ])),
        ..Secret::default()
    }
}

/// A random password of 32 letters and digits (190 bits).
pub fn random_password() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    Alphanumeric.sample_string(&mut rand::rng(), 32)
}

/// Why memcached's password file could not hold a user name or password, if it could not: a
/// client sends `<username> <password>`, and the file splits `user:password` at the first colon
/// and ends a line at CR, LF or NUL. Checked by the operator and again by the agent.
pub fn value_problem(value: &[u8]) -> Option<String> {
    if value.is_empty() {
        return Some("is empty".into());
    }
    let b = value
        .iter()
        .find(|b| b.is_ascii_whitespace() || b.is_ascii_control() || **b == b':')?;
    Some(format!(
        "holds {:?}, which memcached's password file cannot \
         (no spaces, colons, line breaks or control characters)",
        char::from(*b)
    ))
}

/// Why memcached could not use this Secret's credentials, naming the Secret and the key; None
/// when it can.
pub fn credentials_problem(secret: &Secret) -> Option<String> {
    let name = secret.name_any();
    let value = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| v.0.as_slice())
    };
    let (Some(user), Some(password)) = (value(USERNAME_KEY), value(PASSWORD_KEY)) else {
        let missing = if value(USERNAME_KEY).is_none() {
            USERNAME_KEY
        } else {
            PASSWORD_KEY
        };
        return Some(format!("Secret {name} has no key {missing:?}"));
    };
    for (key, v) in [(USERNAME_KEY, user), (PASSWORD_KEY, password)] {
        if let Some(problem) = value_problem(v) {
            return Some(format!("Secret {name}: key {key:?} {problem}"));
        }
    }
    if user.len() + password.len() > MAX_CREDENTIALS_BYTES {
        return Some(format!(
            "Secret {name}: {USERNAME_KEY:?} and {PASSWORD_KEY:?} together must be at most \
             {MAX_CREDENTIALS_BYTES} bytes, memcached's limit"
        ));
    }
    None
}

/// memcached's flag for the password file.
pub fn memcached_args() -> [String; 2] {
    ["-Y".to_string(), AUTH_FILE.to_string()]
}

/// The mount of the password file in the memcached container.
pub fn memcached_mount() -> VolumeMount {
    mount(AUTH_VOLUME, AUTH_DIR, true)
}

/// The agent's mounts: the Secret, and the password file it writes.
pub fn agent_mounts() -> Vec<VolumeMount> {
    vec![credentials_mount(), mount(AUTH_VOLUME, AUTH_DIR, false)]
}

/// How long the previous password keeps working after a rotation.
pub fn rotation_grace_seconds(mc: &Memcached) -> i32 {
    mc.spec
        .auth
        .as_ref()
        .map_or(0, |a| a.rotation_grace_seconds)
}

/// The mount of the credentials Secret, where an agent reads it.
pub fn credentials_mount() -> VolumeMount {
    mount(CREDENTIALS_VOLUME, CREDENTIALS_DIR, true)
}

/// The agent's flags for the password file.
pub fn agent_args(mc: &Memcached) -> Vec<String> {
    let grace = rotation_grace_seconds(mc);
    vec![
        format!("--credentials={CREDENTIALS_DIR}"),
        format!("--auth-file={AUTH_FILE}"),
        format!("--rotation-grace={grace}s"),
    ]
}

/// The init container's flags: it writes the first password file before memcached starts.
pub fn init_args() -> Vec<String> {
    vec![
        "init".to_string(),
        format!("--credentials={CREDENTIALS_DIR}"),
        format!("--auth-file={AUTH_FILE}"),
    ]
}

/// The credentials Secret's volume; None without auth.
pub fn credentials_volume(mc: &Memcached) -> Option<Volume> {
    Some(Volume {
        name: CREDENTIALS_VOLUME.to_string(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name(mc)?),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    })
}

/// The Secret, and the in-memory directory of the password file.
pub fn volumes(mc: &Memcached) -> Vec<Volume> {
    let Some(credentials) = credentials_volume(mc) else {
        return Vec::new();
    };
    vec![
        credentials,
        Volume {
            name: AUTH_VOLUME.to_string(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_string()),
                size_limit: Some(Quantity("1Mi".to_string())),
            }),
            ..Volume::default()
        },
    ]
}

/// A credentials Secret's bytes as the API server returns them (`data`), for tests.
pub fn secret_data(username: &str, password: &str) -> BTreeMap<String, ByteString> {
    BTreeMap::from([
        (
            USERNAME_KEY.to_string(),
            ByteString(username.as_bytes().to_vec()),
        ),
        (
            PASSWORD_KEY.to_string(),
            ByteString(password.as_bytes().to_vec()),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AuthSpec;
    use crate::fixtures::memcached;

    fn secret(data: BTreeMap<String, ByteString>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("creds".into()),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..Secret::default()
        }
    }

    #[test]
    fn a_secret_memcached_can_use_passes() {
        assert_eq!(
            credentials_problem(&secret(secret_data("app", "s3cr3t!"))),
            None
        );
    }

    #[test]
    fn problems_name_the_secret_and_the_key() {
        let mut no_password = secret_data("app", "x");
        no_password.remove(PASSWORD_KEY);
        let cases = [
            (no_password, "Secret creds has no key \"password\""),
            (
                secret_data("app", "two words"),
                "key \"password\" holds ' '",
            ),
            (secret_data("a:b", "x"), "key \"username\" holds ':'"),
            (
                secret_data("app", "line\nbreak"),
                "key \"password\" holds '\\n'",
            ),
            (secret_data("app", ""), "key \"password\" is empty"),
            (secret_data("app", &"x".repeat(300)), "at most 250 bytes"),
        ];
        for (data, want) in cases {
            let problem = credentials_problem(&secret(data)).expect("a problem");
            assert!(problem.contains(want), "{problem:?} lacks {want:?}");
            assert!(problem.contains("creds"), "{problem:?}");
        }
    }

    #[test]
    fn generated_passwords_are_long_random_and_usable() {
        let (a, b) = (random_password(), random_password());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert_eq!(
            credentials_problem(&secret(secret_data(GENERATED_USERNAME, &a))),
            None
        );
    }

    #[test]
    fn the_generated_secret_is_owned_and_named_after_the_memcached() {
        let mut mc = memcached("cache", 1);
        mc.spec.auth = Some(AuthSpec {
            enabled: true,
            ..AuthSpec::default()
        });
        assert!(generates_secret(&mc));
        assert_eq!(secret_name(&mc).as_deref(), Some("cache-auth"));
        let s = generated_secret(&mc, "pw");
        assert_eq!(s.name_any(), "cache-auth");
        assert_eq!(s.owner_references()[0].name, "cache");
        assert_eq!(s.string_data.unwrap()[PASSWORD_KEY], "pw");

        mc.spec.auth.as_mut().unwrap().secret_name = Some("mine".into());
        assert!(!generates_secret(&mc));
        assert_eq!(secret_name(&mc).as_deref(), Some("mine"));
        mc.spec.auth.as_mut().unwrap().enabled = false;
        assert_eq!(secret_name(&mc), None);
    }
}
