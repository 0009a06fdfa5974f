//! Logs, traces and metrics, set up once per process by [`init`].
//!
//! * Logs: `tracing` to stdout, JSON by default (one object a line, with the
//!   enclosing spans' fields, so `event_id` and `trace_id` are on every line
//!   logged while handling an event), level from `RUST_LOG`.
//! * Traces: W3C trace context is always created and propagated (so logs of
//!   all services correlate by `trace_id`); spans are exported with
//!   OTLP/HTTP only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (Jaeger accepts
//!   OTLP directly).
//! * Metrics: a Prometheus recorder rendered by `/metrics`.
//!
//! Span and log fields hold identifiers, hashes, decisions and timings only.

use std::sync::OnceLock;

use anyhow::Context as _;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::CommonConfig;

/// Flushes and shuts the trace exporter down when dropped: keep it alive
/// until the end of `main`.
#[must_use = "dropping the guard stops trace export"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Installs logging, tracing and the metrics recorder for `service`.
pub fn init(service: &'static str, cfg: &CommonConfig) -> anyhow::Result<TelemetryGuard> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    // Logs follow RUST_LOG; traces do not, so that quieter logs never
    // break a trace across services.
    let log_filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (json, text) = if cfg.log_json {
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .with_filter(log_filter());
        (Some(layer), None)
    } else {
        let layer = tracing_subscriber::fmt::layer()
            .compact()
            .with_filter(log_filter());
        (None, Some(layer))
    };
    let resource = Resource::builder()
        .with_service_name(service)
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    let mut builder = SdkTracerProvider::builder().with_resource(resource);
    if let Some(base) = &cfg.otlp_endpoint {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{}/v1/traces", base.trim_end_matches('/')))
            .build()
            .context("building the OTLP span exporter (OTEL_EXPORTER_OTLP_ENDPOINT)")?;
        builder = builder.with_batch_exporter(exporter);
    }
    // Without an exporter the provider still gives every span its ids, so
    // trace context crosses the bus and log lines correlate.
    let provider = Some(builder.build());
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(service))
            .with_filter(EnvFilter::new(
                "info,h2=off,hyper=off,tower=off,sqlx=off,async_nats=off",
            ))
    });
    tracing_subscriber::registry()
        .with(json)
        .with(text)
        .with(otel)
        .try_init()
        .context("installing the tracing subscriber")?;
    metrics_handle();
    Ok(TelemetryGuard { provider })
}

/// The process-wide Prometheus recorder, installed on first use.
pub fn metrics_handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Suffix("_seconds".into()),
                &[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ],
            )
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (a test harness); the
        // handle then renders an empty registry rather than failing.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// Records `span`'s trace id in its `trace_id` field (declared empty), so
/// every log line inside it names the trace.
pub fn record_trace_id(span: &tracing::Span) {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if sc.is_valid() {
        span.record("trace_id", tracing::field::display(sc.trace_id()));
    }
}

/// The W3C trace context of the current span, to store with work that
/// leaves this process (outbox rows, bus messages). Empty when tracing is
/// not exported.
pub fn current_trace_carrier() -> TraceCarrier {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = tracing::Span::current().context();
    let mut carrier = TraceCarrier::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier
}

/// Writes the current span's W3C trace context into NATS headers.
pub fn inject_current(headers: &mut async_nats::HeaderMap) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeaderInjector(headers))
    });
}

/// Writes W3C trace context into NATS headers.
pub struct HeaderInjector<'a>(pub &'a mut async_nats::HeaderMap);

impl opentelemetry::propagation::Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

/// Reads W3C trace context from NATS headers.
pub struct HeaderExtractor<'a>(pub &'a async_nats::HeaderMap);

impl opentelemetry::propagation::Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_ref()).collect()
    }
}

/// Trace context as plain key/value pairs (what the outbox stores).
pub type TraceCarrier = std::collections::HashMap<String, String>;
