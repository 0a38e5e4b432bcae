//! Logs through `tracing` (JSON or text, level from RUST_LOG, default info), and OpenTelemetry
//! traces over OTLP/HTTP when the standard OTEL_EXPORTER_OTLP_ENDPOINT is set. Without it no
//! exporter, no OpenTelemetry layer and no cost.

use std::io::IsTerminal;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Log line format (--log-format).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// Flushes buffered spans when dropped (at the end of `main`).
pub struct Guard(Option<SdkTracerProvider>);

impl Guard {
    pub fn exporting(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("flushing traces failed: {e}");
        }
    }
}

/// The OTLP endpoint if tracing export is configured, per the OpenTelemetry environment spec.
pub fn otlp_endpoint() -> Option<String> {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .into_iter()
    .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
}

pub fn init(service_name: &'static str, format: LogFormat) -> Guard {
    let provider = otlp_endpoint().and_then(|endpoint| match tracer_provider(service_name) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("OTLP export to {endpoint} disabled: {e}");
            None
        }
    });
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service_name)));
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    match format {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true),
            )
            .init(),
        // Colour only on a terminal: escape codes in files and log collectors are noise.
        LogFormat::Text => registry
            .with(fmt::layer().with_ansi(std::io::stdout().is_terminal()))
            .init(),
    }
    Guard(provider)
}

fn tracer_provider(
    service_name: &'static str,
) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    // The exporter reads OTEL_EXPORTER_OTLP_* (endpoint, headers, timeout) itself.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service_name).build())
        .build())
}

/// The OpenTelemetry trace id of the current span, for log lines; None when not exporting.
pub fn current_trace_id() -> Option<String> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}
