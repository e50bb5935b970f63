//! Traces exported as OpenTelemetry spans over OTLP/HTTP (`[telemetry]
//! otlp-endpoint`, or `OTEL_EXPORTER_OTLP_ENDPOINT`).
//!
//! A span is recorded where the work happens (an append and its commit, a
//! delivery attempt, a wake, an effect attempt, a reactor, an ITX call) and
//! handed to a bounded queue; one task sends what is queued with the
//! `opentelemetry-otlp` exporter, through the host's `reqwest` client. The
//! queue is never waited for: a span that finds it full is dropped and
//! counted (`streamhost_trace_spans_total{outcome="dropped"}`), so an
//! unreachable collector costs nothing but spans. Sampling is parent-based:
//! a caller's `traceparent` decides with its sampled flag; a trace started
//! here is sampled with `[telemetry] sample-ratio`.
//!
//! What a span hands on (the W3C context its work carries to what it
//! causes) is the span's own context when it is exported, else its parent's
//! unchanged: without an endpoint, traces pass through untouched.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use tokio::sync::mpsc;

use crate::config::TelemetryConfig;
use crate::metrics::Metrics;
use crate::trace::Trace;

/// Spans sent in one export request at most.
const EXPORT_BATCH_MAX: usize = 512;

/// How long the exporter gathers spans after the first of a batch.
const EXPORT_LINGER: Duration = Duration::from_millis(100);

/// The longest an export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Span events (guest output lines) kept per span at most; the rest are
/// counted as dropped.
pub const SPAN_EVENTS_MAX: usize = 32;

/// The host's trace export: off (the default), or a queue to the OTLP
/// endpoint. Cheap to clone.
#[derive(Clone, Default)]
pub struct Telemetry {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    queue: mpsc::Sender<SpanData>,
    ratio: f64,
    metrics: Metrics,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("on", &self.inner.is_some())
            .finish()
    }
}

/// A span begun: what its work hands on, and what its end records.
#[derive(Debug, Clone)]
pub struct Span {
    /// The context its work carries to what it causes.
    pub handed_on: Trace,
    parent_id: Option<SpanId>,
    span_id: SpanId,
    sampled: bool,
    start: SystemTime,
}

/// What a span's end records.
#[derive(Debug, Default)]
pub struct Record {
    /// Attributes (`streamhost.stream.path`, ...).
    pub attributes: Vec<KeyValue>,
    /// Events in the span (guest output lines), with their times.
    pub events: Vec<(String, SystemTime)>,
    /// Events left out before these (counted as the span's dropped events).
    pub dropped_events: usize,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// One span told after the fact, with its own ids and times
/// (`GET {stream}:events/{offset}/trace?export=true`).
#[derive(Debug, Clone)]
pub struct Told {
    /// 16 bytes.
    pub trace_id: [u8; 16],
    /// 8 bytes.
    pub span_id: [u8; 8],
    /// The parent span's id, if any.
    pub parent_id: Option<[u8; 8]>,
    /// The span's name.
    pub name: String,
    /// When it started and ended.
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
    pub error: Option<String>,
}

impl Span {
    /// Gives the events this span appends its context: those without one,
    /// and those of its own trace.
    pub fn carry(&self, events: &mut [crate::stream::EventInput]) {
        let id = self.handed_on.trace_id();
        for e in events {
            if e.trace.as_ref().is_none_or(|t| t.trace_id() == id) {
                e.trace = Some(self.handed_on.clone());
            }
        }
    }

    /// Hands this span's context on to `events` of its own trace (what a
    /// delivery attempt sends or copies).
    pub fn hand_on(&self, events: &mut [crate::stream::Event]) {
        let id = self.handed_on.trace_id();
        for e in events {
            if e.trace.as_ref().is_some_and(|t| t.trace_id() == id) {
                e.trace = Some(self.handed_on.clone());
            }
        }
    }
}

impl Record {
    /// The attributes naming a stream.
    pub fn of_stream(stream: &crate::stream::StreamAddress) -> Record {
        Record::of_path(stream.namespace.project_id(), &stream.path)
    }

    /// The attributes naming the stream at `path` of `project`.
    pub fn of_path(project: Option<&str>, path: &str) -> Record {
        let mut attributes = vec![KeyValue::new("streamhost.stream.path", path.to_string())];
        if let Some(p) = project.filter(|p| !p.is_empty()) {
            attributes.push(KeyValue::new("streamhost.project", p.to_string()));
        }
        Record {
            attributes,
            ..Record::default()
        }
    }

