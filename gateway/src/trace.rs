//! Request traces, exported over OTLP (HTTP + protobuf, a collector's port 4318) by the
//! OpenTelemetry SDK when `--otlp-endpoint` is given.
//!
//! One span per request (kind server, a child of the client's W3C `traceparent` when it sends
//! one) with a child per phase — auth, template, normalize, tokenize, route — and the engine's
//! own timings of the first choice as queue, prefill and decode (from where the gateway handed
//! the request to the engine or worker). The request's trace context goes on to workers and
//! OpenAI-compatible upstreams as `traceparent`; without an exporter, a client's `traceparent`
//! still goes on unchanged, so traces continue across a gateway that does not export its own.
//! Spans are built with explicit times (phases measured as the request runs), ended when the
//! response ends, and exported in batches off the request path (`OTEL_BSP_*` tune the batches).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use cachet_backend::request::RequestTimings;

/// The exporter and the tracer requests' spans come from.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tracing")
    }
}

/// Why spans cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(
        "--otlp-endpoint `{0}`: an http:// or https:// URL (a collector's OTLP/HTTP port, 4318)"
    )]
    NotHttp(String),
    #[error("OTLP exporter")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
}

impl Tracing {
    /// Spans of `service` exported to the OTLP/HTTP endpoint at `base` (its `/v1/traces`, as
    /// OTEL_EXPORTER_OTLP_ENDPOINT means).
    pub fn new(base: &str, service: &str) -> Result<Self, TraceError> {
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(TraceError::NotHttp(base.to_string()));
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{}/v1/traces", base.trim_end_matches('/')))
            .build()
            .map_err(TraceError::Exporter)?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(service.to_string())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("cachet");
        Ok(Tracing { provider, tracer })
    }

    /// Exports what is still batched (at drain).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "flushing the last spans");
        }
    }
}

/// A `traceparent` as W3C trace context writes it: `00-<32 hex>-<16 hex>-<2 hex>`.
pub fn valid_traceparent(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1] != "0".repeat(32)
        && hex(parts[2], 16)
        && parts[2] != "0".repeat(16)
        && hex(parts[3], 2)
}

struct Headers<'a>(&'a hyper::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// One request's trace: its span (when exporting) and the context it passes on.
pub struct RequestTrace {
    tracer: Option<SdkTracer>,
    /// The request span's context (exporting), or the client's (not exporting).
    cx: Context,
    /// What goes on to upstreams as `traceparent`.
    parent_header: Option<String>,
    /// Instants of this request as wall-clock times (spans carry SystemTime).
    base: (Instant, SystemTime),
    /// When the engine (or worker) was handed the request.
    sent: Mutex<Option<Instant>>,
    engine_seen: AtomicBool,
}

impl std::fmt::Debug for RequestTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTrace")
            .field("traceparent", &self.parent_header)
            .finish_non_exhaustive()
    }
}

impl RequestTrace {
    /// The trace of a request to `route` that arrived at `arrived` with `headers`.
    pub fn start(
        tracing: Option<&Tracing>,
        headers: &hyper::HeaderMap,
        route: &str,
        arrived: Instant,
    ) -> RequestTrace {
        let base = (arrived, SystemTime::now() - arrived.elapsed());
        let client = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .filter(|v| valid_traceparent(v));
        let propagator = TraceContextPropagator::new();
        let parent = match client {
            Some(_) => propagator.extract(&Headers(headers)),
            None => Context::new(),
        };
        let Some(t) = tracing else {
            return RequestTrace {
                tracer: None,
                cx: parent,
                parent_header: client.map(str::to_string),
                base,
                sent: Mutex::new(None),
                engine_seen: AtomicBool::new(false),
            };
        };
        let span = t
            .tracer
            .span_builder(format!("POST {route}"))
            .with_kind(SpanKind::Server)
            .with_start_time(base.1)
            .with_attributes([
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("http.route", route.to_string()),
            ])
            .start_with_context(&t.tracer, &parent);
        let cx = parent.with_span(span);
        let mut carrier = HashMap::new();
        propagator.inject_context(&cx, &mut carrier);
        RequestTrace {
            tracer: Some(t.tracer.clone()),
            parent_header: carrier.remove("traceparent"),
            cx,
            base,
            sent: Mutex::new(None),
            engine_seen: AtomicBool::new(false),
        }
    }

