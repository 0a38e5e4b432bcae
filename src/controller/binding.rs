//! Keeps the binding Secret (`spec.binding`). Read, not watched, like the Secrets the pods
//! mount (watching Secrets would hold every Secret of the cluster in memory): written when what
//! it holds differs from what it should, deleted once the spec turns it off, which the status's
//! `binding` remembers.

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use tracing::info;

use super::ensure::only_this;
use super::secrets;
use crate::api::Memcached;
use crate::error::{Error, Result};
use crate::resources::binding::{self, Copied};
use crate::resources::{MANAGER_NAME, is_controlled_by};
use crate::status::{self, Blocked};

/// The binding Secret's name as the status reports it.
pub fn reported(mc: &Memcached) -> Option<String> {
    Some(mc.status.as_ref()?.binding.as_ref()?.name.clone())
}

/// Makes the binding Secret what the spec wants, for the Secrets the pods mount as read: its name while the Memcached has one,
/// or why it cannot.
pub async fn ensure(
    client: &Client,
    mc: &Memcached,
    copied: &Copied,
) -> Result<std::result::Result<Option<String>, Blocked>> {
    match binding::secret(mc, copied) {
        Some(desired) => Ok(match keep(client, mc, Some(&desired)).await {
            Ok(None) => Ok(desired.metadata.name),
            Ok(Some(why)) => Err(why),
            // Refused for good (RBAC, a policy): reported, as the other objects' refusals are.
            Err(error) => Err(Blocked::refused(error)?),
        }),
        // Wanted, but generated credentials not read yet: as it was.
        None if binding::enabled(mc) => Ok(Ok(reported(mc))),
        None => {
            keep(client, mc, None).await?;
            Ok(Ok(None))
        }
    }
}

/// Makes the binding Secret `desired` (none: deleted if ours); why not, if someone else holds
/// its name.
async fn keep(
    client: &Client,
    mc: &Memcached,
    desired: Option<&Secret>,
) -> Result<Option<Blocked>> {
    if desired.is_none() && reported(mc).is_none() {
        return Ok(None);
    }
    let name = binding::secret_name(mc);
    let api: Api<Secret> = Api::namespaced(client.clone(), &mc.namespace().unwrap_or_default());
    let existing = secrets::read(&api, &name).await?;
    if let Some(existing) = &existing
        && !is_controlled_by(&existing.metadata, mc)
    {
        // Asked for: reported. No longer asked for: not ours to delete.
        return Ok(desired.map(|_| Blocked::ResourceExists {
            message: status::named_conflict_message("Secret", &name, mc),
        }));
    }
    let applied = |source| Error::Apply {
        kind: "Secret".into(),
        name: name.clone(),
        source,
    };
    match (desired, existing) {
        (Some(desired), existing) => {
            if existing.is_some_and(|e| e.data == desired.data && e.type_ == desired.type_) {
                return Ok(None);
            }
            let params = PatchParams::apply(MANAGER_NAME).force();
            api.patch(&name, &params, &Patch::Apply(desired))
                .await
                .map_err(applied)?;
            info!(secret = %name, "wrote the binding Secret");
        }
        (None, Some(existing)) => {
            match api.delete(&name, &only_this(existing.uid())).await {
                Ok(_) => info!(secret = %name, "deleted the binding Secret"),
                // Gone, or replaced by another since the read: not ours to delete.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(source) => return Err(applied(source)),
            }
        }
        (None, None) => {}
    }
    Ok(None)
}
