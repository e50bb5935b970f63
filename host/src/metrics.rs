//! Prometheus metrics served at `GET /metrics`: appends, commit latency and
//! group sizes, stream actors in memory, stream loads, delivery attempts,
//! halts and skips by receiver kind, processor wake time, reactor calls,
//! effect executions
//! and effects by status, pending ingest per project, subscription lag (the
//! ten furthest behind by name, and totals), and the memory SQLite holds
//! (page caches, statements). Labels have bounded values: receiver kinds,
//! outcomes, statuses, projects with pending ingest, the ten laggards.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The host's metrics. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    append_requests: Family<Vec<(String, String)>, Counter>,
    events_committed: Counter,
    trace_spans: Family<Vec<(String, String)>, Counter>,
    commit_seconds: Histogram,
    commit_writes: Histogram,
    commit_events: Histogram,
    stream_actors: Gauge,
    stream_loads: Family<Vec<(String, String)>, Counter>,
    effect_executions: Family<Vec<(String, String)>, Counter>,
    compiled_components: Gauge,
    compiled_code: Gauge,
    guest_memory: Gauge,
    guest_instances_parked: Gauge,
    guest_calls_made_ahead: Gauge,
    sqlite_memory: Gauge,
    delivery_attempts: Family<Vec<(String, String)>, Counter>,
    subscription_halts: Family<Vec<(String, String)>, Counter>,
    subscription_skips: Family<Vec<(String, String)>, Counter>,
    wake_seconds: Histogram,
    effect_due_lag_seconds: Histogram,
    reactor_calls: Family<Vec<(String, String)>, Counter>,
    effects: Family<Vec<(String, String)>, Gauge>,
    ingest_pending_events: Family<Vec<(String, String)>, Gauge>,
    project_stored_bytes: Family<Vec<(String, String)>, Gauge>,
    ingest_pending_bytes: Family<Vec<(String, String)>, Gauge>,
    ingest_blocked_streams: Gauge,
    ingest_parked_events: Family<Vec<(String, String)>, Gauge>,
    lag_top: Family<Vec<(String, String)>, Gauge>,
    lag_events: Gauge,
    lagging: Gauge,
}

/// Subscriptions named in `streamhost_subscription_lag_events`: the ones
/// furthest behind.
pub const LAG_TOP: usize = 10;

