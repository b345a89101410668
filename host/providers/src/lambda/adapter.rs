//! The Lambda Cloud adapter: offers from `/instance-types`, launch with our name, a name tag,
//! exactly one configured SSH key and the configured cloud-init `user_data`, get, list,
//! terminate. Before each launch it checks `/instance-types` for capacity in the region (launch
//! is rate-limited, so a doomed launch is never sent) and waits for the client-side launch
//! interval. Creates are idempotent by name; after a timeout or 5xx the name is looked up again.
//!
//! Not SSH key management, file systems or firewall rules.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use neocloud_core::{FailureClass, InstanceState, Offer, OfferQuery, ProviderId};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::config::LambdaConfig;
use super::convert::{self, NAME_TAG};
use super::errors::{self, INSUFFICIENT_CAPACITY};
use super::wire::{Data, Instance, InstanceTypes, Launch, Launched, SshKey, Tag, Terminate};
use crate::adapter;
use crate::common::{ConfigError, NameLocks, wants_capacity};
use crate::http::{Call, Http, Safety};
use crate::provider::{CreateRequest, Operation, Provider, ProviderError};

/// Spaces launches: one starts no sooner than `interval` after the previous launch's answer
/// arrived, so however long requests spend in transit, two launches never reach Lambda less than
/// `interval` apart. Shared by every caller of one adapter.
#[derive(Debug)]
struct LaunchLimiter {
    interval: Duration,
    turn: tokio::sync::Mutex<()>,
    next: std::sync::Mutex<Option<Instant>>,
}

impl LaunchLimiter {
    fn new(interval: Duration) -> LaunchLimiter {
        LaunchLimiter {
            interval,
            turn: tokio::sync::Mutex::new(()),
            next: std::sync::Mutex::new(None),
        }
    }

    /// Waits for this caller's turn; hold the guard until [`LaunchLimiter::answered`].
    async fn wait_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        let turn = self.turn.lock().await;
        if let Some(at) = self.next_at() {
            tokio::time::sleep_until(at).await;
        }
        turn
    }

    /// The launch just sent has been answered (or failed): the next waits a full interval.
    fn answered(&self) {
        self.set_next(Instant::now() + self.interval);
    }

    /// How long a launch starting now would wait.
    fn wait(&self) -> Option<Duration> {
        let left = self.next_at()?.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    fn next_at(&self) -> Option<Instant> {
        *self
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_next(&self, at: Instant) {
        *self
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(at);
    }
}

/// Lambda Cloud virtual machines.
pub struct LambdaProvider {
    http: Http,
    config: LambdaConfig,
    limiter: LaunchLimiter,
    locks: NameLocks,
}

impl fmt::Debug for LambdaProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        adapter::debug(f, "LambdaProvider", &self.http)
            .field("ssh_key_name", &self.config.ssh_key_name)
            .finish()
    }
}

impl LambdaProvider {
    /// An adapter for `config`.
    pub fn new(config: LambdaConfig) -> Result<LambdaProvider, ConfigError> {
        let http = adapter::client(
            ProviderId::Lambda,
            &config.base_url,
            &config.api_key,
            &config.http,
        )?;
        if config.ssh_key_name.trim().is_empty() {
            let message =
                "ssh_key_name is empty; lambda requires exactly one ssh key per launch".to_owned();
            return Err(ConfigError::Invalid {
                provider: "lambda",
                message,
            });
        }
        let limiter = LaunchLimiter::new(Duration::from_millis(config.launch_interval_ms));
        Ok(LambdaProvider {
            http,
            config,
            limiter,
            locks: NameLocks::default(),
        })
    }

    /// An adapter configured from the environment (see [`LambdaConfig::from_env`]).
    pub fn from_env() -> Result<LambdaProvider, ConfigError> {
        LambdaProvider::new(LambdaConfig::from_env()?)
    }

    async fn get_json<T: DeserializeOwned>(
        &self,
        call: Call<'_>,
        path: &str,
    ) -> Result<T, ProviderError> {
        let data: Data<T> = self.http.get_json(call, path, errors::error).await?;
        Ok(data.data)
    }

    async fn instances(&self, call: Call<'_>) -> Result<Vec<InstanceState>, ProviderError> {
        let all: Vec<Instance> = self.get_json(call, "/instances").await?;
        Ok(all
            .iter()
            .map(convert::state)
            .filter(convert::is_live)
            .collect())
    }

    /// Refuses a launch that `/instance-types` says cannot succeed, naming where it could.
    async fn check_capacity(
        &self,
        call: Call<'_>,
        kind: &str,
        region: &str,
    ) -> Result<(), ProviderError> {
        let types: InstanceTypes = self.get_json(call, "/instance-types").await?;
        let Some(entry) = types.get(kind) else {
            let message = format!("instance type {kind} does not exist");
            return Err(self
                .http
                .error(call, FailureClass::InvalidRequest, message)
                .with_code("global/object-does-not-exist"));
        };
        let regions: Vec<&str> = entry
            .regions_with_capacity_available
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        if regions.contains(&region) {
            return Ok(());
        }
        let message = format!(
            "no {kind} capacity in {region}; regions with capacity available: {}",
            regions.join(", ")
        );
        Err(self
            .http
            .error(call, FailureClass::Capacity, message)
            .with_code(INSUFFICIENT_CAPACITY))
    }

