//! What the HTTP adapters share that is not HTTP: matching offered GPUs against an
//! [`OfferQuery`], reading the specification's environment variables, the configuration error,
//! per-name create serialisation, and `Debug` that keeps request secrets out ([`EnvNames`],
//! [`redacted`]).
//!
//! Not wire formats (each adapter's `wire` module) and not classification (each `errors`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use neocloud_core::{CapacityType, GpuModel, OfferQuery};

use crate::http::ApiKey;

/// An environment for `Debug`: the names, each value `<redacted>` (the runner's bootstrap token
/// and credential travel there, and Pod env values may be secrets).
pub(crate) struct EnvNames<'a>(pub &'a BTreeMap<String, String>);

impl fmt::Debug for EnvNames<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = self.0.keys().map(|name| (name, "<redacted>"));
        f.debug_map().entries(redacted).finish()
    }
}

/// `<redacted>` for a value that is there (cloud-init `user_data` carries the runner's secrets).
pub(crate) fn redacted<T>(value: &Option<T>) -> Option<&'static str> {
    value.as_ref().map(|_| "<redacted>")
}

/// Why an adapter could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is unset or empty.
    #[error("failed to configure {provider}: {variable} is not set ({hint})")]
    MissingVariable {
        /// Provider name.
        provider: &'static str,
        /// The environment variable.
        variable: &'static str,
        /// What to put there.
        hint: &'static str,
    },
    /// A value is present but unusable.
    #[error("failed to configure {provider}: {message}")]
    Invalid {
        /// Provider name.
        provider: &'static str,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The HTTP client could not be built.
    #[error("failed to configure {provider}: cannot build the http client: {source}")]
    Client {
        /// Provider name.
        provider: &'static str,
        /// The reqwest error.
        #[source]
        source: reqwest::Error,
    },
}

/// A non-empty environment variable.
pub(crate) fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The API key in `variable`, or the error naming the variable and what to put there.
pub(crate) fn env_key(
    provider: &'static str,
    variable: &'static str,
    hint: &'static str,
) -> Result<ApiKey, ConfigError> {
    let key = env_var(variable).ok_or(ConfigError::MissingVariable {
        provider,
        variable,
        hint,
    })?;
    Ok(ApiKey::new(key))
}

/// Whether an offered GPU is one the query asks for (any GPU when the query names none).
pub(crate) fn wants_gpu(query: &OfferQuery, offered: &GpuModel) -> bool {
    query.gpu_models.is_empty()
        || query
            .gpu_models
            .iter()
            .flat_map(|name| GpuModel::accepted_by_name(name))
            .any(|accepted| accepted.accepts(offered))
}

/// Whether the query's GPU count (0 = any) allows `count`.
pub(crate) fn wants_count(query: &OfferQuery, count: u32) -> bool {
    query.gpu_count == 0 || query.gpu_count == count
}

/// Whether the query wants on-demand and spot offers, in that order.
pub(crate) fn wants_capacity(query: &OfferQuery) -> (bool, bool) {
    match query.capacity {
        None | Some(CapacityType::Any) => (true, true),
        Some(CapacityType::OnDemand) => (true, false),
        Some(CapacityType::Spot) => (false, true),
    }
}

/// Serialises creates per external name inside one adapter, so two concurrent creates of one
/// name cannot both rent.
#[derive(Debug, Default)]
pub(crate) struct NameLocks {
    held: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Held while a create for one name runs.
#[derive(Debug)]
pub(crate) struct NameGuard<'a> {
    locks: &'a NameLocks,
    name: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl NameLocks {
    /// Waits until no other create for `name` runs in this adapter.
    pub async fn lock(&self, name: &str) -> NameGuard<'_> {
        let mutex = self.held.lock().entry(name.to_owned()).or_default().clone();
        let guard = mutex.lock_owned().await;
        NameGuard {
            locks: self,
            name: name.to_owned(),
            guard: Some(guard),
        }
    }
}

impl Drop for NameGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock();
        drop(self.guard.take());
        if held
            .get(&self.name)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            held.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn debug_of_request_secrets_shows_names_and_redacted_only() {
        let env = BTreeMap::from([(
            "NEOCLOUD_BOOTSTRAP_TOKEN".to_owned(),
            "bt-secret".to_owned(),
        )]);
        let shown = format!("{:?}", EnvNames(&env));
        assert_eq!(shown, r#"{"NEOCLOUD_BOOTSTRAP_TOKEN": "<redacted>"}"#);
        let config = crate::lambda::LambdaConfig {
            user_data: Some("#cloud-config\n# token bt-secret".into()),
            ..crate::lambda::LambdaConfig::new(ApiKey::new("sk-secret"), "key")
        };
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("bt-secret") && !shown.contains("sk-secret"),
            "{shown}"
        );
        assert!(
            shown.contains(r#"user_data: Some("<redacted>")"#),
            "{shown}"
        );
        assert_eq!(redacted(&None::<String>), None);
    }

    fn query(models: &[&str], count: u32) -> OfferQuery {
        OfferQuery {
            gpu_models: models.iter().map(|m| (*m).to_owned()).collect(),
            gpu_count: count,
            capacity: None,
        }
    }

    #[test]
    fn a_family_name_matches_every_variant_and_nothing_else() {
        let q = query(&["A100"], 1);
        assert!(wants_gpu(
            &q,
            &GpuModel::from_provider("A100 SXM4", Some(80))
        ));
        assert!(!wants_gpu(&q, &GpuModel::from_provider("NVIDIA A40", None)));
        assert!(wants_gpu(
            &query(&[], 0),
            &GpuModel::from_provider("anything", None)
        ));
    }

    #[test]
    fn count_zero_means_any_count() {
        assert!(wants_count(&query(&[], 0), 8));
        assert!(!wants_count(&query(&[], 1), 8));
    }

    #[tokio::test]
    async fn a_second_create_of_one_name_waits_for_the_first_and_the_lock_is_then_forgotten() {
        let locks = NameLocks::default();
        let first = locks.lock("nc-1").await;
        let other = locks.lock("nc-2").await;
        let waiting = tokio::time::timeout(Duration::from_millis(50), locks.lock("nc-1")).await;
        assert!(waiting.is_err(), "a second lock of one name must wait");
        drop(first);
        drop(other);
        let again = locks.lock("nc-1").await;
        drop(again);
        assert!(locks.held.lock().is_empty());
    }
}
