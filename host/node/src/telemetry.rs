//! OTLP trace export, off unless `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set (and `OTEL_SDK_DISABLED` is not `true`): one trace per
//! Pod placement (translation, policy evaluations, planning, each provider call, the rental),
//! and a span for the wait from the rental to the Pod Running, parented by the `traceparent`
//! kept on the binding. Spans go over OTLP/HTTP protobuf through a batch processor with a
//! bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2,048 by default): when the collector is away,
//! spans are dropped, never buffered without bound, and placement goes on.
//!
//! The resource follows the OpenTelemetry semantic conventions: `service.name`
//! (`neocloud-node`), `service.version`, `k8s.cluster.name` (the config's `clusterId`), and
//! whatever `OTEL_RESOURCE_ATTRIBUTES` adds. Spans carry names and identities only: no
//! environment value, Secret or credential.
//!
//! Only the node's own spans are exported (target [`TARGET`]); its log lines and kube-runtime's
//! spans are not.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::KeyValue;
use opentelemetry::trace::{Span as _, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of every exported span.
pub const TARGET: &str = "neocloud::trace";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported: callers skip building spans otherwise.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The exporter's provider, to flush at exit.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Sends what is queued (bounded by the exporter's timeout).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "telemetry: flushing spans at exit failed");
        }
    }
}

/// Whether the standard variables ask for trace export.
pub fn requested() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

/// The exporter and the `tracing` layer that feeds it, when [`requested`]; `cluster` names
/// the cluster in the resource.
pub fn start<S>(
    cluster: Option<&str>,
) -> anyhow::Result<Option<(Telemetry, impl tracing_subscriber::Layer<S>)>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    if !requested() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| {
            anyhow::anyhow!("OTEL_EXPORTER_OTLP_*: cannot build the OTLP exporter: {e}")
        })?;
    let mut attributes = vec![KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))];
    if let Some(cluster) = cluster {
        attributes.push(KeyValue::new("k8s.cluster.name", cluster.to_owned()));
    }
    let resource = Resource::builder()
        .with_service_name("neocloud-node")
        .with_attributes(attributes)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
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
    Ok(Some((Telemetry { provider }, layer)))
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
