//! The offer catalog: fetches offers from every enabled provider concurrently, caches each
//! provider's answer per query for a TTL, and serves stale offers while one background refresh
//! runs. A provider that fails keeps its last good offers (marked stale) and is reported.
//!
//! Not for choosing offers (see `planner`). Needs a tokio runtime for background refreshes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use neocloud_core::{FailureClass, Offer, OfferQuery, ProviderId};
use neocloud_providers::{Operation, Provider, ProviderError};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::backoff::ProviderBackoff;

/// Catalog settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogConfig {
    /// How long a provider's answer is fresh.
    pub ttl: Duration,
    /// How long one provider may take to answer; zero: as long as it takes (a paused clock
    /// would otherwise jump to the deadline while the answer is on its way).
    pub fetch_timeout: Duration,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        CatalogConfig {
            ttl: Duration::from_secs(60),
            fetch_timeout: Duration::from_secs(20),
        }
    }
}

/// Offers from every provider for one query.
#[derive(Debug, Clone, Default)]
pub struct CatalogView {
    /// Offers of every provider that has answered at least once, in provider order.
    pub offers: Vec<Offer>,
    /// Providers whose offers are older than the TTL (a refresh is running or failed).
    pub stale: Vec<ProviderId>,
    /// The latest error of each provider that failed.
    pub errors: Vec<ProviderError>,
}

#[derive(Debug)]
struct Entry {
    offers: Arc<Vec<Offer>>,
    fetched_at: Instant,
    refreshing: bool,
    last_error: Option<ProviderError>,
}

type Key = (ProviderId, OfferQuery);

#[derive(Debug)]
struct Inner {
    providers: Vec<Arc<dyn Provider>>,
    config: CatalogConfig,
    entries: Mutex<HashMap<Key, Entry>>,
    backoff: ProviderBackoff,
}

/// The catalog. Cloning is cheap and shares the cache (and the providers' back-off).
#[derive(Debug, Clone)]
pub struct Catalog {
    inner: Arc<Inner>,
}

enum Cached {
    Fresh(Arc<Vec<Offer>>),
    Stale(Arc<Vec<Offer>>, Option<ProviderError>, bool),
    Missing,
}

impl Catalog {
    /// A catalog over these (enabled) providers.
    pub fn new(providers: Vec<Arc<dyn Provider>>, config: CatalogConfig) -> Catalog {
        let inner = Inner {
            providers,
            config,
            entries: Mutex::new(HashMap::new()),
            backoff: ProviderBackoff::default(),
        };
        Catalog {
            inner: Arc::new(inner),
        }
    }

    /// The enabled providers, in order.
    pub fn provider_ids(&self) -> Vec<ProviderId> {
        self.inner.providers.iter().map(|p| p.id()).collect()
    }

    /// What each provider asked for (429s, transient failures): shared by every Pod.
    pub fn backoff(&self) -> &ProviderBackoff {
        &self.inner.backoff
    }

    /// The provider with this id, if enabled.
    pub fn provider(&self, id: ProviderId) -> Option<Arc<dyn Provider>> {
        self.inner.providers.iter().find(|p| p.id() == id).cloned()
    }

    /// Offers for `query` from every enabled provider (`only` narrows them; empty means all).
    /// Fresh cache entries are served as they are; stale ones are served while one background
    /// refresh runs; missing ones are fetched now, all providers concurrently.
    pub async fn offers(&self, query: &OfferQuery, only: &[ProviderId]) -> CatalogView {
        let wanted = self
            .inner
            .providers
            .iter()
            .filter(|p| only.is_empty() || only.contains(&p.id()));
        let answers = join_all(wanted.map(|p| self.provider_offers(Arc::clone(p), query))).await;
        let mut view = CatalogView::default();
        for (id, offers, stale, error) in answers {
            view.offers.extend(offers.iter().cloned());
            if stale {
                view.stale.push(id);
            }
            view.errors.extend(error);
        }
        view
    }

    /// Fresh offers from one provider, bypassing (and updating) the cache: the price guard's
    /// data just before renting.
    pub async fn fresh(
        &self,
        provider: ProviderId,
        query: &OfferQuery,
    ) -> Result<Arc<Vec<Offer>>, ProviderError> {
        let Some(p) = self.provider(provider) else {
            let message = "provider is not enabled on this node";
            return Err(ProviderError::new(
                provider,
                Operation::ListOffers,
                FailureClass::InvalidRequest,
                message,
            ));
        };
        self.inner.fetch(&p, query).await
    }

    async fn provider_offers(
        &self,
        p: Arc<dyn Provider>,
        query: &OfferQuery,
    ) -> (ProviderId, Arc<Vec<Offer>>, bool, Option<ProviderError>) {
        let id = p.id();
        match self.inner.lookup(id, query) {
            Cached::Fresh(offers) => (id, offers, false, None),
            Cached::Stale(offers, error, start_refresh) => {
                if start_refresh {
                    let inner = Arc::clone(&self.inner);
                    let query = query.clone();
                    tokio::spawn(async move {
                        let _ = inner.fetch(&p, &query).await;
                    });
                }
                (id, offers, true, error)
            }
            Cached::Missing => match self.inner.fetch(&p, query).await {
                Ok(offers) => (id, offers, false, None),
                Err(e) => (id, Arc::new(Vec::new()), false, Some(e)),
            },
        }
    }
}

impl Inner {
    /// The cached state, marking a stale entry as refreshing when this caller should refresh it.
    fn lookup(&self, id: ProviderId, query: &OfferQuery) -> Cached {
        let mut entries = self.entries.lock();
        let Some(entry) = entries.get_mut(&(id, query.clone())) else {
            return Cached::Missing;
        };
        if entry.last_error.is_none() && entry.fetched_at.elapsed() < self.config.ttl {
            return Cached::Fresh(Arc::clone(&entry.offers));
        }
        let start_refresh = !entry.refreshing;
        entry.refreshing = true;
        Cached::Stale(
            Arc::clone(&entry.offers),
            entry.last_error.clone(),
            start_refresh,
        )
    }

    async fn fetch(
        &self,
        p: &Arc<dyn Provider>,
        query: &OfferQuery,
    ) -> Result<Arc<Vec<Offer>>, ProviderError> {
        let id = p.id();
        let limit = self.config.fetch_timeout;
        let result = if limit.is_zero() {
            p.list_offers(query).await
        } else {
            match tokio::time::timeout(limit, p.list_offers(query)).await {
                Ok(result) => result,
                Err(_) => Err(ProviderError::new(
                    id,
                    Operation::ListOffers,
                    FailureClass::Timeout,
                    format!("no answer within {limit:?}"),
                )),
            }
        };
        self.store(id, query, result)
    }

    fn store(
        &self,
        id: ProviderId,
        query: &OfferQuery,
        result: Result<Vec<Offer>, ProviderError>,
    ) -> Result<Arc<Vec<Offer>>, ProviderError> {
        let mut entries = self.entries.lock();
        let key = (id, query.clone());
        match result {
            Ok(offers) => {
                let offers = Arc::new(offers);
                let entry = Entry {
                    offers: Arc::clone(&offers),
                    fetched_at: Instant::now(),
                    refreshing: false,
                    last_error: None,
                };
                entries.insert(key, entry);
                Ok(offers)
            }
            Err(e) => {
                let entry = entries.entry(key).or_insert_with(|| Entry {
                    offers: Arc::new(Vec::new()),
                    fetched_at: Instant::now(),
                    refreshing: false,
                    last_error: None,
                });
                entry.refreshing = false;
                entry.last_error = Some(e.clone());
                Err(e)
            }
        }
    }
}
