//! OTLP export, off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or the per-signal
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`) is set, and
//! neither `OTEL_SDK_DISABLED=true` nor `OTEL_<SIGNAL>S_EXPORTER=none`. Metrics: every family of
//! `/metrics`, every `OTEL_METRIC_EXPORT_INTERVAL` (60 s by default; see `metrics::otlp`).
//! Traces: one trace per
//! Pod placement (translation, policy evaluations, planning, each provider call, the rental),
//! and a span for the wait from the rental to the Pod Running, parented by the `traceparent`
//! kept on the binding. Spans go over OTLP/HTTP protobuf through a batch processor with a
//! bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2,048 by default): when the collector is away,
//! spans are dropped, never buffered without bound, and placement goes on. What is exported and
//! what is dropped (queue full, or the export failed) is counted in
//! `neocloud_trace_spans_exported_total` and `neocloud_trace_spans_dropped_total{reason}`.
//!
//! The resource follows the OpenTelemetry semantic conventions: `service.name`
//! (`neocloud-node`), `service.version`, `k8s.cluster.name` (the config's `clusterId`), and
//! whatever `OTEL_RESOURCE_ATTRIBUTES` adds. Spans carry names and identities only: no
//! environment value, Secret or credential.
//!
//! Only the node's own spans are exported (target [`TARGET`]); its log lines and kube-runtime's
//! spans are not.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry::KeyValue;
use opentelemetry::trace::{Span as _, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of every exported span.
pub const TARGET: &str = "neocloud::trace";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported: callers skip building spans otherwise.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The exporters' providers, to flush at exit.
#[derive(Debug)]
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
    metrics: Option<SdkMeterProvider>,
}

impl Telemetry {
    /// Sends what is queued (bounded by the exporters' timeouts).
    pub fn shutdown(self) {
        if let Some(traces) = self.traces
            && let Err(e) = traces.shutdown()
        {
            tracing::warn!(error = %e, "telemetry: flushing spans at exit failed");
        }
        if let Some(metrics) = self.metrics
            && let Err(e) = metrics.shutdown()
        {
            tracing::warn!(error = %e, "telemetry: exporting metrics at exit failed");
        }
    }
}

fn set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.trim().is_empty())
}

fn none(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case("none"))
}

fn disabled() -> bool {
    std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// Whether the standard variables ask for trace export.
pub fn requested() -> bool {
    !disabled()
        && !none("OTEL_TRACES_EXPORTER")
        && (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

/// Whether the standard variables ask for metric export.
pub fn metrics_requested() -> bool {
    !disabled()
        && !none("OTEL_METRICS_EXPORTER")
        && (set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

static METER: OnceLock<SdkMeterProvider> = OnceLock::new();

/// The node's meter, when metrics are exported over OTLP.
pub fn meter() -> Option<opentelemetry::metrics::Meter> {
    use opentelemetry::metrics::MeterProvider as _;
    METER.get().map(|p| p.meter("neocloud-node"))
}

/// The exporters the standard variables ask for ([`requested`], [`metrics_requested`]), and the
/// `tracing` layer that feeds spans to the first; `cluster` names the cluster in the resource.
/// Metrics reach the meter once `crate::metrics::Metrics::export_otlp` is called with it.
pub fn start<S>(
    cluster: Option<&str>,
) -> anyhow::Result<(Option<Telemetry>, Option<impl tracing_subscriber::Layer<S>>)>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let mut attributes = vec![KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))];
    if let Some(cluster) = cluster {
        attributes.push(KeyValue::new("k8s.cluster.name", cluster.to_owned()));
    }
    let resource = Resource::builder()
        .with_service_name("neocloud-node")
        .with_attributes(attributes)
        .build();
    let metrics = if metrics_requested() {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .build()
            .map_err(|e| {
                anyhow::anyhow!("OTEL_EXPORTER_OTLP_*: cannot build the OTLP metric exporter: {e}")
            })?;
        let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter).build();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(resource.clone())
            .build();
        let _ = METER.set(provider.clone());
        Some(provider)
    } else {
        None
    };
    if !requested() {
        let telemetry = metrics.map(|metrics| Telemetry {
            traces: None,
            metrics: Some(metrics),
        });
        return Ok((telemetry, None));
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| {
            anyhow::anyhow!("OTEL_EXPORTER_OTLP_*: cannot build the OTLP exporter: {e}")
        })?;
    let queue = queue_size()?;
    let counted = CountingExporter {
        inner: exporter,
        queued: SPANS.queued.clone(),
    };
    let batch = BatchSpanProcessor::builder(counted)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(queue)
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(BoundedProcessor {
            inner: batch,
            cap: queue,
            queued: SPANS.queued.clone(),
        })
        .with_resource(resource)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer("neocloud-node");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_filter(
            tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE),
        );
    ENABLED.store(true, Ordering::Relaxed);
    let telemetry = Telemetry {
        traces: Some(provider),
        metrics,
    };
    Ok((Some(telemetry), Some(layer)))
}

use tracing_subscriber::Layer as _;

/// The W3C `traceparent` of `span` (`00-<trace id>-<span id>-01`), if it is exported.
pub fn traceparent(span: &Span) -> Option<String> {
    if !enabled() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

/// Records a span named `name` from `start` to now, as a child of `traceparent` (a binding's),
/// with `attributes`: the part of a placement that happens after the reconcile that rented.
pub fn record_after(
    traceparent: &str,
    name: &'static str,
    start: std::time::SystemTime,
    attributes: Vec<KeyValue>,
) {
    if !enabled() {
        return;
    }
    let mut carrier = std::collections::HashMap::new();
    carrier.insert("traceparent".to_owned(), traceparent.to_owned());
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
    if !parent.span().span_context().is_valid() {
        return;
    }
    let tracer = opentelemetry::global::tracer("neocloud-node");
    let mut span = tracer
        .span_builder(name)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(&tracer, &parent);
    span.end();
}

/// `OTEL_BSP_MAX_QUEUE_SIZE`, 2,048 when unset.
fn queue_size() -> anyhow::Result<usize> {
    parse_queue_size(std::env::var(QUEUE_SIZE).ok().as_deref())
}

const QUEUE_SIZE: &str = "OTEL_BSP_MAX_QUEUE_SIZE";

fn parse_queue_size(value: Option<&str>) -> anyhow::Result<usize> {
    const NAME: &str = QUEUE_SIZE;
    match value {
        None => Ok(2_048),
        Some(v) if v.trim().is_empty() => Ok(2_048),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => anyhow::bail!("{NAME}: {v:?} is not a queue size (a whole number above 0)"),
        },
    }
}

/// Why a span was not exported, for `neocloud_trace_spans_dropped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The queue in front of the exporter held `OTEL_BSP_MAX_QUEUE_SIZE` spans already.
    QueueFull,
    /// The collector refused the batch, or could not be reached in time.
    ExportFailed,
}

