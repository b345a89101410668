//! The Vast.ai adapter: offer search through the bundles query, rental with our external name as
//! `label`, get, destroy, and lookups by label through the keyset-paginated instance list.
//! Creates are idempotent by label; after a timeout or 5xx the label is looked up again; any
//! instance an error response says was created (`new_contract`, as after a spot bid below the
//! minimum) is destroyed before the error is returned.
//!
//! Not SSH key registration, volumes, templates or the CLI's query-string language.

use std::fmt;

use async_trait::async_trait;
use neocloud_core::{FailureClass, InstanceState, Offer, OfferQuery, ProviderId};
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::config::{MAX_PAGE_SIZE, VastConfig};
use super::convert::{self, VastSearch};
use super::errors;
use super::wire::{Offers, One, Outcome, Page, VastInstance};
use crate::adapter;
use crate::common::{ConfigError, NameLocks, wants_capacity};
use crate::http::{Call, Http, Safety, excerpt};
use crate::provider::{CreateRequest, Operation, Provider, ProviderError};

/// Vast.ai marketplace instances.
pub struct VastProvider {
    http: Http,
    config: VastConfig,
    locks: NameLocks,
}

impl fmt::Debug for VastProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        adapter::debug(f, "VastProvider", &self.http).finish()
    }
}

impl VastProvider {
    /// An adapter for `config`.
    pub fn new(config: VastConfig) -> Result<VastProvider, ConfigError> {
        let http = adapter::client(
            ProviderId::Vast,
            &config.base_url,
            &config.api_key,
            &config.http,
        )?;
        if !(1..=MAX_PAGE_SIZE).contains(&config.page_size) {
            let message = format!(
                "page_size must be 1 to {MAX_PAGE_SIZE}, not {}",
                config.page_size
            );
            return Err(ConfigError::Invalid {
                provider: "vast",
                message,
            });
        }
        Ok(VastProvider {
            http,
            config,
            locks: NameLocks::default(),
        })
    }

    /// An adapter configured from `VAST_API_KEY` and `VAST_API_BASE_URL`.
    pub fn from_env() -> Result<VastProvider, ConfigError> {
        VastProvider::new(VastConfig::from_env()?)
    }

    /// Offers matching `query` and `search` (the `vast-*` hints, max price, countries).
    pub async fn search_offers(
        &self,
        query: &OfferQuery,
        search: &VastSearch,
    ) -> Result<Vec<Offer>, ProviderError> {
        let call = Call::new(Operation::ListOffers, None);
        let (on_demand, spot) = wants_capacity(query);
        let mut offers = Vec::new();
        for (wanted, bid) in [(on_demand, false), (spot, true)] {
            if !wanted {
                continue;
            }
            let body = convert::bundles_query(query, search, bid, self.config.search_limit);
            let found = self.search(call, &body).await?;
            offers.extend(
                found
                    .offers
                    .iter()
                    .filter_map(|o| convert::offer(o, query, bid)),
            );
        }
        Ok(offers)
    }

    async fn search(&self, call: Call<'_>, body: &Value) -> Result<Offers, ProviderError> {
        let url = self.http.url("/api/v0/bundles/");
        self.http
            .json(call, Safety::Retryable, errors::error, |c| {
                c.post(&url).json(body)
            })
            .await
    }

    async fn page(
        &self,
        call: Call<'_>,
        filters: Option<&Value>,
        after: Option<&str>,
    ) -> Result<Page, ProviderError> {
        let mut params = vec![
            ("limit", self.config.page_size.to_string()),
            ("order_by", json!([{"col": "id", "dir": "asc"}]).to_string()),
        ];
        if let Some(filters) = filters {
            params.push(("select_filters", filters.to_string()));
        }
        if let Some(token) = after {
            params.push(("after_token", Value::from(token).to_string()));
        }
        let url = self.http.url("/api/v1/instances/");
        self.http
            .json(call, Safety::Retryable, errors::error, |c| {
                c.get(&url).query(&params)
            })
            .await
    }