fn label(name: &str, value: &str) -> Vec<(String, String)> {
    vec![(name.to_string(), value.to_string())]
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("streamhost");
        let append_requests = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "append_requests",
            "Append requests answered, by outcome (ok or the error code)",
            append_requests.clone(),
        );
        let events_committed = Counter::default();
        registry.register(
            "events_committed",
            "Durable events committed to the log",
            events_committed.clone(),
        );
        let trace_spans = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "trace_spans",
            "Trace spans for the OTLP endpoint, by outcome: exported, dropped (the export queue was full) or failed (the collector refused or was unreachable)",
            trace_spans.clone(),
        );
        let commit_seconds = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register(
            "commit_duration_seconds",
            "Time of one group-commit transaction, fsync included",
            commit_seconds.clone(),
        );
        let commit_writes = Histogram::new(exponential_buckets(1.0, 2.0, 13));
        registry.register(
            "commit_group_writes",
            "Writes (stream rounds) coalesced into one transaction",
            commit_writes.clone(),
        );
        let commit_events = Histogram::new(exponential_buckets(1.0, 2.0, 16));
        registry.register(
            "commit_group_events",
            "Events committed by one transaction",
            commit_events.clone(),
        );
        let stream_actors = Gauge::default();
        registry.register(
            "stream_actors",
            "Stream actors in memory (idle ones are released)",
            stream_actors.clone(),
        );
        let stream_loads = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "stream_loads",
            "Loads of a stream into its actor, by outcome (ok or failed)",
            stream_loads.clone(),
        );
        let effect_executions = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "effect_executions",
            "Executions of processor effects, by what followed (succeeded, retry or failed)",
            effect_executions.clone(),
        );
        let compiled_components = Gauge::default();
        registry.register(
            "compiled_components",
            "Compiled components held in memory ([processors] compiled-code-bytes bounds their code)",
            compiled_components.clone(),
        );
        let compiled_code = Gauge::default();
        registry.register(
            "compiled_code_bytes",
            "Bytes of compiled code held in memory, over all components",
            compiled_code.clone(),
        );
        let guest_memory = Gauge::default();
        registry.register(
            "guest_memory_max_bytes",
            "The most linear memory one guest call's instance has had since the server started (every memory of the instance summed)",
            guest_memory.clone(),
        );
        let guest_instances_parked = Gauge::default();
        registry.register(
            "guest_instances_parked",
            "Fresh guest instances made ahead of their calls, waiting for one (components whose instantiation costs more than the call it serves)",
            guest_instances_parked.clone(),
        );
        let guest_calls_made_ahead = Gauge::default();
        registry.register(
            "guest_calls_made_ahead",
            "Guest calls since the server started that took an instance made ahead instead of instantiating one",
            guest_calls_made_ahead.clone(),
        );
        let sqlite_memory = Gauge::default();
        registry.register(
            "sqlite_memory_bytes",
            "Heap memory held by SQLite (page caches and prepared statements of every connection)",
            sqlite_memory.clone(),
        );
        let delivery_attempts = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "delivery_attempts",
            "Delivery attempts of subscriptions, by receiver kind (copy, webhook, itx, wake) and outcome (ok or failed)",
            delivery_attempts.clone(),
        );
        let subscription_halts = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "subscription_halts",
            "Subscriptions halted (a subscription-delivery-halted fact committed), by receiver kind",
            subscription_halts.clone(),
        );
        let subscription_skips = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "subscription_skips",
            "Failing events skipped by a subscription's skip policy, by receiver kind",
            subscription_skips.clone(),
        );
        let wake_seconds = Histogram::new(exponential_buckets(0.000_1, 2.0, 18));
        registry.register(
            "processor_wake_duration_seconds",
            "Time of one processor wake: the fold of its batches and the commit of its checkpoint",
            wake_seconds.clone(),
        );
        let effects = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "effects",
            "Effects in the outbox that are not done, by status (pending, running, failed; \
             waiting: pending and not yet due, for their not-before or a retry's backoff), read at scrape time",
            effects.clone(),
        );
        let effect_due_lag_seconds = Histogram::new(exponential_buckets(0.000_5, 2.0, 20));
        registry.register(
            "effect_due_lag_seconds",
            "How late a delayed effect's first attempt began after its not-before",
            effect_due_lag_seconds.clone(),
        );
        let project_stored_bytes = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "project_stored_bytes",
            "The bytes each project's stored events take, as counted against [limits] max-project-bytes (only when it is set), by project",
            project_stored_bytes.clone(),
        );
        let ingest_pending_events = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "ingest_pending_events",
            "Events accepted over HTTP ingest and not yet appended, by project, read at scrape time",
            ingest_pending_events.clone(),
        );
        let ingest_pending_bytes = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "ingest_pending_bytes",
            "Bytes of the pending ingest events, by project, read at scrape time",
            ingest_pending_bytes.clone(),
        );
        let ingest_blocked_streams = Gauge::default();
        registry.register(
            "ingest_blocked_streams",
            "Streams whose HTTP ingest waits because their next append was refused for now (GET /v1/ingest lists them with lastError), read at scrape time",
            ingest_blocked_streams.clone(),
        );
        let ingest_parked_events = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "ingest_parked_events",
            "Ingested events refused for good and kept until redriven or discarded (they count against ingest capacity), by project, read at scrape time",
            ingest_parked_events.clone(),
        );
        let reactor_calls = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "reactor_calls",
            "Reactor calls inside appends, by outcome (ok, or refused: the call failed the append)",
            reactor_calls.clone(),
        );
        let lag_top = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "subscription_lag_events",
            "Events after the cursor of the subscriptions furthest behind (the top 10 of the streams in memory), by stream and subscription key, read at scrape time",
            lag_top.clone(),
        );
        let lag_events = Gauge::default();
        registry.register(
            "subscriptions_lag_events",
            "Events after the cursors of every subscription of the streams in memory, summed, read at scrape time",
            lag_events.clone(),
        );
        let lagging = Gauge::default();
        registry.register(
            "subscriptions_lagging",
            "Subscriptions of the streams in memory with events after their cursor, read at scrape time",
            lagging.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                lag_top,
                lag_events,
                lagging,
                delivery_attempts,
                subscription_halts,
                subscription_skips,
                wake_seconds,
                effect_due_lag_seconds,
                reactor_calls,
                effects,
                ingest_pending_events,
                ingest_pending_bytes,
                project_stored_bytes,
                ingest_blocked_streams,
                ingest_parked_events,
                compiled_components,
                compiled_code,
                guest_memory,
                guest_instances_parked,
                guest_calls_made_ahead,
                sqlite_memory,
                effect_executions,
                stream_actors,
                stream_loads,
                registry,
                append_requests,
                events_committed,
                trace_spans,
                commit_seconds,
                commit_writes,
                commit_events,
            }),
        }
    }

    /// Counts one answered append request (`outcome`: `ok` or an error code).
    pub fn append_answered(&self, outcome: &str) {
        self.inner
            .append_requests
            .get_or_create(&vec![("outcome".to_string(), outcome.to_string())])
            .inc();
    }

    /// What storage's writer calls after each commit: counted here as
    /// [`Metrics::observe_commit`].
    pub fn commit_observer(&self) -> crate::storage::CommitObserver {
        let metrics = self.clone();
        std::sync::Arc::new(move |elapsed, writes, events| {
            metrics.observe_commit(elapsed, writes, events)
        })
    }

    /// Records one group-commit transaction.
    pub fn observe_commit(&self, elapsed: Duration, writes: usize, events: usize) {
        self.inner.commit_seconds.observe(elapsed.as_secs_f64());
        self.inner.commit_writes.observe(writes as f64);
        self.inner.commit_events.observe(events as f64);
        self.inner.events_committed.inc_by(events as u64);
    }

    /// Counts `n` trace spans by `outcome` (`exported`, `dropped`,
    /// `failed`).
    pub fn trace_spans(&self, outcome: &str, n: u64) {
        self.inner
            .trace_spans
            .get_or_create(&vec![("outcome".to_string(), outcome.to_string())])
            .inc_by(n);
    }

    /// A stream actor started (`+1`) or was released (`-1`).
    pub fn stream_actors_add(&self, n: i64) {
        self.inner.stream_actors.inc_by(n);
    }

    /// Counts one load of a stream into its actor.
    pub fn stream_loaded(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.inner
            .stream_loads
            .get_or_create(&vec![("outcome".to_string(), outcome.to_string())])
            .inc();
    }

    /// Counts one effect execution by what followed it.
    pub fn effect_executed(&self, outcome: &str) {
        self.inner
            .effect_executions
            .get_or_create(&vec![("outcome".to_string(), outcome.to_string())])
            .inc();
    }

    /// Counts one delivery attempt of a subscription.
    pub fn delivery_attempted(&self, receiver: &str, ok: bool) {
        let mut labels = label("receiver", receiver);
        labels.push(("outcome".into(), if ok { "ok" } else { "failed" }.into()));
        self.inner.delivery_attempts.get_or_create(&labels).inc();
    }

    /// Counts a committed halt fact.
    pub fn subscription_halted(&self, receiver: &str) {
        self.inner
            .subscription_halts
            .get_or_create(&label("receiver", receiver))
            .inc();
    }

    /// Counts a committed skip line.
    pub fn subscription_skipped(&self, receiver: &str) {
        self.inner
            .subscription_skips
            .get_or_create(&label("receiver", receiver))
            .inc();
    }

    /// Counts reactor calls: `ok` ones, or one that refused its append.
    pub fn reactor_called(&self, outcome: &str, calls: u64) {
        self.inner
            .reactor_calls
            .get_or_create(&label("outcome", outcome))
            .inc_by(calls);
    }

    /// Records one processor wake.
    pub fn observe_wake(&self, elapsed: Duration) {
        self.inner.wake_seconds.observe(elapsed.as_secs_f64());
    }

    /// Records how late a delayed effect's first attempt began.
    pub fn effect_due_lag(&self, late_ms: i64) {
        self.inner
            .effect_due_lag_seconds
            .observe(late_ms.max(0) as f64 / 1000.0);
    }

    /// Sets the outbox's counts by status (statuses absent count 0).
    pub fn set_effects(&self, by_status: &[(String, i64)]) {
        for status in ["pending", "running", "failed", "waiting"] {
            let n = by_status
                .iter()
                .find(|(s, _)| s == status)
                .map_or(0, |(_, n)| *n);
            self.inner
                .effects
                .get_or_create(&label("status", status))
                .set(n);
        }
    }

    /// Sets how many streams' ingest waits on a refusal for now.
    pub fn set_ingest_blocked(&self, streams: usize) {
        self.inner.ingest_blocked_streams.set(streams as i64);
    }

    /// Sets the parked ingest events per project (projects absent are
    /// dropped).
    pub fn set_ingest_parked(&self, by_project: &[(String, u64)]) {
        self.inner.ingest_parked_events.clear();
        for (project, events) in by_project {
            self.inner
                .ingest_parked_events
                .get_or_create(&label("project", project))
                .set(*events as i64);
        }
    }

    /// Sets the pending ingest per project (projects absent are dropped).
    /// Sets each project's stored bytes (`[limits] max-project-bytes`).
    pub fn set_project_stored(&self, by_project: &[(String, u64)]) {
        self.inner.project_stored_bytes.clear();
        for (project, bytes) in by_project {
            self.inner
                .project_stored_bytes
                .get_or_create(&label("project", project))
                .set(*bytes as i64);
        }
    }

    pub fn set_ingest_pending(&self, by_project: &[(String, u64, u64)]) {
        self.inner.ingest_pending_events.clear();
        self.inner.ingest_pending_bytes.clear();
        for (project, events, bytes) in by_project {
            let labels = label("project", project);
            self.inner
                .ingest_pending_events
                .get_or_create(&labels)
                .set(*events as i64);
            self.inner
                .ingest_pending_bytes
                .get_or_create(&labels)
                .set(*bytes as i64);
        }
    }

    /// Sets the lag series from every run's (stream, key, lag): the
    /// [`LAG_TOP`] furthest behind by name, and totals.
    pub fn set_lags(&self, mut lags: Vec<(String, String, u64)>) {
        lags.retain(|(_, _, lag)| *lag > 0);
        self.inner
            .lag_events
            .set(lags.iter().map(|l| l.2 as i64).sum());
        self.inner.lagging.set(lags.len() as i64);
        lags.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| (&a.0, &a.1).cmp(&(&b.0, &b.1))));
        self.inner.lag_top.clear();
        for (stream, key, lag) in lags.into_iter().take(LAG_TOP) {
            let labels = vec![
                ("stream".to_string(), stream),
                ("subscription".to_string(), key),
            ];
            self.inner.lag_top.get_or_create(&labels).set(lag as i64);
        }
    }

    /// Sets the compiled components held in memory and their bytes of
    /// code, read at scrape time.
    pub fn set_compiled(&self, components: usize, bytes: usize) {
        self.inner.compiled_components.set(components as i64);
        self.inner.compiled_code.set(bytes as i64);
    }

    /// Sets the most linear memory one guest call's instance has had.
    pub fn set_guest_memory_max(&self, bytes: usize) {
        self.inner.guest_memory.set(bytes as i64);
    }

    /// Sets the instances made ahead of their calls: parked now, and the
    /// calls they served.
    pub fn set_made_ahead(&self, parked: usize, served: u64) {
        self.inner.guest_instances_parked.set(parked as i64);
        self.inner
            .guest_calls_made_ahead
            .set(served.min(i64::MAX as u64) as i64);
    }

    /// Sets the memory SQLite holds, read at scrape time.
    pub fn set_sqlite_memory(&self, bytes: i64) {
        self.inner.sqlite_memory.set(bytes);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.inner.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_names_the_furthest_behind_and_sums_every_one() {
        let m = Metrics::new();
        let mut lags: Vec<(String, String, u64)> = (0..12u64)
            .map(|i| (format!("p:/s{i}"), "k".to_string(), i))
            .collect();
        lags.push(("p:/caught-up".into(), "k".into(), 0));
        m.set_lags(lags);
        let text = m.render();
        // 1..=11 lag (0 does not); the top 10 are 2..=11.
        assert!(
            text.contains("streamhost_subscriptions_lagging 11\n"),
            "{text}"
        );
        assert!(
            text.contains("streamhost_subscriptions_lag_events 66\n"),
            "{text}"
        );
        let named = text
            .lines()
            .filter(|l| l.starts_with("streamhost_subscription_lag_events{"))
            .count();
        assert_eq!(named, LAG_TOP, "{text}");
        assert!(
            text.contains("{stream=\"p:/s11\",subscription=\"k\"} 11"),
            "{text}"
        );
        assert!(!text.contains("stream=\"p:/s1\","), "{text}");
        // A later scrape forgets what is no longer behind.
        m.set_lags(vec![("p:/s3".into(), "k".into(), 3)]);
        let text = m.render();
        assert!(!text.contains("p:/s11"), "{text}");
        assert!(
            text.contains("streamhost_subscriptions_lagging 1\n"),
            "{text}"
        );
    }
}
