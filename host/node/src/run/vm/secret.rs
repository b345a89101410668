//! The node's runner identity kept in a Secret: the [`IdentityStore`] that
//! [`identity::load_or_create`](crate::callback::identity::load_or_create) reads and writes
//! (it decides, and handles two replicas writing at once). A replace names the
//! `resourceVersion` it read, so the API server refuses it when the Secret changed since.
//!
//! Nothing here logs, or puts in an error, the Secret's data.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};

use crate::callback::RunnerIdentity;
use crate::callback::identity::{
    Found, IdentityError, IdentityStore, ROTATE_ANNOTATION, StoreError, load_or_create as load,
};

/// Secret `name` of `api`'s namespace.
struct SecretStore<'a> {
    api: &'a Api<Secret>,
    name: &'a str,
}

fn to_data(data: BTreeMap<String, Vec<u8>>) -> BTreeMap<String, ByteString> {
    data.into_iter().map(|(k, v)| (k, ByteString(v))).collect()
}

fn store_error(e: kube::Error) -> StoreError {
    match e {
        kube::Error::Api(s) if s.code == 409 => StoreError::Conflict,
        e => StoreError::Failed(e.to_string()),
    }
}

impl IdentityStore for SecretStore<'_> {
    type Version = Secret;

    async fn read(&self) -> Result<Option<Found<Secret>>, StoreError> {
        let secret = self.api.get_opt(self.name).await.map_err(store_error)?;
        Ok(secret.map(|secret| Found {
            data: (secret.data.iter().flatten())
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect(),
            rotate: secret.annotations().contains_key(ROTATE_ANNOTATION),
            version: secret,
        }))
    }

    async fn create(&self, data: BTreeMap<String, Vec<u8>>) -> Result<(), StoreError> {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.name.to_owned()),
                labels: Some(labels()),
                ..ObjectMeta::default()
            },
            data: Some(to_data(data)),
            type_: Some("Opaque".into()),
            ..Secret::default()
        };
        let created = self.api.create(&PostParams::default(), &secret).await;
        created.map(drop).map_err(store_error)
    }

    async fn replace(
        &self,
        mut secret: Secret,
        data: BTreeMap<String, Vec<u8>>,
    ) -> Result<(), StoreError> {
        (secret.metadata.annotations)
            .get_or_insert_with(Default::default)
            .remove(ROTATE_ANNOTATION);
        secret.data = Some(to_data(data));
        let replaced = (self.api)
            .replace(self.name, &PostParams::default(), &secret)
            .await;
        replaced.map(drop).map_err(store_error)
    }
}

/// The identity kept in Secret `name` of `api`'s namespace, created on first start and
/// replaced when rotation is asked or its certificate is for another host than `tls_host`
/// (which asks for a self-signed callback certificate for that host in it).
pub async fn load_or_create(
    api: &Api<Secret>,
    name: &str,
    tls_host: Option<&str>,
) -> anyhow::Result<RunnerIdentity> {
    let loaded = load(&SecretStore { api, name }, tls_host).await;
    let hint = match &loaded {
        Err(IdentityError::Invalid { .. }) => {
            ": delete it to make a new one (its runners are then replaced)"
        }
        _ => "",
    };
    loaded.with_context(|| format!("runner identity Secret {name}{hint}"))
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_owned(),
        "neocloud-node".to_owned(),
    )])
}
