//! The RunPod adapter: REST v2 for offers, on-demand pods, get, list and delete; GraphQL for
//! interruptible (spot) pods, which v2 cannot create. Creates are idempotent by pod name: the
//! adapter lists pods by name before renting, serialises creates per name, and after a timeout,
//! 5xx or unreadable answer looks the name up again instead of renting twice.
//!
//! Not for choosing offers or retrying a failed rental elsewhere (the broker does that).

use std::collections::HashMap;
use std::fmt;
use std::future::ready;

use async_trait::async_trait;
use neocloud_core::{FailureClass, InstancePhase, InstanceState, Offer, OfferQuery, ProviderId};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::config::RunpodConfig;
use super::convert::{self, Placement, SpotTable};
use super::errors::{gql_error, rest_error};
use super::registries;
use super::wire::{self, Catalog, CreatePod, GqlRequest, GqlResponse, Pod, PodGpu, PodList};
use crate::adapter;
use crate::common::{ConfigError, NameLocks, wants_capacity};
use crate::http::{Call, Http, Safety, excerpt};
use crate::provider::{CreateRequest, Operation, Provider, ProviderError};

const CLOUDS: [&str; 2] = ["SECURE", "COMMUNITY"];

/// RunPod pods through REST v2 and GraphQL.
pub struct RunpodProvider {
    http: Http,
    config: RunpodConfig,
    locks: NameLocks,
}

impl fmt::Debug for RunpodProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        adapter::debug(f, "RunpodProvider", &self.http).finish()
    }
}

impl RunpodProvider {
    /// An adapter for `config`.
    pub fn new(config: RunpodConfig) -> Result<RunpodProvider, ConfigError> {
        let http = adapter::client(
            ProviderId::Runpod,
            &config.base_url,
            &config.api_key,
            &config.http,
        )?;
        Ok(RunpodProvider {
            http,
            config,
            locks: NameLocks::default(),
        })
    }

    /// An adapter configured from `RUNPOD_API_KEY` and `RUNPOD_API_BASE_URL`.
    pub fn from_env() -> Result<RunpodProvider, ConfigError> {
        RunpodProvider::new(RunpodConfig::from_env()?)
    }

    async fn gql<T: DeserializeOwned>(
        &self,
        call: Call<'_>,
        safety: Safety,
        body: &GqlRequest<'_>,
    ) -> Result<T, ProviderError> {
        let url = self.http.url("/graphql");
        let reply = self
            .http
            .send(call, safety, |c| c.post(&url).json(body))
            .await?;
        let parsed: Option<GqlResponse<T>> = serde_json::from_str(&reply.body).ok();
        match parsed {
            Some(r) if !r.errors.is_empty() => Err(gql_error(&self.http, call, &r.errors)),
            _ if !reply.status.is_success() => Err(rest_error(&self.http, call, &reply)),
            Some(GqlResponse {
                data: Some(data), ..
            }) => Ok(data),
            _ => {
                let message = format!("graphql answer without data: {}", excerpt(&reply.body));
                Err(self
                    .http
                    .error(call, FailureClass::Transient, message)
                    .with_code("decode"))
            }
        }
    }

    /// Marks stopped pods that are interruptible. A v2 pod does not say whether it is a spot
    /// pod, and a stopped spot pod is a reclaim (RunPod shows an eviction as `EXITED` on an
    /// `INTERRUPTABLE` pod): for each stopped pod, GraphQL's `podType` tells.
    async fn mark_reclaimable(
        &self,
        call: Call<'_>,
        states: &mut [InstanceState],
    ) -> Result<(), ProviderError> {
        for state in states
            .iter_mut()
            .filter(|s| s.phase == InstancePhase::Stopped && !s.interruptible)
        {
            let body = GqlRequest {
                query: wire::POD_TYPE,
                variables: json!({ "input": { "podId": state.id } }),
            };
            let answer: wire::PodTypeAnswer = self.gql(call, Safety::Retryable, &body).await?;
            state.interruptible = answer
                .pod
                .and_then(|p| p.pod_type)
                .is_some_and(|t| t.eq_ignore_ascii_case("INTERRUPTABLE"));
        }
        Ok(())
    }

    async fn spot_prices(&self, call: Call<'_>) -> Result<SpotTable, ProviderError> {
        let body = GqlRequest {
            query: wire::SPOT_PRICES,
            variables: json!({}),
        };
        let prices: wire::SpotPrices = self.gql(call, Safety::Retryable, &body).await?;
        Ok(prices
            .gpu_types
            .into_iter()
            .map(|p| (p.id, (p.secure_spot_price, p.community_spot_price)))
            .collect())
    }

