//! What the three HTTP adapters do the same way: building their client from a config (refusing
//! an empty key), reading a JSON answer, treating 404 as absent on reads and as done on deletes,
//! the create that is idempotent by name (serialised per name, an existing instance returned,
//! the name looked up again after an unknown outcome), and a `Debug` that shows no secret.
//!
//! Not wire formats or error classification: each adapter passes its own `errors` function as a
//! [`Classify`], and keeps its own paths, pagination and rental bodies.

use std::fmt;
use std::future::Future;

use neocloud_core::{InstanceState, ProviderId};
use reqwest::{Client, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;

use crate::common::{ConfigError, NameLocks};
use crate::http::{ApiKey, Call, Http, HttpConfig, Reply, Safety};
use crate::provider::{Provider, ProviderError};

/// How an adapter turns a non-2xx answer into a classified error (each adapter's `errors`).
pub(crate) type Classify = fn(&Http, Call<'_>, &Reply) -> ProviderError;

/// The HTTP client of `provider`'s adapter; an empty key or a client that cannot be built is a
/// configuration error naming the provider.
pub(crate) fn client(
    provider: ProviderId,
    base_url: &str,
    key: &ApiKey,
    config: &HttpConfig,
) -> Result<Http, ConfigError> {
    let name = provider.as_str();
    if key.is_empty() {
        let message = "api_key is empty".to_owned();
        return Err(ConfigError::Invalid {
            provider: name,
            message,
        });
    }
    Http::new(provider, base_url, key.clone(), config.clone()).map_err(|source| {
        ConfigError::Client {
            provider: name,
            source,
        }
    })
}

/// An adapter's `Debug`: its type name and HTTP client (base URL, redacted key, budget), to
/// which the adapter may add fields that hold no secret.
pub(crate) fn debug<'a, 'b>(
    f: &'a mut fmt::Formatter<'b>,
    name: &str,
    http: &Http,
) -> fmt::DebugStruct<'a, 'b> {
    let mut out = f.debug_struct(name);
    out.field("http", http);
    out
}

impl Http {
    /// Sends the request `build` makes and parses a 2xx answer as `T`; any other status is an
    /// error from `classify`.
    pub(crate) async fn json<T, F>(
        &self,
        call: Call<'_>,
        safety: Safety,
        classify: Classify,
        build: F,
    ) -> Result<T, ProviderError>
    where
        T: DeserializeOwned,
        F: Fn(&Client) -> RequestBuilder,
    {
        let reply = self.send(call, safety, build).await?;
        if !reply.status.is_success() {
            return Err(classify(self, call, &reply));
        }
        self.decode(call, &reply)
    }

    /// `GET path` (retried where safe), parsed as `T`.
    pub(crate) async fn get_json<T: DeserializeOwned>(
        &self,
        call: Call<'_>,
        path: &str,
        classify: Classify,
    ) -> Result<T, ProviderError> {
        let url = self.url(path);
        self.json(call, Safety::Retryable, classify, |c| c.get(&url))
            .await
    }

    /// A read (retried where safe) whose 404 means the thing does not exist.
    pub(crate) async fn optional<T, F>(
        &self,
        call: Call<'_>,
        classify: Classify,
        build: F,
    ) -> Result<Option<T>, ProviderError>
    where
        T: DeserializeOwned,
        F: Fn(&Client) -> RequestBuilder,
    {
        let reply = self.send(call, Safety::Retryable, build).await?;
        match reply.status {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => self.decode(call, &reply).map(Some),
            _ => Err(classify(self, call, &reply)),
        }
    }

    /// A delete (retried where safe) that is done on a 2xx or when the thing is already gone.
    pub(crate) async fn remove<F>(
        &self,
        call: Call<'_>,
        classify: Classify,
        build: F,
    ) -> Result<(), ProviderError>
    where
        F: Fn(&Client) -> RequestBuilder,
    {
        let reply = self.send(call, Safety::Retryable, build).await?;
        match reply.status {
            s if s.is_success() || s == StatusCode::NOT_FOUND => Ok(()),
            _ => Err(classify(self, call, &reply)),
        }
    }
}

/// A create that is idempotent by `name`: waits until no other create of the name runs in this
/// adapter, returns the live instance already under the name, else runs `check` and then
/// `rent`; when the rental's outcome is unknown (timeout, 5xx, unreadable answer) the name is
/// looked up again, so a rental whose answer was lost is found instead of repeated.
pub(crate) async fn create_once<P, C, R>(
    provider: &P,
    locks: &NameLocks,
    name: &str,
    check: C,
    rent: R,
) -> Result<InstanceState, ProviderError>
where
    P: Provider + ?Sized,
    C: Future<Output = Result<(), ProviderError>>,
    R: Future<Output = Result<InstanceState, ProviderError>>,
{
    let _serialised = locks.lock(name).await;
    if let Some(existing) = provider.find_by_name(name).await? {
        return Ok(existing);
    }
    check.await?;
    match rent.await {
        Err(error) if error.class.outcome_unknown() => recover(provider, name, error).await,
        other => other,
    }
}

/// After an unknown outcome: the instance if the name exists now, else the original error.
async fn recover<P: Provider + ?Sized>(
    provider: &P,
    name: &str,
    error: ProviderError,
) -> Result<InstanceState, ProviderError> {
    let id = provider.id();
    match provider.find_by_name(name).await {
        Ok(Some(found)) => {
            tracing::info!(provider = %id, name, id = %found.id, class = %error.class, "recovered a create whose answer was lost");
            Ok(found)
        }
        Ok(None) => Err(error),
        Err(lookup) => {
            tracing::warn!(provider = %id, name, error = %lookup, "lookup by name after an unknown create outcome failed");
            Err(error)
        }
    }
}