impl DropReason {
    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::ExportFailed => "export_failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The span counters, shared by the exporter and the metrics registry.
#[derive(Debug)]
pub struct SpanCounters {
    exported: Counter,
    dropped: Family<ReasonLabels, Counter>,
    /// Spans handed to the batch processor and not yet to the exporter.
    queued: std::sync::Arc<AtomicUsize>,
}

static SPANS: LazyLock<SpanCounters> = LazyLock::new(|| SpanCounters {
    exported: Counter::default(),
    dropped: Family::default(),
    queued: std::sync::Arc::default(),
});

impl SpanCounters {
    fn drop_spans(&self, reason: DropReason, n: usize) {
        let reason = match reason {
            DropReason::QueueFull => "queue_full",
            DropReason::ExportFailed => "export_failed",
        };
        self.dropped
            .get_or_create(&ReasonLabels { reason })
            .inc_by(n as u64);
    }
}

/// Registers `trace_spans_exported` and `trace_spans_dropped` (by reason) in `registry`.
pub fn register_metrics(registry: &mut prometheus_client::registry::Registry) {
    registry.register(
        "trace_spans_exported",
        "Spans the OTLP exporter delivered to the collector",
        SPANS.exported.clone(),
    );
    registry.register(
        "trace_spans_dropped",
        "Spans not exported, by reason (queue_full, export_failed)",
        SPANS.dropped.clone(),
    );
}

/// How many spans were dropped for `reason`; the series exists (at 0) from the first call.
pub fn dropped(reason: DropReason) -> u64 {
    SPANS
        .dropped
        .get_or_create(&ReasonLabels {
            reason: reason.label(),
        })
        .get()
}

/// The SDK's batch processor behind a queue bound it counts: a span ended while `cap` spans
/// wait for the exporter is dropped here and counted (the SDK's own queue, of the same size,
/// then never drops silently).
#[derive(Debug)]
struct BoundedProcessor<P> {
    inner: P,
    cap: usize,
    queued: std::sync::Arc<AtomicUsize>,
}

impl<P: SpanProcessor> SpanProcessor for BoundedProcessor<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let admitted = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .is_ok();
        if admitted {
            self.inner.on_end(span);
        } else {
            SPANS.drop_spans(DropReason::QueueFull, 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting what it delivers and what it fails to, and releasing queue
/// places as batches leave the queue.
#[derive(Debug)]
struct CountingExporter<E> {
    inner: E,
    queued: std::sync::Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        // The batch has left the queue: its places are free while it is sent.
        let _ = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(n))
            });
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                SPANS.exported.inc_by(n as u64);
            }
            Err(_) => SPANS.drop_spans(DropReason::ExportFailed, n),
        }
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_queue_size_names_the_variable_and_the_value() {
        let err = parse_queue_size(Some("lots")).unwrap_err().to_string();
        assert!(
            err.contains(QUEUE_SIZE) && err.contains("\"lots\""),
            "{err}"
        );
        let zero = parse_queue_size(Some("0")).unwrap_err().to_string();
        assert!(zero.contains("\"0\""), "{zero}");
        assert_eq!(parse_queue_size(Some(" 16 ")).unwrap(), 16);
        assert_eq!(parse_queue_size(None).unwrap(), 2_048);
        assert_eq!(parse_queue_size(Some("")).unwrap(), 2_048);
    }
}