    async fn launch(
        &self,
        request: &CreateRequest,
        kind: &str,
        region: &str,
    ) -> Result<InstanceState, ProviderError> {
        let name = &request.external_name;
        let call = Call::new(Operation::Create, Some(name));
        let body = self.launch_body(request, kind, region);
        let url = self.http.url("/instance-operations/launch");
        // The HTTP layer sends a launch answered 429 again after its Retry-After (nothing was
        // launched), within this turn: the caller's attempt is not spent on it.
        let reply = {
            let _turn = self.limiter.wait_turn().await;
            let sent = self
                .http
                .send(call, Safety::CreateOnce, |c| c.post(&url).json(&body))
                .await;
            self.limiter.answered();
            sent?
        };
        if !reply.status.is_success() {
            return Err(errors::error(&self.http, call, &reply));
        }
        let launched: Data<Launched> = self.http.decode(call, &reply)?;
        let id = launched
            .data
            .instance_ids
            .into_iter()
            .next()
            .unwrap_or_default();
        match self.get(&id).await {
            Ok(Some(state)) => Ok(state),
            _ => Err(self.http.error(
                call,
                FailureClass::Transient,
                format!("instance {id} was launched but cannot be read"),
            )),
        }
    }

    fn launch_body(&self, request: &CreateRequest, kind: &str, region: &str) -> Launch {
        let name = &request.external_name;
        Launch {
            region_name: region.to_owned(),
            instance_type_name: kind.to_owned(),
            ssh_key_names: vec![self.config.ssh_key_name.clone()],
            name: name.clone(),
            user_data: request
                .boot
                .as_ref()
                .map(|b| b.user_data.clone())
                .or_else(|| self.config.user_data.clone()),
            tags: vec![Tag {
                key: NAME_TAG.to_owned(),
                value: name.clone(),
            }],
        }
    }

    fn check_request(
        &self,
        call: Call<'_>,
        request: &CreateRequest,
    ) -> Result<(String, String), ProviderError> {
        let name = &request.external_name;
        if name.is_empty() || name.chars().count() > 64 {
            let message = format!(
                "instance names must have 1 to 64 characters, {name:?} has {}",
                name.chars().count()
            );
            return Err(self.http.error(call, FailureClass::InvalidRequest, message));
        }
        match convert::parse_offer_id(&request.offer.id) {
            Some((kind, region)) => Ok((kind.to_owned(), region.to_owned())),
            None => {
                let message = format!(
                    "offer id {} is not a lambda offer (instanceType/region)",
                    request.offer.id
                );
                Err(self.http.error(call, FailureClass::InvalidRequest, message))
            }
        }
    }
}

#[async_trait]
impl Provider for LambdaProvider {
    fn id(&self) -> ProviderId {
        ProviderId::Lambda
    }

    fn create_wait(&self) -> Option<(Duration, String)> {
        let why = format!(
            "lambda's launch spacing (one launch per {} s)",
            self.limiter.interval.as_secs_f64()
        );
        self.limiter.wait().map(|d| (d, why))
    }

    async fn list_offers(&self, query: &OfferQuery) -> Result<Vec<Offer>, ProviderError> {
        if !wants_capacity(query).0 {
            return Ok(Vec::new());
        }
        let call = Call::new(Operation::ListOffers, None);
        let types: InstanceTypes = self.get_json(call, "/instance-types").await?;
        Ok(types
            .values()
            .flat_map(|entry| convert::offers(entry, query))
            .collect())
    }

    async fn create(&self, request: &CreateRequest) -> Result<InstanceState, ProviderError> {
        let name = request.external_name.as_str();
        let call = Call::new(Operation::Create, Some(name));
        let (kind, region) = self.check_request(call, request)?;
        let check = self.check_capacity(call, &kind, &region);
        let launch = self.launch(request, &kind, &region);
        adapter::create_once(self, &self.locks, name, check, launch).await
    }

    async fn get(&self, id: &str) -> Result<Option<InstanceState>, ProviderError> {
        let call = Call::new(Operation::Get, Some(id));
        if id.is_empty() || id.contains('/') {
            return Ok(None);
        }
        let url = self.http.url(&format!("/instances/{id}"));
        let found: Option<Data<Instance>> = self
            .http
            .optional(call, errors::error, |c| c.get(&url))
            .await?;
        Ok(found.map(|d| convert::state(&d.data)))
    }

    async fn find_by_name(
        &self,
        external_name: &str,
    ) -> Result<Option<InstanceState>, ProviderError> {
        let call = Call::new(Operation::FindByName, Some(external_name));
        let live = self.instances(call).await?;
        Ok(live.into_iter().find(|s| s.external_name == external_name))
    }

    async fn list_ours(&self, prefix: &str) -> Result<Vec<InstanceState>, ProviderError> {
        let call = Call::new(Operation::ListOurs, Some(prefix));
        let live = self.instances(call).await?;
        Ok(live
            .into_iter()
            .filter(|s| s.external_name.starts_with(prefix))
            .collect())
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let call = Call::new(Operation::Delete, Some(id));
        if id.is_empty() || id.contains('/') {
            return Ok(());
        }
        let body = Terminate {
            instance_ids: vec![id.to_owned()],
        };
        let url = self.http.url("/instance-operations/terminate");
        self.http
            .remove(call, errors::error, |c| c.post(&url).json(&body))
            .await
    }

    async fn health(&self) -> Result<(), ProviderError> {
        let call = Call::new(Operation::Health, None);
        let keys: Vec<SshKey> = self.get_json(call, "/ssh-keys").await?;
        if keys.iter().any(|k| k.name == self.config.ssh_key_name) {
            return Ok(());
        }
        let message = format!(
            "ssh key {} is not registered in the lambda account",
            self.config.ssh_key_name
        );
        Err(self
            .http
            .error(call, FailureClass::InvalidRequest, message)
            .with_code("global/object-does-not-exist"))
    }
}
