//! `InstrumentedProvider`: a `Provider` that delegates every call and records its duration in
//! `neocloud_provider_call_duration_seconds{provider,operation,outcome}`.
//!
//! Not for retries, timeouts or logging: it changes no result and adds no behaviour.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use neocloud_core::{InstanceState, Offer, OfferQuery, ProviderId};
use neocloud_providers::{CreateRequest, Operation, Provider, ProviderError};

use super::Metrics;

/// The `operation` label: the `Provider` method's name (`list_offers`, `create`, `get`,
/// `find_by_name`, `list_ours`, `delete`, `health`, `logs`, `open_session`). `Operation`'s `Display` is prose for
/// messages ("list offers"), so labels use these snake-case names instead.
pub fn operation_label(operation: Operation) -> &'static str {
    match operation {
        Operation::ListOffers => "list_offers",
        Operation::Create => "create",
        Operation::Get => "get",
        Operation::FindByName => "find_by_name",
        Operation::ListOurs => "list_ours",
        Operation::Delete => "delete",
        Operation::Health => "health",
        Operation::Logs => "logs",
        Operation::Session => "open_session",
        Operation::Credential => "registry_credential",
    }
}

/// The outcome of a call dropped before it finished (the caller's own deadline or shutdown).
const CANCELLED: &str = "cancelled";

/// A provider whose calls are timed. The outcome label is `ok`, the error's failure class label
/// (`FailureClass::label`, e.g. `capacity`), or `cancelled` when the caller dropped the call
/// before it answered, so slow calls cut short still show in the histogram.
#[derive(Debug, Clone)]
pub struct InstrumentedProvider {
    inner: Arc<dyn Provider>,
    metrics: Arc<Metrics>,
}

impl InstrumentedProvider {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Provider>, metrics: Arc<Metrics>) -> InstrumentedProvider {
        InstrumentedProvider { inner, metrics }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<dyn Provider> {
        &self.inner
    }

    async fn timed<T>(
        &self,
        operation: Operation,
        call: impl Future<Output = Result<T, ProviderError>>,
    ) -> Result<T, ProviderError> {
        let mut timer = CallTimer {
            metrics: &self.metrics,
            provider: self.inner.id(),
            operation,
            started: Instant::now(),
            outcome: CANCELLED,
        };
        // A span of the placement's trace, when traces are exported.
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "provider call",
            "neocloud.provider" = %self.inner.id(),
            "neocloud.operation" = operation_label(operation),
            "neocloud.outcome" = tracing::field::Empty,
        );
        let result = tracing::Instrument::instrument(call, span.clone()).await;
        timer.outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.metric_label(),
        };
        span.record("neocloud.outcome", timer.outcome);
        result
    }
}

/// Records the call when dropped: after it finished, or when the caller abandoned it.
struct CallTimer<'a> {
    metrics: &'a Metrics,
    provider: ProviderId,
    operation: Operation,
    started: Instant,
    outcome: &'static str,
}

impl Drop for CallTimer<'_> {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        self.metrics
            .observe_provider_call(self.provider, self.operation, self.outcome, elapsed);
    }
}

/// Wraps every provider so its calls are timed into `metrics`, keeping the order.
pub fn instrument(
    providers: Vec<Arc<dyn Provider>>,
    metrics: &Arc<Metrics>,
) -> Vec<Arc<dyn Provider>> {
    providers
        .into_iter()
        .map(|p| Arc::new(InstrumentedProvider::new(p, metrics.clone())) as Arc<dyn Provider>)
        .collect()
}

/// Every method keeps the inner provider's contract (idempotency, concurrency) unchanged.
#[async_trait]
impl Provider for InstrumentedProvider {
    fn id(&self) -> ProviderId {
        self.inner.id()
    }

    async fn list_offers(&self, query: &OfferQuery) -> Result<Vec<Offer>, ProviderError> {
        self.timed(Operation::ListOffers, self.inner.list_offers(query))
            .await
    }

    async fn create(&self, request: &CreateRequest) -> Result<InstanceState, ProviderError> {
        self.timed(Operation::Create, self.inner.create(request))
            .await
    }

    async fn get(&self, id: &str) -> Result<Option<InstanceState>, ProviderError> {
        self.timed(Operation::Get, self.inner.get(id)).await
    }

    async fn find_by_name(
        &self,
        external_name: &str,
    ) -> Result<Option<InstanceState>, ProviderError> {
        self.timed(
            Operation::FindByName,
            self.inner.find_by_name(external_name),
        )
        .await
    }

