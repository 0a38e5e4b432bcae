//! The binding Secret applications mount (`spec.binding`), in the layout of the Service Binding
//! for Kubernetes specification (servicebinding.io): one entry per file under
//! `$SERVICE_BINDING_ROOT/<binding>/`, the Memcached being the specification's Provisioned
//! Service through `status.binding.name`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::{auth, owned_metadata, tls};
use crate::api::Memcached;

/// The specification's `type` entry, and the Secret's type (`servicebinding.io/<type>`).
pub const TYPE: &str = "memcached";
pub const PROVIDER: &str = "memcached-operator";
/// The entry listing the members, `<address>:<port>` separated by commas, in a stable order.
pub const SERVERS_KEY: &str = "servers";

/// Whether the Memcached asks for a binding Secret.
pub fn enabled(mc: &Memcached) -> bool {
    mc.spec.binding.as_ref().is_some_and(|b| b.enabled)
}

/// Whether the binding repeats what the Secrets the pods mount hold (credentials, a CA).
pub fn copies_secrets(mc: &Memcached) -> bool {
    enabled(mc) && (auth::enabled(mc) || tls::enabled(mc))
}

pub fn secret_name(mc: &Memcached) -> String {
    format!("{}-binding", mc.name_any())
}

/// What the binding repeats of the Secrets the pods mount, as they were read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Copied {
    /// `username` and `password`, with auth on.
    pub credentials: Option<(ByteString, ByteString)>,
    /// The TLS Secret's `ca.crt`, where it has one, with TLS on.
    pub ca: Option<ByteString>,
}

impl Copied {
    /// From the credentials Secret (`spec.auth`), once memcached can use it.
    pub fn take_credentials(&mut self, secret: &Secret) {
        if let (Some(user), Some(password)) = (
            value(secret, auth::USERNAME_KEY),
            value(secret, auth::PASSWORD_KEY),
        ) {
            self.credentials = Some((user, password));
        }
    }

    /// From the server's certificate Secret (`spec.tls.secretName`), where it carries its CA.
    pub fn take_ca(&mut self, secret: &Secret) {
        self.ca = value(secret, tls::CA_KEY);
    }
}

fn value(secret: &Secret, key: &str) -> Option<ByteString> {
    secret.data.as_ref()?.get(key).cloned()
}

/// The binding Secret as the spec wants it; None without `spec.binding`, or while auth is on and the credentials are not read yet
/// (a binding without them would refuse every client that reads it then).
pub fn secret(mc: &Memcached, copied: &Copied) -> Option<Secret> {
    if !enabled(mc) || (auth::enabled(mc) && copied.credentials.is_none()) {
        return None;
    }
    let port = u16::try_from(mc.spec.container_port).ok()?;
    let servers = super::servers(mc);
    // With the proxy, `host` is its one address; `servers` still lists the members for
    // clients that hash keys themselves.
    let host = format!(
        "{}.{}.svc",
        match super::proxy::enabled(mc) {
            true => super::proxy::name(mc),
            false => mc.name_any(),
        },
        mc.namespace().unwrap_or_default()
    );
    let mut data: BTreeMap<String, ByteString> = [
        ("type", TYPE.to_string()),
        ("provider", PROVIDER.to_string()),
        ("host", host),
        ("port", port.to_string()),
        (SERVERS_KEY, servers.join(",")),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), ByteString(value.into_bytes())))
    .collect();
    if let Some((user, password)) = &copied.credentials {
        data.insert(auth::USERNAME_KEY.into(), user.clone());
        data.insert(auth::PASSWORD_KEY.into(), password.clone());
    }
    if tls::enabled(mc) {
        data.insert("tls".into(), ByteString(b"true".to_vec()));
        if let Some(ca) = &copied.ca {
            data.insert(tls::CA_KEY.into(), ca.clone());
        }
    }
    Some(Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(mc)),
            ..owned_metadata(mc)
        },
        type_: Some(format!("servicebinding.io/{TYPE}")),
        data: Some(data),
        ..Secret::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached_with_spec;
    use serde_json::json;

    fn entries(secret: &Secret) -> BTreeMap<&str, &str> {
        secret
            .data
            .as_ref()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), std::str::from_utf8(&v.0).unwrap()))
            .collect()
    }

    fn bytes(s: &str) -> ByteString {
        ByteString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_plain_binding_names_the_service_and_every_member_in_order() {
        let mc = memcached_with_spec(json!({"binding": {"enabled": true}}));
        let secret = secret(&mc, &Copied::default()).unwrap();
        assert_eq!(secret.metadata.name.as_deref(), Some("cache-binding"));
        assert_eq!(secret.type_.as_deref(), Some("servicebinding.io/memcached"));
        assert_eq!(
            entries(&secret),
            BTreeMap::from([
                ("type", "memcached"),
                ("provider", "memcached-operator"),
                ("host", "cache.default.svc"),
                ("port", "11211"),
                (
                    "servers",
                    "cache-0.cache.default.svc:11211,cache-1.cache.default.svc:11211,cache-2.cache.default.svc:11211"
                ),
            ])
        );
        let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.uid, "uid-cache");
    }

    #[test]
    fn with_the_proxy_the_host_is_its_one_address() {
        let mc =
            memcached_with_spec(json!({"binding": {"enabled": true}, "proxy": {"enabled": true}}));
        let secret = secret(&mc, &Copied::default()).unwrap();
        let entries = entries(&secret);
        assert_eq!(entries["host"], "cache-proxy.default.svc");
        assert!(entries["servers"].starts_with("cache-0.cache.default.svc:11211,"));
    }

    #[test]
    fn auth_and_tls_add_the_credentials_and_the_ca() {
        let mc = memcached_with_spec(json!({
            "binding": {"enabled": true},
            "auth": {"enabled": true},
            "tls": {"enabled": true, "secretName": "cert"},
        }));
        let copied = Copied {
            credentials: Some((bytes("memcached"), bytes("s3cret"))),
            ca: Some(bytes("PEM")),
        };
        let secret = secret(&mc, &copied).unwrap();
        let entries = entries(&secret);
        assert_eq!(entries["username"], "memcached");
        assert_eq!(entries["password"], "s3cret");
        assert_eq!(entries["ca.crt"], "PEM");
        assert_eq!(entries["tls"], "true");
    }

    #[test]
    fn none_without_the_spec_or_before_the_credentials_are_read() {
        let off = memcached_with_spec(json!({"auth": {"enabled": true}}));
        assert_eq!(secret(&off, &Copied::default()), None);
        let unread = memcached_with_spec(json!({
            "binding": {"enabled": true}, "auth": {"enabled": true},
        }));
        assert_eq!(secret(&unread, &Copied::default()), None);
    }

    #[test]
    fn copied_takes_the_credentials_and_the_servers_ca() {
        let secret = |keys: &[(&str, &str)]| Secret {
            data: Some(
                keys.iter()
                    .map(|(k, v)| (k.to_string(), bytes(v)))
                    .collect(),
            ),
            ..Secret::default()
        };
        let mut copied = Copied::default();
        copied.take_credentials(&secret(&[("username", "u"), ("password", "p")]));
        copied.take_ca(&secret(&[("tls.crt", "C"), ("tls.key", "K")]));
        assert_eq!(
            copied.ca, None,
            "a certificate without its CA gives the clients none"
        );
        copied.take_ca(&secret(&[
            ("tls.crt", "C"),
            ("tls.key", "K"),
            ("ca.crt", "CA"),
        ]));
        assert_eq!(copied.credentials, Some((bytes("u"), bytes("p"))));
        assert_eq!(copied.ca, Some(bytes("CA")));
    }
}