    /// Every instance matching `filters`, following `next_token` to the last page.
    async fn instances(
        &self,
        call: Call<'_>,
        filters: Option<&Value>,
    ) -> Result<Vec<VastInstance>, ProviderError> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self.page(call, filters, token.as_deref()).await?;
            all.extend(page.instances);
            match page.next_token {
                Some(next) if Some(&next) != token.as_ref() => token = Some(next),
                _ => return Ok(all),
            }
        }
    }

    /// The max-price check against fresh data, just before renting an on-demand ask.
    async fn check_fresh_price(
        &self,
        call: Call<'_>,
        request: &CreateRequest,
        ask: u64,
    ) -> Result<(), ProviderError> {
        let Some(max) = request.workload.max_price_per_hour else {
            return Ok(());
        };
        if let Some(bid) = request.bid_per_hour {
            return self.check_bid(call, bid, max);
        }
        let found = self
            .search(call, &json!({"id": {"eq": ask}, "type": "on-demand"}))
            .await?;
        match found.offers.first() {
            None => Err(self
                .http
                .error(
                    call,
                    FailureClass::Capacity,
                    format!("offer {ask} no longer available"),
                )
                .with_code("no_such_ask")),
            Some(o) if o.dph_total > max => {
                let message = format!(
                    "offer {ask} now costs {:.4}/h, above the max price {max:.4}/h",
                    o.dph_total
                );
                Err(self.http.error(call, FailureClass::PriceExceeded, message))
            }
            Some(_) => Ok(()),
        }
    }

    fn check_bid(&self, call: Call<'_>, bid: f64, max: f64) -> Result<(), ProviderError> {
        if bid <= max {
            return Ok(());
        }
        let message = format!("bid {bid:.4}/h is above the max price {max:.4}/h");
        Err(self.http.error(call, FailureClass::PriceExceeded, message))
    }

    async fn rent(
        &self,
        call: Call<'_>,
        request: &CreateRequest,
        ask: u64,
    ) -> Result<InstanceState, ProviderError> {
        let body = convert::rent_body(request);
        let url = self.http.url(&format!("/api/v0/asks/{ask}/"));
        let reply = self
            .http
            .send(call, Safety::CreateOnce, |c| c.put(&url).json(&body))
            .await?;
        let outcome: Outcome = serde_json::from_str(&reply.body).unwrap_or_default();
        if reply.status.is_success() && outcome.success != Some(false) {
            return match outcome.new_contract {
                Some(id) => self.read_created(call, id).await,
                None => {
                    let message = format!(
                        "rental answered without new_contract: {}",
                        excerpt(&reply.body)
                    );
                    Err(self
                        .http
                        .error(call, FailureClass::Transient, message)
                        .with_code("decode"))
                }
            };
        }
        let error = errors::error(&self.http, call, &reply);
        match outcome.new_contract {
            Some(id) => Err(self.destroy_created(error, id).await),
            None => Err(error),
        }
    }

    async fn read_created(&self, call: Call<'_>, id: u64) -> Result<InstanceState, ProviderError> {
        match self.get(&id.to_string()).await {
            Ok(Some(state)) => Ok(state),
            _ => Err(self.http.error(
                call,
                FailureClass::Transient,
                format!("instance {id} was rented but cannot be read"),
            )),
        }
    }

    /// Destroys an instance an error response says was created, and says so in the error.
    async fn destroy_created(&self, mut error: ProviderError, id: u64) -> ProviderError {
        match self.delete(&id.to_string()).await {
            Ok(()) => {
                tracing::info!(
                    provider = "vast",
                    id,
                    "destroyed the instance a failed rental created"
                );
                error.message =
                    format!("{}; instance {id} it created was destroyed", error.message);
            }
            Err(failed) => {
                tracing::error!(provider = "vast", id, error = %failed, "could not destroy the instance a failed rental created");
                error.message = format!(
                    "{}; instance {id} it created could not be destroyed ({}), the sweeper will find it by label",
                    error.message, failed.message
                );
            }
        }
        error
    }
}

