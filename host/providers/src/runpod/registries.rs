//! RunPod registry credentials (`/v2/registries`): the login a pod pulls a private image with.
//! Each rental that needs one gets its own, named by the rental's external name (so it carries
//! the cluster's prefix and the sweeper finds it), and loses it when the pod is deleted.
//!
//! Not for deciding which login an image needs (the node reads the Pod's `imagePullSecrets`).
//! Credentials are write-only at RunPod: nothing here reads a password back, and no message
//! carries one.

use neocloud_core::RegistryCredential;

use super::errors::rest_error;
use super::wire::{CreateRegistry, Registry, RegistryList};
use crate::http::{Call, Http, Safety};
use crate::provider::{Operation, ProviderError};

/// Every registry credential of the account.
pub(crate) async fn list(http: &Http, call: Call<'_>) -> Result<Vec<Registry>, ProviderError> {
    let list: RegistryList = http.get_json(call, "/v2/registries", rest_error).await?;
    Ok(list.into_vec())
}

/// Deletes one credential; one already gone is success.
pub(crate) async fn delete(http: &Http, id: &str) -> Result<(), ProviderError> {
    let call = Call::new(Operation::Credential, Some(id));
    let url = http.url(&format!(
        "/v2/registries/{}",
        super::adapter::url_escape(id)
    ));
    http.remove(call, rest_error, |c| c.delete(&url)).await
}

/// Deletes every credential named `name` (what a rental of that name made).
pub(crate) async fn delete_named(http: &Http, name: &str) -> Result<(), ProviderError> {
    let call = Call::new(Operation::Credential, Some(name));
    for registry in list(http, call).await?.iter().filter(|r| r.name == name) {
        delete(http, &registry.id).await?;
    }
    Ok(())
}

/// A fresh credential named `name` holding `login`, and its id. One left under the name by an
/// earlier attempt of the same rental is replaced (its login may be stale, and RunPod's names
/// are unique).
pub(crate) async fn replace(
    http: &Http,
    name: &str,
    login: &RegistryCredential,
) -> Result<String, ProviderError> {
    delete_named(http, name).await?;
    let call = Call::new(Operation::Credential, Some(name));
    let body = CreateRegistry {
        name,
        username: &login.username,
        password: &login.password,
    };
    let url = http.url("/v2/registries");
    let made: Registry = http
        .json(call, Safety::CreateOnce, rest_error, |c| {
            c.post(&url).json(&body)
        })
        .await?;
    Ok(made.id)
}
