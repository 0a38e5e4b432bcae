//! The Secrets the pods will mount (`spec.auth`'s credentials, `spec.tls`'s certificate and
//! client CA) exist and memcached can use them, before a pod template that mounts them is
//! applied. Secrets are read, not watched: only Memcacheds with auth or TLS name any, and
//! watching every Secret of the cluster would hold them all in the operator's memory.

use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use tracing::info;

use super::context::Context;
use crate::api::Memcached;
use crate::error::{Error, Result};
use crate::resources::{MANAGER_NAME, auth, is_controlled_by, tls};
use crate::status::{self, Blocked};

/// Why the pods cannot mount their Secrets, if they cannot.
pub async fn check(ctx: &Context, mc: &Memcached) -> Result<Option<Blocked>> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &mc.namespace().unwrap_or_default());
    if let Some(blocked) = credentials(&api, mc).await? {
        return Ok(Some(blocked));
    }
    let tls_secrets = [
        (
            tls::secret_name(mc),
            "spec.tls.secretName",
            tls::certificate_problem as fn(&Secret) -> Option<String>,
        ),
        (
            tls::client_ca_secret_name(mc),
            "spec.tls.clientCASecretName",
            tls::client_ca_problem,
        ),
    ];
    for (name, field, problem) in tls_secrets {
        let Some(name) = name else { continue };
        let blocked = match read(&api, name).await? {
            None => Some(format!("Secret {name} ({field}) not found")),
            Some(secret) => problem(&secret).map(|p| format!("{p} ({field})")),
        };
        if let Some(message) = blocked {
            return Ok(Some(Blocked::InvalidSecret { message }));
        }
    }
    Ok(None)
}

async fn read(api: &Api<Secret>, name: &str) -> Result<Option<Secret>> {
    api.get_opt(name).await.map_err(|source| Error::Read {
        kind: "Secret".into(),
        name: name.into(),
        source,
    })
}

/// With `spec.auth`: a generated Secret that is missing is created; an existing one is never
/// rewritten (that would change the password).
async fn credentials(api: &Api<Secret>, mc: &Memcached) -> Result<Option<Blocked>> {
    let Some(name) = auth::secret_name(mc) else {
        return Ok(None);
    };
    let generated = auth::generates_secret(mc);
    let secret = match read(api, &name).await? {
        Some(secret) => secret,
        None if generated => {
            let desired = auth::generated_secret(mc, &auth::random_password());
            let params = PostParams {
                field_manager: Some(MANAGER_NAME.into()),
                ..PostParams::default()
            };
            return match api.create(&params, &desired).await {
                Ok(_) => {
                    info!(secret = %name, "created the credentials Secret");
                    Ok(None)
                }
                // Created meanwhile (by an earlier reconcile whose answer was lost): read it
                // on the next pass.
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
                Err(source) => Err(Error::Apply {
                    kind: "Secret".into(),
                    name,
                    source,
                }),
            };
        }
        None => {
            return Ok(Some(Blocked::InvalidSecret {
                message: format!("Secret {name} (spec.auth.secretName) not found"),
            }));
        }
    };
    if generated && !is_controlled_by(&secret.metadata, mc) {
        return Ok(Some(Blocked::ResourceExists {
            message: status::conflict_message("Secret", mc).replacen(
                &format!("/{}", mc.name_any()),
                &format!("/{name}"),
                1,
            ),
        }));
    }
    Ok(
        auth::credentials_problem(&secret).map(|message| Blocked::InvalidSecret {
            message: format!("{message} (spec.auth)"),
        }),
    )
}