#[async_trait]
impl Provider for VastProvider {
    fn id(&self) -> ProviderId {
        ProviderId::Vast
    }

    async fn list_offers(&self, query: &OfferQuery) -> Result<Vec<Offer>, ProviderError> {
        self.search_offers(query, &VastSearch::from_config(&self.config))
            .await
    }

    async fn create(&self, request: &CreateRequest) -> Result<InstanceState, ProviderError> {
        let name = request.external_name.as_str();
        let call = Call::new(Operation::Create, Some(name));
        let Ok(ask) = request.offer.id.parse::<u64>() else {
            let message = format!("offer id {} is not a vast ask id", request.offer.id);
            return Err(self.http.error(call, FailureClass::InvalidRequest, message));
        };
        let check = self.check_fresh_price(call, request, ask);
        let rent = self.rent(call, request, ask);
        adapter::create_once(self, &self.locks, name, check, rent).await
    }

    async fn get(&self, id: &str) -> Result<Option<InstanceState>, ProviderError> {
        let call = Call::new(Operation::Get, Some(id));
        let Ok(number) = id.parse::<u64>() else {
            return Ok(None);
        };
        let url = self.http.url(&format!("/api/v0/instances/{number}/"));
        let found: Option<One> = self
            .http
            .optional(call, errors::error, |c| {
                c.get(&url).query(&[("owner", "me")])
            })
            .await?;
        Ok(found.and_then(|one| one.instances.as_ref().map(convert::state)))
    }

    async fn find_by_name(
        &self,
        external_name: &str,
    ) -> Result<Option<InstanceState>, ProviderError> {
        let call = Call::new(Operation::FindByName, Some(external_name));
        let filters = json!({"label": {"eq": external_name}});
        let found = self.instances(call, Some(&filters)).await?;
        Ok(found
            .iter()
            .filter(|i| i.label.as_deref() == Some(external_name))
            .map(convert::state)
            .filter(|s| !s.phase.is_terminal())
            .min_by_key(|s| s.id.parse::<u64>().unwrap_or(u64::MAX)))
    }

    async fn list_ours(&self, prefix: &str) -> Result<Vec<InstanceState>, ProviderError> {
        let call = Call::new(Operation::ListOurs, Some(prefix));
        let all = self.instances(call, None).await?;
        Ok(all
            .iter()
            .filter(|i| i.label.as_deref().is_some_and(|l| l.starts_with(prefix)))
            .map(convert::state)
            .filter(|s| !s.phase.is_terminal())
            .collect())
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let call = Call::new(Operation::Delete, Some(id));
        let Ok(number) = id.parse::<u64>() else {
            return Ok(());
        };
        let url = self.http.url(&format!("/api/v0/instances/{number}/"));
        let reply = self
            .http
            .send(call, Safety::Retryable, |c| c.delete(&url))
            .await?;
        let outcome: Outcome = serde_json::from_str(&reply.body).unwrap_or_default();
        let gone = matches!(
            outcome.error.as_deref(),
            Some("not_found" | "no_such_instance")
        );
        match reply.status {
            StatusCode::NOT_FOUND => Ok(()),
            s if s.is_success() && (outcome.success != Some(false) || gone) => Ok(()),
            _ if gone => Ok(()),
            _ => Err(errors::error(&self.http, call, &reply)),
        }
    }

    async fn health(&self) -> Result<(), ProviderError> {
        let call = Call::new(Operation::Health, None);
        let url = self.http.url("/api/v1/instances/");
        let reply = self
            .http
            .send(call, Safety::Retryable, |c| {
                c.get(&url).query(&[("limit", "1")])
            })
            .await?;
        if reply.status.is_success() {
            return Ok(());
        }
        Err(errors::error(&self.http, call, &reply))
    }
}