    /// Every pod, following `pagination` if RunPod sends it.
    async fn pods(&self, call: Call<'_>) -> Result<Vec<Pod>, ProviderError> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                Some(c) => format!("/v2/pods?cursor={}", url_escape(c)),
                None => "/v2/pods".to_owned(),
            };
            let page: PodList = self.http.get_json(call, &path, rest_error).await?;
            all.extend(page.pods);
            match page.pagination {
                Some(p) if p.has_next_page && p.next_cursor.is_some() => cursor = p.next_cursor,
                _ => return Ok(all),
            }
        }
    }

    /// Where the offer id says to rent.
    fn placement(
        &self,
        call: Call<'_>,
        request: &CreateRequest,
    ) -> Result<Placement, ProviderError> {
        Placement::parse(&request.offer.id).ok_or_else(|| {
            let message = format!(
                "offer id {} is not a runpod offer (gpuType/CLOUD/dataCenter)",
                request.offer.id
            );
            self.http.error(call, FailureClass::InvalidRequest, message)
        })
    }

    async fn rent(&self, request: &CreateRequest) -> Result<InstanceState, ProviderError> {
        let call = Call::new(Operation::Create, Some(&request.external_name));
        let placement = &self.placement(call, request)?;
        let ports = convert::ports(request).map_err(|port| {
            let message =
                format!("runpod publishes only tcp ports; udp port {port} cannot be exposed");
            self.http.error(call, FailureClass::InvalidRequest, message)
        })?;
        let registry = match &request.registry_login {
            Some(login) => {
                Some(registries::replace(&self.http, &request.external_name, login).await?)
            }
            None => None,
        };
        if placement.spot {
            return self
                .rent_spot(call, request, placement, &ports, registry)
                .await;
        }
        let mut body = self.create_body(request, placement, ports);
        body.registry = registry;
        let url = self.http.url("/v2/pods");
        let pod: Pod = self
            .http
            .json(call, Safety::CreateOnce, rest_error, |c| {
                c.post(&url).json(&body)
            })
            .await?;
        Ok(convert::state(&pod))
    }

    async fn rent_spot(
        &self,
        call: Call<'_>,
        request: &CreateRequest,
        placement: &Placement,
        ports: &[String],
        registry: Option<String>,
    ) -> Result<InstanceState, ProviderError> {
        let mut input = self.spot_input(request, placement, ports);
        if let Some(id) = registry {
            input["containerRegistryAuthId"] = json!(id);
        }
        let body = GqlRequest {
            query: wire::RENT_INTERRUPTABLE,
            variables: json!({ "input": input }),
        };
        let rented: wire::Rented = self.gql(call, Safety::CreateOnce, &body).await?;
        let id = rented
            .pod_rent_interruptable
            .map(|p| p.id)
            .unwrap_or_default();
        match self.get(&id).await {
            Ok(Some(state)) => Ok(state),
            _ => Err(self.http.error(
                call,
                FailureClass::Transient,
                format!("spot pod {id} was rented but cannot be read"),
            )),
        }
    }

    fn create_body(
        &self,
        request: &CreateRequest,
        placement: &Placement,
        ports: Vec<String>,
    ) -> CreatePod {
        CreatePod {
            name: request.external_name.clone(),
            image: request.workload.image.clone(),
            gpu: PodGpu {
                id: placement.gpu_type.clone(),
                count: request.offer.gpu_count.max(1),
            },
            cloud: placement.cloud.clone(),
            data_center_ids: vec![placement.data_center.clone()],
            disk: request
                .workload
                .disk_gib
                .unwrap_or(self.config.default_disk_gb),
            env: convert::env_map(request),
            ports,
            args: convert::args_string(request),
            start_ssh: self.config.start_ssh.then_some(true),
            registry: None,
        }
    }

    fn spot_input(
        &self,
        request: &CreateRequest,
        placement: &Placement,
        ports: &[String],
    ) -> serde_json::Value {
        let count = request.offer.gpu_count.max(1);
        let bid = request
            .bid_per_hour
            .unwrap_or(request.offer.rent_price_per_hour());
        let env: Vec<_> = request
            .container_env()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        let mut input = json!({
            "name": request.external_name, "imageName": request.workload.image,
            "gpuTypeId": placement.gpu_type, "cloudType": placement.cloud, "gpuCount": count,
            "containerDiskInGb": request.workload.disk_gib.unwrap_or(self.config.default_disk_gb),
            "dataCenterId": placement.data_center, "env": env, "ports": ports.join(","),
            "bidPerGpu": bid / f64::from(count),
        });
        if let Some(args) = convert::args_string(request) {
            input["dockerArgs"] = json!(args);
        }
        input
    }
}