    /// An append of `count` events to `stream` and its outcome.
    pub fn of_append(
        stream: &crate::stream::StreamAddress,
        count: usize,
        appended: &Result<crate::stream::AppendOutput, crate::Error>,
    ) -> Record {
        let mut r = Record::of_stream(stream);
        r.attributes
            .push(KeyValue::new("streamhost.append.events", count as i64));
        match appended {
            Ok(out) => {
                if let (Some(first), Some(last)) = (out.events.first(), out.events.last()) {
                    r.attributes.push(KeyValue::new(
                        "streamhost.offset.first",
                        first.offset as i64,
                    ));
                    r.attributes
                        .push(KeyValue::new("streamhost.offset.last", last.offset as i64));
                }
            }
            Err(e) => r.error = Some(format!("{}: {}", e.code, e.message)),
        }
        r
    }

    /// One more attribute.
    pub fn with(mut self, key: &'static str, value: impl Into<opentelemetry::Value>) -> Record {
        self.attributes.push(KeyValue::new(key, value));
        self
    }
}

impl Telemetry {
    /// Export as `config` says (nothing without an endpoint). Starts the
    /// export task: must be called inside a Tokio runtime.
    pub fn start(config: &TelemetryConfig, metrics: Metrics) -> anyhow::Result<Telemetry> {
        let Some(base) = config.endpoint() else {
            return Ok(Telemetry::default());
        };
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            anyhow::bail!("the OTLP endpoint {base:?} is not an http:// or https:// URL");
        }
        use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(HttpClient(
                reqwest::Client::builder()
                    .user_agent(concat!("streamhost/", env!("CARGO_PKG_VERSION")))
                    .build()?,
            ))
            .with_endpoint(format!("{base}/v1/traces"))
            .with_timeout(EXPORT_TIMEOUT)
            .build()?;
        exporter.set_resource(
            &opentelemetry_sdk::Resource::builder()
                .with_service_name("streamhost")
                .build(),
        );
        let (queue, mut spans) = mpsc::channel::<SpanData>(config.max_queued_spans);
        let counts = metrics.clone();
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(EXPORT_BATCH_MAX);
            while spans.recv_many(&mut batch, EXPORT_BATCH_MAX).await > 0 {
                tokio::time::sleep(EXPORT_LINGER).await;
                while batch.len() < EXPORT_BATCH_MAX {
                    match spans.try_recv() {
                        Ok(s) => batch.push(s),
                        Err(_) => break,
                    }
                }
                let n = batch.len() as u64;
                let sent = std::mem::replace(&mut batch, Vec::with_capacity(EXPORT_BATCH_MAX));
                match tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(sent)).await {
                    Ok(Ok(())) => counts.trace_spans("exported", n),
                    Ok(Err(e)) => {
                        counts.trace_spans("failed", n);
                        tracing::debug!(error = %e, spans = n, "exporting trace spans failed");
                    }
                    Err(_) => {
                        counts.trace_spans("failed", n);
                        tracing::debug!(spans = n, "exporting trace spans timed out");
                    }
                }
            }
        });
        tracing::info!(endpoint = %base, ratio = config.sample_ratio, "exporting trace spans over OTLP/HTTP");
        Ok(Telemetry {
            inner: Some(Arc::new(Inner {
                queue,
                ratio: config.sample_ratio,
                metrics,
            })),
        })
    }

    /// Whether spans are exported.
    pub fn on(&self) -> bool {
        self.inner.is_some()
    }

    /// Begins a span under `parent` (a caller's context, an event's), or a
    /// new trace without one: `None` when nothing is exported (what the
    /// work hands on is then `parent`, unchanged).
    pub fn begin(&self, parent: Option<&Trace>) -> Option<Span> {
        let inner = self.inner.as_ref()?;
        let span_id = random_span_id();
        Some(match parent {
            Some(p) => Span {
                handed_on: p.child(span_id),
                parent_id: SpanId::from_hex(p.parent_id()).ok(),
                span_id: SpanId::from_bytes(span_id),
                sampled: p.sampled(),
                start: SystemTime::now(),
            },
            None => {
                let trace_id = random_trace_id();
                let sampled = ratio_samples(inner.ratio, trace_id);
                let mut handed_on = Trace::root(trace_id, span_id);
                if !sampled {
                    handed_on.traceparent.replace_range(53..55, "00");
                }
                Span {
                    handed_on,
                    parent_id: None,
                    span_id: SpanId::from_bytes(span_id),
                    sampled,
                    start: SystemTime::now(),
                }
            }
        })
    }

    /// Begins a span under `parent` that started at `start` (work timed
    /// before its trace was known: a wake learns it from what it folded).
    pub fn begin_at(&self, parent: &Trace, start: SystemTime) -> Option<Span> {
        let mut span = self.begin(Some(parent))?;
        span.start = start;
        Some(span)
    }

    /// Ends `span` now: queued for export when sampled, dropped (and
    /// counted) when the queue is full.
    pub fn end(
        &self,
        span: Span,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        record: Record,
    ) {
        let Some(inner) = self.inner.as_ref() else {
            return;
        };
        if !span.sampled {
            return;
        }
        let Ok(trace_id) = TraceId::from_hex(span.handed_on.trace_id()) else {
            return;
        };
        let trace_state = span
            .handed_on
            .tracestate
            .as_deref()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let context = SpanContext::new(
            trace_id,
            span.span_id,
            TraceFlags::SAMPLED,
            false,
            trace_state,
        );
        let dropped_events = (record.events.len().saturating_sub(SPAN_EVENTS_MAX)
            + record.dropped_events)
            .min(u32::MAX as usize) as u32;
        let events = record
            .events
            .into_iter()
            .take(SPAN_EVENTS_MAX)
            .map(|(text, at)| opentelemetry::trace::Event::new(text, at, Vec::new(), 0))
            .collect();
        inner.send(SpanData {
            span_context: context,
            parent_span_id: span.parent_id.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: span.parent_id.is_some(),
            span_kind: kind,
            name: name.into(),
            start_time: span.start,
            end_time: SystemTime::now(),
            attributes: record.attributes,
            dropped_attributes_count: 0,
            events: span_events(events, dropped_events),
            links: SpanLinks::default(),
            status: status(record.error),
            instrumentation_scope: scope(),
        });
    }

    /// Sends spans told after the fact (ids and times their own); answers
    /// how many were handed to the export queue (0 when nothing is
    /// exported here).
    pub fn tell(&self, spans: Vec<Told>) -> usize {
        let Some(inner) = self.inner.as_ref() else {
            return 0;
        };
        let count = spans.len();
        for s in spans {
            inner.send(SpanData {
                span_context: SpanContext::new(
                    TraceId::from_bytes(s.trace_id),
                    SpanId::from_bytes(s.span_id),
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::default(),
                ),
                parent_span_id: s.parent_id.map_or(SpanId::INVALID, SpanId::from_bytes),
                parent_span_is_remote: false,
                span_kind: SpanKind::Internal,
                name: s.name.into(),
                start_time: s.start,
                end_time: s.end.max(s.start),
                attributes: s.attributes,
                dropped_attributes_count: 0,
                events: SpanEvents::default(),
                links: SpanLinks::default(),
                status: status(s.error),
                instrumentation_scope: scope(),
            });
        }
        count
    }
}

