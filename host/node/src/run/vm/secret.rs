//! Reads the node's runner identity from its Secret, creating it on first start and replacing
//! it when [`plan`] says so, safely when two replicas do it at once: a create that finds the
//! Secret already there, or a replace that finds it changed, reads it again and uses what won.
//!
//! Not the decisions (see [`crate::callback::identity`]); and nothing here logs, or puts in an
//! error, the Secret's data.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};

use crate::callback::RunnerIdentity;
use crate::callback::identity::{Plan, ROTATE_ANNOTATION, Stored, plan};

/// How many read-decide-write rounds to try before giving up (each lost race costs one).
const ROUNDS: usize = 4;

fn data_of(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

fn to_data(identity: &RunnerIdentity) -> BTreeMap<String, ByteString> {
    identity
        .to_data()
        .into_iter()
        .map(|(k, v)| (k, ByteString(v)))
        .collect()
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The identity kept in Secret `name` of `api`'s namespace (see the module doc). `tls_host`
/// asks for a self-signed callback certificate for that host in it.
pub async fn load_or_create(
    api: &Api<Secret>,
    name: &str,
    tls_host: Option<&str>,
) -> anyhow::Result<RunnerIdentity> {
    let what = || format!("runner identity Secret {name}");
    for _ in 0..ROUNDS {
        let existing = api
            .get_opt(name)
            .await
            .with_context(|| format!("failed to read the {}", what()))?;
        let data = existing.as_ref().map(data_of);
        let stored = existing
            .as_ref()
            .zip(data.as_ref())
            .map(|(s, data)| Stored {
                data,
                rotate: s.annotations().contains_key(ROTATE_ANNOTATION),
            });
        let decided = plan(stored, tls_host).with_context(|| {
            format!(
                "{}: delete it to make a new one (its runners are then replaced)",
                what()
            )
        })?;
        let written = match decided {
            Plan::Use(identity) => {
                tracing::info!(
                    secret = name,
                    key_id = identity.keys().key_id(),
                    "runner identity loaded"
                );
                return Ok(identity);
            }
            Plan::Create(identity) => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(name.to_owned()),
                        labels: Some(labels()),
                        ..ObjectMeta::default()
                    },
                    data: Some(to_data(&identity)),
                    type_: Some("Opaque".into()),
                    ..Secret::default()
                };
                api.create(&PostParams::default(), &secret).await
            }
            Plan::Replace { identity, why } => {
                let mut secret = existing.unwrap_or_default();
                secret
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .remove(ROTATE_ANNOTATION);
                secret.data = Some(to_data(&identity));
                tracing::warn!(
                    secret = name,
                    why,
                    "replacing the runner identity: runners of earlier keys will be refused"
                );
                api.replace(name, &PostParams::default(), &secret).await
            }
        };
        match written {
            // Read back: what is stored is what every replica uses.
            Ok(_) => {}
            Err(e) if is_conflict(&e) => tracing::info!(
                secret = name,
                "runner identity written by another replica; reading it"
            ),
            Err(e) => return Err(e).with_context(|| format!("failed to write the {}", what())),
        }
    }
    bail!("{}: still changing after {ROUNDS} tries", what())
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_owned(),
        "neocloud-node".to_owned(),
    )])
}