pub(super) fn url_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[async_trait]
impl Provider for RunpodProvider {
    fn id(&self) -> ProviderId {
        ProviderId::Runpod
    }

    async fn list_offers(&self, query: &OfferQuery) -> Result<Vec<Offer>, ProviderError> {
        let call = Call::new(Operation::ListOffers, None);
        let wanted = wants_capacity(query);
        let spot_prices = if wanted.1 {
            self.spot_prices(call).await?
        } else {
            HashMap::new()
        };
        let mut offers = Vec::new();
        for cloud in CLOUDS {
            let path = format!("/v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud={cloud}");
            let catalog: Catalog = self.http.get_json(call, &path, rest_error).await?;
            for gpu in &catalog.gpus {
                offers.extend(convert::catalog_offers(
                    gpu,
                    cloud,
                    query,
                    wanted,
                    &spot_prices,
                ));
            }
        }
        Ok(offers)
    }

    async fn create(&self, request: &CreateRequest) -> Result<InstanceState, ProviderError> {
        let name = request.external_name.as_str();
        let rent = self.rent(request);
        adapter::create_once(self, &self.locks, name, ready(Ok(())), rent).await
    }

    async fn get(&self, id: &str) -> Result<Option<InstanceState>, ProviderError> {
        let call = Call::new(Operation::Get, Some(id));
        if id.is_empty() {
            return Ok(None);
        }
        let url = self.http.url(&format!("/v2/pods/{}", url_escape(id)));
        let pod: Option<Pod> = self
            .http
            .optional(call, rest_error, |c| c.get(&url))
            .await?;
        let mut states: Vec<InstanceState> = pod.as_ref().map(convert::state).into_iter().collect();
        self.mark_reclaimable(call, &mut states).await?;
        Ok(states.pop())
    }

    async fn find_by_name(
        &self,
        external_name: &str,
    ) -> Result<Option<InstanceState>, ProviderError> {
        let call = Call::new(Operation::FindByName, Some(external_name));
        let pods = self.pods(call).await?;
        let mut live: Vec<InstanceState> = pods
            .iter()
            .filter(|p| p.name == external_name)
            .map(convert::state)
            .filter(|s| !s.phase.is_terminal())
            .collect();
        live.sort_by_key(|s| s.created_at);
        Ok(live.into_iter().next())
    }

    async fn list_ours(&self, prefix: &str) -> Result<Vec<InstanceState>, ProviderError> {
        let call = Call::new(Operation::ListOurs, Some(prefix));
        let pods = self.pods(call).await?;
        let mut states: Vec<InstanceState> = pods
            .iter()
            .filter(|p| p.name.starts_with(prefix))
            .map(convert::state)
            .filter(|s| !s.phase.is_terminal())
            .collect();
        self.mark_reclaimable(call, &mut states).await?;
        Ok(states)
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let call = Call::new(Operation::Delete, Some(id));
        if id.is_empty() {
            return Ok(());
        }
        let url = self.http.url(&format!("/v2/pods/{}", url_escape(id)));
        // The pod's registry credential goes with it: read which one before the pod is gone.
        let pod: Option<Pod> = self
            .http
            .optional(call, rest_error, |c| c.get(&url))
            .await?;
        self.http
            .remove(call, rest_error, |c| c.delete(&url))
            .await?;
        match pod.and_then(|p| p.registry) {
            Some(registry) => registries::delete(&self.http, &registry).await,
            None => Ok(()),
        }
    }

    async fn list_credentials(&self, prefix: &str) -> Result<Vec<(String, String)>, ProviderError> {
        let call = Call::new(Operation::Credential, Some(prefix));
        let all = registries::list(&self.http, call).await?;
        Ok(all
            .into_iter()
            .filter(|r| r.name.starts_with(prefix))
            .map(|r| (r.id, r.name))
            .collect())
    }

    async fn delete_credential(&self, id: &str) -> Result<(), ProviderError> {
        registries::delete(&self.http, id).await
    }

    async fn health(&self) -> Result<(), ProviderError> {
        let call = Call::new(Operation::Health, None);
        self.http
            .get_json::<PodList>(call, "/v2/pods", rest_error)
            .await
            .map(drop)
    }
}