impl Inner {
    fn send(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            self.metrics.trace_spans("dropped", 1);
        }
    }
}

fn span_events(events: Vec<opentelemetry::trace::Event>, dropped: u32) -> SpanEvents {
    let mut all = SpanEvents::default();
    all.events = events;
    all.dropped_count = dropped;
    all
}

fn status(error: Option<String>) -> Status {
    match error {
        Some(e) => Status::error(e),
        None => Status::Unset,
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("streamhost")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// A random span id, never all zero.
fn random_span_id() -> [u8; 8] {
    let mut id = [0u8; 8];
    getrandom::fill(&mut id).expect("the system's random source");
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

/// A random trace id, never all zero.
fn random_trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).expect("the system's random source");
    if id == [0; 16] {
        id[15] = 1;
    }
    id
}

/// Whether a new trace is sampled at `ratio`: its id's low 8 bytes below
/// the ratio's share of their range (as OpenTelemetry's `TraceIdRatioBased`).
fn ratio_samples(ratio: f64, trace_id: [u8; 16]) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    let bound = (ratio * (1u64 << 63) as f64) as u64;
    (u64::from_be_bytes(low) >> 1) < bound
}

/// The exporter's HTTP client: the host's `reqwest` (the exporter runs on
/// the host's runtime).
#[derive(Debug)]
struct HttpClient(reqwest::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for HttpClient {
    async fn send_bytes(
        &self,
        request: axum::http::Request<bytes::Bytes>,
    ) -> Result<axum::http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let mut sent = self
            .0
            .request(parts.method, parts.uri.to_string())
            .body(body);
        for (name, value) in &parts.headers {
            sent = sent.header(name, value);
        }
        let answer = sent.send().await?;
        let status = answer.status().as_u16();
        let bytes = answer.bytes().await?;
        Ok(axum::http::Response::builder().status(status).body(bytes)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_traces_are_sampled_at_the_ratio() {
        let ids: Vec<[u8; 16]> = (0..4000).map(|_| random_trace_id()).collect();
        let share = |r: f64| ids.iter().filter(|id| ratio_samples(r, **id)).count() as f64 / 4000.0;
        assert_eq!(share(1.0), 1.0);
        assert_eq!(share(0.0), 0.0);
        let quarter = share(0.25);
        assert!((0.2..0.3).contains(&quarter), "{quarter}");
    }

    #[test]
    fn without_an_endpoint_nothing_begins_and_a_parent_passes_untouched() {
        let off = Telemetry::default();
        let parent = Trace::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            None,
        )
        .unwrap();
        assert!(off.begin(Some(&parent)).is_none());
    }
}