    fn wall(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.base.0) {
            Some(d) => self.base.1 + d,
            None => self.base.1 - self.base.0.duration_since(at),
        }
    }

    /// The `traceparent` for upstream requests, if there is a trace.
    pub fn traceparent(&self) -> Option<&str> {
        self.parent_header.as_deref()
    }

    /// A child span `name` from `start` to `end`.
    pub fn phase(&self, name: &'static str, start: Instant, end: Instant) {
        self.phase_with(name, start, end, Vec::new());
    }

    fn phase_with(&self, name: &'static str, start: Instant, end: Instant, attrs: Vec<KeyValue>) {
        let Some(t) = &self.tracer else { return };
        let mut span = t
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(self.wall(start))
            .with_attributes(attrs)
            .start_with_context(t, &self.cx);
        span.end_with_timestamp(self.wall(end.max(start)));
    }

    /// Runs `f` as the phase `name`.
    pub fn time<T>(&self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let r = f();
        self.phase(name, t0, Instant::now());
        r
    }

    /// The request is handed to the engine or worker now.
    pub fn sent(&self) {
        *self.sent.lock().expect("trace lock") = Some(Instant::now());
    }

    /// The engine's timings of the first finished choice: queue, prefill and decode spans from
    /// when it was handed the request.
    pub fn engine(&self, t: &RequestTimings) {
        if self.tracer.is_none() {
            return;
        }
        let Some(sent) = *self.sent.lock().expect("trace lock") else {
            return;
        };
        if self.engine_seen.swap(true, Ordering::Relaxed) {
            return;
        }
        let scheduled = sent + t.queue;
        let first = sent + t.ttft.max(t.queue);
        self.phase("queue", sent, scheduled);
        self.phase_with(
            "prefill",
            scheduled,
            first.max(scheduled + t.prefill.min(t.ttft)),
            vec![KeyValue::new(
                "cachet.preemptions",
                i64::from(t.preemptions),
            )],
        );
        self.phase("decode", first, sent + t.e2e.max(t.ttft));
    }

    /// Attributes of the request span, made only when it is exported (the request path pays
    /// nothing for them otherwise).
    pub fn attributes<I: IntoIterator<Item = KeyValue>>(&self, attrs: impl FnOnce() -> I) {
        if self.tracer.is_some() {
            self.cx.span().set_attributes(attrs());
        }
    }

    /// The request's tokens, as the GenAI conventions name them.
    pub fn usage(&self, input: u64, output: u64) {
        self.attributes(|| {
            [
                KeyValue::new("gen_ai.usage.input_tokens", input as i64),
                KeyValue::new("gen_ai.usage.output_tokens", output as i64),
            ]
        });
    }

    /// Ends the request span with the response's status.
    pub fn end(&self, status: u16) {
        if self.tracer.is_none() {
            return;
        }
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            span.set_status(Status::error(format!("HTTP {status}")));
        }
        span.end_with_timestamp(SystemTime::now());
    }
}

/// A span that never ends is never exported: a request dropped without [`RequestTrace::end`]
/// (its future cancelled) still ends here.
impl Drop for RequestTrace {
    fn drop(&mut self) {
        if self.tracer.is_some() {
            // Ending twice is a no-op for the SDK's span.
            self.cx.span().end_with_timestamp(SystemTime::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_checked_as_w3c_writes_them() {
        assert!(valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
    }

    #[test]
    fn without_an_exporter_a_clients_traceparent_goes_on_unchanged() {
        let mut h = hyper::HeaderMap::new();
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        h.insert("traceparent", tp.parse().unwrap());
        let t = RequestTrace::start(None, &h, "/v1/chat/completions", Instant::now());
        assert_eq!(t.traceparent(), Some(tp));
        h.insert("traceparent", "garbage".parse().unwrap());
        let t = RequestTrace::start(None, &h, "/v1/chat/completions", Instant::now());
        assert_eq!(t.traceparent(), None);
    }
}
