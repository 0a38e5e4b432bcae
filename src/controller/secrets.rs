//! The Secrets the pods will mount (`spec.auth`'s credentials, `spec.tls`'s certificate and
//! client CA) exist and memcached can use them, before a pod template that mounts them is
//! applied, and what the binding Secret repeats of them. Secrets are read, not watched: only
//! Memcacheds with auth or TLS name any, and watching every Secret of the cluster would hold
//! them all in the operator's memory.

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use tracing::info;

use crate::api::Memcached;
use crate::error::{Error, Result};
use crate::resources::binding::Copied;
use crate::resources::{MANAGER_NAME, auth, is_controlled_by, tls};
use crate::status::{self, Blocked};

/// A Secret the pods will mount: the field that names it, and what memcached needs of it.
struct Mounted {
    name: String,
    field: &'static str,
    problem: fn(&Secret) -> Option<String>,
    /// What the binding repeats of it.
    copy: fn(&mut Copied, &Secret),
    /// The operator's own `<name>-auth`: created when missing, and must be ours.
    generated: bool,
    /// Issued by cert-manager (`spec.tls.issuerRef`): until it is, the pods wait for it
    /// rather than the Memcached being blocked.
    issued: bool,
}

/// The Secrets the pods will mount, as this pass read them (`None`: not there).
pub struct Mounts(Vec<(Mounted, Option<Secret>)>);

impl Mounts {
    /// `mc`'s Secrets as `there` has them, for plan tests.
    #[cfg(test)]
    pub fn as_if(mc: &Memcached, there: impl Fn(&str) -> Option<Secret>) -> Mounts {
        Mounts(
            mounted(mc)
                .into_iter()
                .map(|m| {
                    let secret = there(&m.name);
                    (m, secret)
                })
                .collect(),
        )
    }
}

/// What the pods' Secrets allow.
#[derive(Debug)]
pub enum Secrets {
    /// memcached can use them; what the binding repeats of them, the certificate Secret
    /// cert-manager has yet to issue, if any (the pods wait for it), and the credentials
    /// Secret to generate, if missing.
    Usable {
        copied: Copied,
        unissued: Option<String>,
        generate: Option<String>,
    },
    /// Why the pods cannot mount them.
    Unusable(Blocked),
}

fn mounted(mc: &Memcached) -> Vec<Mounted> {
    let generated = auth::generates_secret(mc);
    let auth = auth::secret_name(mc).map(|name| Mounted {
        name,
        field: if generated {
            "spec.auth"
        } else {
            "spec.auth.secretName"
        },
        problem: auth::credentials_problem,
        copy: Copied::take_credentials,
        generated,
        issued: false,
    });
    let issued = tls::issued(mc);
    let tls = [
        (
            tls::secret_name(mc),
            if issued {
                "spec.tls.issuerRef"
            } else {
                "spec.tls.secretName"
            },
            tls::certificate_problem as fn(&Secret) -> Option<String>,
            Copied::take_ca as fn(&mut Copied, &Secret),
            issued,
        ),
        (
            tls::client_ca_secret_name(mc).map(String::from),
            "spec.tls.clientCASecretName",
            tls::client_ca_problem,
            // The clients' CA is the server's business.
            |_, _| {},
            false,
        ),
    ]
    .into_iter()
    .filter_map(|(name, field, problem, copy, issued)| {
        Some(Mounted {
            name: name?,
            field,
            problem,
            copy,
            generated: false,
            issued,
        })
    });
    auth.into_iter().chain(tls).collect()
}

/// Reads the Secrets the pods will mount.
pub async fn read_mounted(client: &Client, mc: &Memcached) -> Result<Mounts> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &mc.namespace().unwrap_or_default());
    let mut read_all = Vec::new();
    for mounted in mounted(mc) {
        let secret = read(&api, &mounted.name).await?;
        read_all.push((mounted, secret));
    }
    Ok(Mounts(read_all))
}

/// Whether the pods can mount their Secrets, as read. A generated Secret that is missing is to
/// be created; an existing one is never rewritten (that would change the password). Pure.
pub fn judge(mc: &Memcached, mounts: &Mounts) -> Secrets {
    let (mut copied, mut unissued, mut generate) = (Copied::default(), None, None);
    for (mounted, secret) in &mounts.0 {
        let Mounted {
            name,
            field,
            problem,
            copy,
            generated,
            issued,
        } = mounted;
        let secret = match secret {
            Some(secret) => secret,
            // Not issued yet: the pods wait for it (the kubelet retries the mount).
            None if *issued => {
                unissued = Some(name.clone());
                continue;
            }
            None if *generated => {
                generate = Some(name.clone());
                continue;
            }
            None => {
                return Secrets::Unusable(Blocked::InvalidSecret {
                    message: format!("Secret {name} ({field}) not found"),
                });
            }
        };
        if *generated && !is_controlled_by(&secret.metadata, mc) {
            return Secrets::Unusable(Blocked::ResourceExists {
                message: status::named_conflict_message("Secret", name, mc),
            });
        }
        if let Some(problem) = problem(secret) {
            return Secrets::Unusable(Blocked::InvalidSecret {
                message: format!("{problem} ({field})"),
            });
        }
        copy(&mut copied, secret);
    }
    Secrets::Usable {
        copied,
        unissued,
        generate,
    }
}

/// Creates the credentials Secret `name` with a random password; what the binding repeats of
/// it goes into `copied`.
pub async fn generate(
    client: &Client,
    mc: &Memcached,
    name: &str,
    copied: &mut Copied,
) -> Result<()> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &mc.namespace().unwrap_or_default());
    if let Some(created) = create_credentials(&api, mc, name.to_string()).await? {
        Copied::take_credentials(copied, &created);
    }
    Ok(())
}

/// Secret `name`, if there is one.
pub async fn read(api: &Api<Secret>, name: &str) -> Result<Option<Secret>> {
    api.get_opt(name).await.map_err(|source| Error::Read {
        kind: "Secret".into(),
        name: name.into(),
        source,
    })
}

/// Creates `<name>-auth` with a random password; the Secret created, None if another pass
/// created it meanwhile.
async fn create_credentials(
    api: &Api<Secret>,
    mc: &Memcached,
    name: String,
) -> Result<Option<Secret>> {
    let desired = auth::generated_secret(mc, &auth::random_password());
    let params = PostParams {
        field_manager: Some(MANAGER_NAME.into()),
        ..PostParams::default()
    };
    match api.create(&params, &desired).await {
        Ok(created) => {
            info!(secret = %name, "created the credentials Secret");
            Ok(Some(created))
        }
        // Created meanwhile (by an earlier reconcile whose answer was lost): read on the next
        // pass.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(source) => Err(Error::Apply {
            kind: "Secret".into(),
            name,
            source,
        }),
    }
}