    async fn list_ours(&self, prefix: &str) -> Result<Vec<InstanceState>, ProviderError> {
        self.timed(Operation::ListOurs, self.inner.list_ours(prefix))
            .await
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        self.timed(Operation::Delete, self.inner.delete(id)).await
    }

    async fn health(&self) -> Result<(), ProviderError> {
        self.timed(Operation::Health, self.inner.health()).await
    }

    async fn list_credentials(&self, prefix: &str) -> Result<Vec<(String, String)>, ProviderError> {
        let listed = self.inner.list_credentials(prefix);
        self.timed(Operation::Credential, listed).await
    }

    async fn delete_credential(&self, id: &str) -> Result<(), ProviderError> {
        let deleted = self.inner.delete_credential(id);
        self.timed(Operation::Credential, deleted).await
    }

    /// Not timed: a stream's life is the reader's, not the provider's answer time.
    async fn logs(
        &self,
        id: &str,
        request: &neocloud_providers::LogRequest,
    ) -> Result<Option<neocloud_providers::LogStream>, ProviderError> {
        self.inner.logs(id, request).await
    }

    async fn open_session(
        &self,
        id: &str,
        request: &neocloud_protocol::session::SessionRequest,
    ) -> Result<Option<neocloud_providers::FrameStream>, ProviderError> {
        self.inner.open_session(id, request).await
    }

    fn create_wait(&self) -> Option<(std::time::Duration, String)> {
        self.inner.create_wait()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use neocloud_core::FailureClass;
    use neocloud_providers::FakeProvider;

    use super::*;
    use crate::metrics::tests::sample;

    fn wrapped(fake: &Arc<FakeProvider>) -> (Arc<Metrics>, Arc<dyn Provider>) {
        let metrics = Arc::new(Metrics::new());
        let inner: Arc<dyn Provider> = fake.clone();
        let mut wrapped = instrument(vec![inner], &metrics);
        (metrics, wrapped.remove(0))
    }

    fn count(metrics: &Metrics, operation: &str, outcome: &str) -> Option<f64> {
        let series = format!(
            r#"neocloud_provider_call_duration_seconds_count{{provider="fake",operation="{operation}",outcome="{outcome}"}}"#
        );
        sample(&metrics.encode(), &series)
    }

    #[tokio::test]
    async fn failed_call_is_recorded_with_its_failure_class() {
        let fake = Arc::new(FakeProvider::new(ProviderId::Fake));
        fake.fail_next_list_offers(FailureClass::Capacity);
        let (metrics, provider) = wrapped(&fake);

        let err = provider
            .list_offers(&OfferQuery::default())
            .await
            .expect_err("the injected failure passes through");
        assert_eq!(err.class, FailureClass::Capacity);
        provider.list_offers(&OfferQuery::default()).await.unwrap();

        assert_eq!(count(&metrics, "list_offers", "capacity"), Some(1.0));
        assert_eq!(count(&metrics, "list_offers", "ok"), Some(1.0));
        assert_eq!(
            fake.calls().list_offers,
            2,
            "each call reached the fake once"
        );
    }

    #[tokio::test]
    async fn every_method_delegates_under_its_own_operation_label() {
        let fake = Arc::new(FakeProvider::new(ProviderId::Fake));
        fake.set_healthy(false);
        let (metrics, provider) = wrapped(&fake);
        assert_eq!(provider.id(), ProviderId::Fake);

        assert_eq!(provider.get("fake-9").await.unwrap(), None);
        assert_eq!(provider.find_by_name("nc-x").await.unwrap(), None);
        assert!(provider.list_ours("nc-").await.unwrap().is_empty());
        provider.delete("fake-9").await.unwrap();
        let health = provider.health().await.expect_err("unhealthy fake");

        for op in ["get", "find_by_name", "list_ours", "delete"] {
            assert_eq!(count(&metrics, op, "ok"), Some(1.0), "{op}");
        }
        assert_eq!(count(&metrics, "health", health.metric_label()), Some(1.0));
        assert_eq!(fake.calls().delete, 1);
    }

    #[tokio::test]
    async fn call_dropped_by_its_caller_is_recorded_as_cancelled() {
        let fake = Arc::new(FakeProvider::new(ProviderId::Fake));
        fake.set_list_delay(Some(Duration::from_secs(30)));
        let (metrics, provider) = wrapped(&fake);

        let query = OfferQuery::default();
        let call = provider.list_offers(&query);
        let cut = tokio::time::timeout(Duration::from_millis(20), call).await;
        assert!(cut.is_err(), "the call should still be waiting");

        assert_eq!(count(&metrics, "list_offers", "cancelled"), Some(1.0));
        assert_eq!(count(&metrics, "list_offers", "ok"), None);
    }
}
