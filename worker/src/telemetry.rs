//! Logging and, opt-in by `--otlp-endpoint`, OpenTelemetry traces of the worker.
//!
//! The worker's span for an attempt's process (`runner.rs`) is a child of the attempt's span in
//! the run's trace: the scheduler sends the attempt's W3C `TRACEPARENT` in the dispatch's
//! environment (the task gets it too, and its own spans join the same trace).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use opentelemetry::Context;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Whether this process exports traces.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// What [`install`] set up; [`Installed::shutdown`] flushes the spans still queued.
pub struct Installed {
    provider: Option<SdkTracerProvider>,
}

impl Installed {
    /// Exports what is queued and stops the exporter (blocking: call off the async threads).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(err) = provider.shutdown()
        {
            tracing::warn!(error = %err, "flushing the last spans failed");
        }
    }
}

/// Logging to stderr (`RUST_LOG`, `info` by default) and, with an endpoint, the trace exporter
/// (OTLP over HTTP/protobuf to `<endpoint>/v1/traces`, or to the endpoint's own path).
pub fn install(endpoint: Option<&str>) -> anyhow::Result<Installed> {
    let provider = endpoint.map(provider).transpose()?;
    let otel = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("ax-worker")));
    tracing_subscriber::registry()
        .with(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(otel)
        .try_init()
        .context("setting up logging")?;
    EXPORTING.store(provider.is_some(), Ordering::Relaxed);
    Ok(Installed { provider })
}

/// The url spans are posted to: the endpoint as given when it names a path, else
/// `<endpoint>/v1/traces`.
pub fn traces_url(endpoint: &str) -> anyhow::Result<String> {
    let endpoint = endpoint.trim();
    let Some(rest) = endpoint.strip_prefix("http://") else {
        bail!(
            "otlp endpoint {endpoint:?}: expected http://HOST:PORT (plain http, to a collector or agent near the worker)"
        );
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        bail!("otlp endpoint {endpoint:?}: no host");
    }
    if path.trim_end_matches('/').is_empty() {
        Ok(format!("http://{host}/v1/traces"))
    } else {
        Ok(endpoint.to_string())
    }
}

fn provider(endpoint: &str) -> anyhow::Result<SdkTracerProvider> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig as _};
    let url = traces_url(endpoint)?;
    // The blocking HTTP client owns a runtime of its own: made off any Tokio thread.
    let exporter = std::thread::spawn(move || {
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(Duration::from_secs(10))
            .with_headers(HashMap::new())
            .build()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("building the OTLP exporter panicked"))?
    .context("building the OTLP exporter")?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("ax-worker")
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// A W3C `traceparent` (`00-<trace>-<span>-<flags>`) as a remote parent.
pub fn parse_traceparent(text: &str) -> Option<Context> {
    let mut parts = text.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let trace = TraceId::from_hex(trace)
        .ok()
        .filter(|id| *id != TraceId::INVALID)?;
    let span = SpanId::from_hex(span)
        .ok()
        .filter(|id| *id != SpanId::INVALID)?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
    Some(Context::new().with_remote_span_context(SpanContext::new(
        trace,
        span,
        flags,
        true,
        TraceState::default(),
    )))
}

/// Makes `span` a child of the dispatch's `TRACEPARENT`, when this process exports traces and
/// the dispatch carries one.
pub fn join_trace(span: &tracing::Span, env: &HashMap<String, String>) {
    if !EXPORTING.load(Ordering::Relaxed) {
        return;
    }
    if let Some(parent) = env
        .get("TRACEPARENT")
        .and_then(|text| parse_traceparent(text))
    {
        let _ = span.set_parent(parent);
        span.record("otel.name", "process");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_and_a_malformed_one_ignored() {
        let cx = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("valid");
        let span = cx.span();
        let parent = span.span_context();
        assert_eq!(
            parent.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");
        assert!(parent.is_remote() && parent.is_sampled());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-xyz-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn the_endpoint_gets_the_traces_path() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert!(traces_url("https://c:4318").is_err());
    }
}
