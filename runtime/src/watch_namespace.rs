//! Which namespaces the operator watches (WATCH_NAMESPACE, set by OLM from the OperatorGroup's
//! target namespaces), and the `Api` for each of them.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::core::{DynamicResourceScope, NamespaceResourceScope};
use kube::{Api, Client, Resource};

/// All namespaces (AllNamespaces install), or a list of them (OwnNamespace, SingleNamespace,
/// MultiNamespace): one watch scope each, since RBAC is then granted per namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchNamespace {
    All,
    Namespaces(Vec<String>),
}

/// One watch scope: a single namespace, or the whole cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    Cluster,
    Namespace(String),
}

impl WatchNamespace {
    /// Parses WATCH_NAMESPACE: empty for all, one name, or a comma-separated list.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut namespaces: Vec<String> = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if !is_dns1123_label(name) {
                return Err(format!(
                    "{name:?} is not a valid namespace name (lowercase letters, digits and '-', at most 63)"
                ));
            }
            if !namespaces.iter().any(|n| n == name) {
                namespaces.push(name.to_string());
            }
        }
        Ok(if namespaces.is_empty() {
            Self::All
        } else {
            Self::Namespaces(namespaces)
        })
    }

    /// The scopes to run a watch set in.
    pub fn scopes(&self) -> Vec<Scope> {
        match self {
            Self::All => vec![Scope::Cluster],
            Self::Namespaces(list) => list.iter().cloned().map(Scope::Namespace).collect(),
        }
    }
}

/// Whether the API server serves `K` (its CRD is installed): a watch of a kind it does not
/// serve fails forever, so an optional kind is asked for first.
pub async fn served<K>(client: &Client) -> Result<bool, kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    match client.list_api_group_resources(&K::api_version(&())).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == K::plural(&()))),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error),
    }
}

/// The scopes where this process may not list or watch `K`. A watch it may not run would keep the
/// operator from ever being ready, so a kind it may not watch everywhere is one to do without
/// (an install whose RBAC predates it, or that leaves it out on purpose).
pub async fn forbidden_scopes<K>(
    client: &Client,
    scopes: &[Scope],
) -> Result<Vec<Scope>, kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut forbidden = Vec::new();
    for scope in scopes {
        for verb in ["list", "watch"] {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(K::group(&()).into_owned()),
                        resource: Some(K::plural(&()).into_owned()),
                        verb: Some(verb.into()),
                        namespace: match scope {
                            Scope::Cluster => None,
                            Scope::Namespace(ns) => Some(ns.clone()),
                        },
                        ..ResourceAttributes::default()
                    }),
                    ..SelfSubjectAccessReviewSpec::default()
                },
                ..SelfSubjectAccessReview::default()
            };
            let answer = reviews.create(&PostParams::default(), &review).await?;
            if !answer.status.is_some_and(|s| s.allowed) {
                forbidden.push(scope.clone());
                break;
            }
        }
    }
    Ok(forbidden)
}

impl Scope {
    /// The `Api` of a namespaced kind in this scope.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        match self {
            Self::Cluster => Api::all(client.clone()),
            Self::Namespace(ns) => Api::namespaced(client.clone(), ns),
        }
    }

    /// The `Api` of a kind known only at run time (an `ApiResource`), in this scope.
    pub fn api_with<K>(&self, client: &Client, dyntype: &K::DynamicType) -> Api<K>
    where
        K: Resource<Scope = DynamicResourceScope>,
    {
        match self {
            Self::Cluster => Api::all_with(client.clone(), dyntype),
            Self::Namespace(ns) => Api::namespaced_with(client.clone(), ns, dyntype),
        }
    }

    /// For logs: the namespace, or `*`.
    pub fn name(&self) -> &str {
        match self {
            Self::Cluster => "*",
            Self::Namespace(ns) => ns,
        }
    }
}

fn is_dns1123_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_namespace_covers_the_olm_install_modes() {
        assert_eq!(WatchNamespace::parse(""), Ok(WatchNamespace::All));
        assert_eq!(
            WatchNamespace::parse("team-a"),
            Ok(WatchNamespace::Namespaces(vec!["team-a".into()]))
        );
        assert_eq!(
            WatchNamespace::parse("a, b,a,"),
            Ok(WatchNamespace::Namespaces(vec!["a".into(), "b".into()]))
        );
        let err = WatchNamespace::parse("ok,Bad_NS").unwrap_err();
        assert!(err.contains("\"Bad_NS\""), "{err}");
    }

    #[test]
    fn each_listed_namespace_is_a_scope_of_its_own() {
        assert_eq!(WatchNamespace::All.scopes(), [Scope::Cluster]);
        assert_eq!(
            WatchNamespace::parse("a,b").unwrap().scopes(),
            [Scope::Namespace("a".into()), Scope::Namespace("b".into())]
        );
    }
}
