//! Process-wide tracing: `tracing` spans become OpenTelemetry spans
//! (`tracing-opentelemetry`), exported over OTLP/HTTP when an endpoint is
//! configured, with W3C Trace Context as the propagator.
//!
//! Without an endpoint the spans still get trace and span ids — so the
//! context still crosses every hop and every log line names its trace —
//! but nothing is exported and no exporter thread runs. `OTEL_SDK_DISABLED`
//! removes the OpenTelemetry layer entirely (no ids, no cost).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

/// The target of the events every order causes on the hot path ("order
/// placed", "saga transition", "payment settled"), at DEBUG: each is a
/// span event in the order's trace whatever the log filter says, and a
/// log line only when the filter asks for it
/// (`RUST_LOG=info,effectively_once::per_order=debug`). Written to the log
/// at INFO, they cost every order a formatted line per service.
pub const PER_ORDER: &str = "effectively_once::per_order";

/// How a process logs and traces.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `service.name` of every span, and the `service` label of every metric.
    pub service: &'static str,
    /// Log filter in `tracing` syntax (also decides which spans exist).
    pub filter: String,
    /// One JSON object per line instead of text.
    pub json: bool,
    /// OTLP/HTTP base URL (`…:4318`); spans go to `<endpoint>/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// Fraction of new traces sampled (a trace started elsewhere keeps its
    /// parent's decision).
    pub sample_ratio: f64,
    /// No OpenTelemetry layer at all.
    pub disabled: bool,
}

/// Flushes and stops the exporter when dropped (end of `main`).
pub struct Guard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5)) {
                eprintln!("trace exporter shutdown: {e}");
            }
        }
    }
}

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OTLP exporter could not be built (bad endpoint).
    #[error("otlp exporter: {0}")]
    Exporter(String),
}

/// Installs the global subscriber (logs + spans) and the W3C propagator.
/// A second call in one process (tests that start several services) keeps
/// the first subscriber.
pub fn init(settings: &Settings) -> Result<Guard, Error> {
    crate::metrics::set_service(settings.service);
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    // The per-order events are enabled (the spans carry them); the log
    // shows them only when the filter names their target.
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
        .add_directive(format!("{PER_ORDER}=debug").parse().expect("a valid directive"));
    let log_per_order = settings.filter.contains(PER_ORDER);
    let in_log = tracing_subscriber::filter::filter_fn(move |meta| {
        log_per_order || !meta.is_event() || meta.target() != PER_ORDER
    });
    let fmt = if settings.json {
        tracing_subscriber::fmt::layer()
            .json()
            .event_format(crate::logfmt::WithTraceIds::json())
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .event_format(crate::logfmt::WithTraceIds::text())
            .boxed()
    };
    let (otel, provider) = if settings.disabled {
        (None, None)
    } else {
        let provider = provider(settings)?;
        let tracer = provider.tracer(settings.service);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false);
        (Some(layer), Some(provider))
    };
    let _ = tracing_subscriber::registry()
        .with(otel)
        .with(fmt.with_filter(in_log))
        .with(filter)
        .try_init();
    if let Some(p) = &provider {
        opentelemetry::global::set_tracer_provider(p.clone());
    }
    Ok(Guard { provider })
}

fn provider(settings: &Settings) -> Result<SdkTracerProvider, Error> {
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sample_ratio)));
    let resource = Resource::builder().with_service_name(settings.service).build();
    let mut builder = SdkTracerProvider::builder()
        .with_sampler(sampler)
        .with_resource(resource);
    if let Some(endpoint) = &settings.otlp_endpoint {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::Exporter(e.to_string()))?;
        builder = builder.with_batch_exporter(exporter);
    }
    Ok(builder.build())
}
