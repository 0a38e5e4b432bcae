//! With `spec.auth`: the credentials Secret the pods mount exists and memcached can use it,
//! before a pod template that mounts it is applied. Secrets are read, not watched: only the
//! Memcacheds with authentication need one, and watching every Secret of the cluster would
//! hold them all in the operator's memory.

use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use tracing::info;

use super::context::Context;
use crate::api::Memcached;
use crate::error::{Error, Result};
use crate::resources::{MANAGER_NAME, auth, is_controlled_by};
use crate::status::{self, Blocked};

/// Why the pods cannot mount the credentials, if they cannot. A generated Secret that is
/// missing is created; an existing one is never rewritten (that would change the password).
pub async fn ensure(ctx: &Context, mc: &Memcached) -> Result<Option<Blocked>> {
    let Some(name) = auth::secret_name(mc) else {
        return Ok(None);
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &mc.namespace().unwrap_or_default());
    let read_error = |source| Error::Read {
        kind: "Secret".into(),
        name: name.clone(),
        source,
    };
    let generated = auth::generates_secret(mc);
    let secret = match api.get_opt(&name).await.map_err(read_error)? {
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
