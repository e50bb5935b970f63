//! Ingest with broker acceptance: events accepted durably before they reach
//! their stream, from HTTP (`POST /v1/projects/{p}/ingest{path}`) or from a
//! NATS JetStream stream.
//!
//! - `accept.rs`: HTTP acceptance: validation, dedup, capacity, one commit.
//! - `drain.rs`: moves accepted events to their streams, in order, and frees
//!   their capacity once committed there.
//! - `nats.rs`: the JetStream bridge: its stream's safe configuration, the
//!   fence, consumption with ack-after-commit and delete.
//!
//! This file holds the pure parts: what an ingested event may be, capacity
//! accounting, subject parsing and the JetStream configuration check.

pub mod accept;
pub mod drain;
pub mod nats;

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::config::IngestConfig;
use crate::error::Error;
use crate::stream::{
    is_stream_control_type, validate_input, Authority, EventInput, Namespace, StreamAddress,
};

/// Seconds a caller should wait after `503 capacity-exhausted`.
pub const CAPACITY_RETRY_AFTER_S: u32 = 1;

/// Checks one event offered for ingest: the append rules for an API caller,
/// plus what a buffer in front of the stream needs (a key to dedup on, no
/// compare-and-append, nothing ephemeral, no stream control events).
pub fn validate_event(i: usize, e: &EventInput, max_event_bytes: u64) -> Result<usize, Error> {
    validate_input(i, e, Authority::Public)?;
    if e.idempotency_key.is_none() {
        return Err(Error::invalid(format!(
            "events[{i}].idempotencyKey is required for ingest: it is how a retried \
             acceptance is recognised"
        )));
    }
    if e.offset.is_some() {
        return Err(Error::invalid(format!(
            "events[{i}].offset is not allowed for ingest: compare-and-append needs :append"
        )));
    }
    if e.ephemeral == Some(true) {
        return Err(Error::invalid(format!(
            "events[{i}] is ephemeral: ingest accepts durable events only"
        )));
    }
    if is_stream_control_type(&e.event_type) {
        return Err(Error::invalid(format!(
            "events[{i}].type {:?} is a stream control event: append it with :append",
            e.event_type
        )));
    }
    let bytes = serde_json::to_string(e)
        .map_err(|err| Error::internal(format!("serializing events[{i}]: {err}")))?
        .len();
    if bytes as u64 > max_event_bytes {
        return Err(Error::too_large(format!(
            "events[{i}] is {bytes} bytes, over the ingest limit of {max_event_bytes} bytes \
             ([ingest] max-event-bytes)"
        )));
    }
    Ok(bytes)
}

/// What is accepted and not yet appended, against its bounds: all
/// projects together, and each project's share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    pub max_events: u64,
    pub max_bytes: u64,
    /// One project's share (`[ingest] max-pending-*-per-project`).
    pub project_max_events: u64,
    pub project_max_bytes: u64,
    /// Committed to the pending table, or reserved by an acceptance in flight.
    pub events: u64,
    pub bytes: u64,
    /// The same, per project (`""`: the global namespace).
    pub by_project: std::collections::HashMap<String, (u64, u64)>,
}

/// `503 capacity-exhausted`, naming what is pending against which bound.
pub fn exhausted(whose: &str, what: &str, pending: u64, max: u64, more: u64) -> Error {
    Error::unavailable(
        "capacity-exhausted",
        format!(
            "ingest is at capacity{whose}: {pending} of {max} {what} pending, {more} more do not \
             fit (everything accepted before is kept; retry later)"
        ),
        CAPACITY_RETRY_AFTER_S,
    )
}

impl Capacity {
    pub fn new(config: &IngestConfig) -> Capacity {
        Capacity {
            max_events: config.max_pending_events,
            max_bytes: config.max_pending_bytes,
            project_max_events: config.project_events(),
            project_max_bytes: config.project_bytes(),
            events: 0,
            bytes: 0,
            by_project: Default::default(),
        }
    }

    /// Takes room for `events` events of `bytes` bytes of `project`, or says
    /// why not (its share first: a project at its share never takes the
    /// others' room).
    pub fn reserve(&mut self, project: &str, events: u64, bytes: u64) -> Result<(), Error> {
        let (p_events, p_bytes) = self.by_project.get(project).copied().unwrap_or((0, 0));
        let share = crate::storage::share_of(project);
        for (whose, what, pending, max, more) in [
            (
                share.as_str(),
                "events",
                p_events,
                self.project_max_events,
                events,
            ),
            (
                share.as_str(),
                "bytes",
                p_bytes,
                self.project_max_bytes,
                bytes,
            ),
            ("", "events", self.events, self.max_events, events),
            ("", "bytes", self.bytes, self.max_bytes, bytes),
        ] {
            if pending + more > max {
                return Err(exhausted(whose, what, pending, max, more));
            }
        }
        self.events += events;
        self.bytes += bytes;
        self.by_project
            .insert(project.to_string(), (p_events + events, p_bytes + bytes));
        Ok(())
    }

    /// Takes room without a check: a JetStream message parked (JetStream
    /// accepted it already; it counts until settled, so HTTP acceptances
    /// of a project whose parked events fill its share are refused).
    pub fn charge(&mut self, project: &str, events: u64, bytes: u64) {
        self.events += events;
        self.bytes += bytes;
        let entry = self.by_project.entry(project.to_string()).or_insert((0, 0));
        entry.0 += events;
        entry.1 += bytes;
    }

    /// Gives back room: events of `project` left the pending table (or
    /// never entered it).
    pub fn release(&mut self, project: &str, events: u64, bytes: u64) {
        self.events = self.events.saturating_sub(events);
        self.bytes = self.bytes.saturating_sub(bytes);
        if let Some((e, b)) = self.by_project.get_mut(project) {
            *e = e.saturating_sub(events);
            *b = b.saturating_sub(bytes);
            if *e == 0 && *b == 0 {
                self.by_project.remove(project);
            }
        }
    }
}

/// The state of ingest on one host, shared by the HTTP handlers, the drain
/// and the bridge. Cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    inner: Arc<Inner>,
}

struct Inner {
    config: IngestConfig,
    /// The backoff of a stream refused for now: the delivery policy's.
    retry: crate::config::DeliveryConfig,
    /// See [`Ingest::retry_now`].
    retry_round: std::sync::atomic::AtomicU64,
    capacity: Mutex<Capacity>,
    /// Rung when events are accepted: the drain looks at once.
    bell: Notify,
    /// The streams that accepted events since the drain last looked: it
    /// starts their drains without reading the pending table.
    rung: Mutex<std::collections::HashSet<(String, String)>>,
    nats: Mutex<Option<nats::Status>>,
    /// Rung by `POST /v1/ingest:register`: the bridge checks again.
    register: Notify,
    /// Where the bridge answers a registration request.
    register_reply: Mutex<Option<RegisterReply>>,
    /// Streams whose HTTP ingest waits on a refusal for now: (project,
    /// path) → (last error, since).
    blocked: Mutex<std::collections::BTreeMap<(String, String), (String, String)>>,
}

/// The answer to a registration request: the bridge consumes, or why not.
pub type RegisterReply = tokio::sync::oneshot::Sender<Result<(), String>>;

impl Ingest {
    /// `pending`: what the pending table holds at start, per project
    /// (project, events, bytes).
    pub fn new(
        config: IngestConfig,
        retry: crate::config::DeliveryConfig,
        pending: Vec<(String, u64, u64)>,
    ) -> Ingest {
        let mut capacity = Capacity::new(&config);
        for (project, events, bytes) in pending {
            capacity.events += events;
            capacity.bytes += bytes;
            capacity.by_project.insert(project, (events, bytes));
        }
        let nats = config.nats_url.as_ref().map(|_| nats::Status::default());
        Ingest {
            inner: Arc::new(Inner {
                config,
                retry,
                retry_round: Default::default(),
                capacity: Mutex::new(capacity),
                bell: Notify::new(),
                rung: Mutex::new(Default::default()),
                nats: Mutex::new(nats),
                register: Notify::new(),
                register_reply: Mutex::new(None),
                blocked: Mutex::new(Default::default()),
            }),
        }
    }

    pub fn config(&self) -> &IngestConfig {
        &self.inner.config
    }

    pub fn reserve(&self, project: &str, events: u64, bytes: u64) -> Result<(), Error> {
        self.inner
            .capacity
            .lock()
            .expect("ingest capacity")
            .reserve(project, events, bytes)
    }

    pub fn release(&self, project: &str, events: u64, bytes: u64) {
        self.inner
            .capacity
            .lock()
            .expect("ingest capacity")
            .release(project, events, bytes)
    }

    pub fn charge(&self, project: &str, events: u64, bytes: u64) {
        self.inner
            .capacity
            .lock()
            .expect("ingest capacity")
            .charge(project, events, bytes)
    }

    /// How long a stream whose append was refused for now waits before
    /// its `failures`-th retry: the delivery backoff (`[delivery]
    /// backoff-base-ms`, doubling up to `backoff-max-ms`, jittered).
    pub fn backoff(&self, failures: u32) -> std::time::Duration {
        std::time::Duration::from_millis(crate::delivery::backoff_ms(
            &self.inner.retry,
            failures,
            crate::clock::jitter(),
        ))
    }

    pub fn capacity(&self) -> Capacity {
        self.inner.capacity.lock().expect("ingest capacity").clone()
    }

    /// Events were accepted for `project`'s stream `path`: the drain
    /// takes them at once.
    pub fn ring(&self, project: &str, path: &str) {
        self.inner
            .rung
            .lock()
            .expect("rung streams")
            .insert((project.to_string(), path.to_string()));
        self.inner.bell.notify_one();
    }

    /// The streams rung since the last call.
    pub(crate) fn take_rung(&self) -> std::collections::HashSet<(String, String)> {
        std::mem::take(&mut *self.inner.rung.lock().expect("rung streams"))
    }

    /// What held streams waited for may have changed (a component was
    /// deployed, a stream resumed): they are tried again now, not after
    /// their backoff.
    pub fn retry_now(&self) {
        self.inner
            .retry_round
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.bell.notify_one();
    }

    /// Bumped by [`Ingest::retry_now`].
    pub(crate) fn retry_round(&self) -> u64 {
        self.inner
            .retry_round
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn bell(&self) -> &Notify {
        &self.inner.bell
    }

    pub(crate) fn update_nats(&self, f: impl FnOnce(&mut nats::Status)) {
        if let Some(s) = self.inner.nats.lock().expect("nats status").as_mut() {
            f(s)
        }
    }

    pub(crate) fn register_bell(&self) -> &Notify {
        &self.inner.register
    }

    /// Asks the bridge to register the JetStream stream it sees now (it
    /// must be empty) and waits for its answer: the bridge's status once it
    /// consumes.
    pub async fn register(
        &self,
        timeout: std::time::Duration,
    ) -> Result<nats::BridgeStatus, Error> {
        let consuming = match self.inner.nats.lock().expect("nats status").as_ref() {
            None => {
                return Err(Error::not_found(
                    "nats-not-configured",
                    "this server consumes no JetStream stream: start it with --nats URL \
                     or [ingest] nats-url",
                ))
            }
            Some(s) => s.consuming,
        };
        if !consuming {
            let (tx, rx) = tokio::sync::oneshot::channel();
            *self.inner.register_reply.lock().expect("register reply") = Some(tx);
            self.inner.register.notify_one();
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(reason))) => return Err(Error::conflict("registration-refused", reason)),
                Ok(Err(_)) => {
                    return Err(Error::conflict(
                        "registration-refused",
                        "another registration request replaced this one",
                    ))
                }
                Err(_) => {
                    return Err(Error::new(
                        crate::error::ErrorKind::Timeout,
                        "timeout",
                        format!(
                            "the bridge did not answer the registration within {} ms: {}",
                            timeout.as_millis(),
                            self.status()
                                .nats
                                .and_then(|n| n.last_error)
                                .unwrap_or_default()
                        ),
                    ))
                }
            }
        }
        self.status()
            .nats
            .ok_or_else(|| Error::internal("the bridge's status is gone"))
    }

    /// The pending registration request, if any (the bridge answers it).
    pub(crate) fn take_register_reply(&self) -> Option<RegisterReply> {
        self.inner
            .register_reply
            .lock()
            .expect("register reply")
            .take()
    }

    /// Records that `project`'s stream `path` refused its next append for
    /// now (`at`: an RFC 3339 time): its events wait, in order.
    pub(crate) fn block(&self, project: &str, path: &str, error: &str, at: String) {
        let mut blocked = self.inner.blocked.lock().expect("blocked streams");
        let entry = blocked
            .entry((project.to_string(), path.to_string()))
            .or_insert_with(|| (String::new(), at));
        entry.0 = error.to_string();
    }

    /// `project`'s stream `path` took its pending events again.
    pub(crate) fn unblock(&self, project: &str, path: &str) {
        self.inner
            .blocked
            .lock()
            .expect("blocked streams")
            .remove(&(project.to_string(), path.to_string()));
    }

    /// How many streams' ingest waits on a refusal for now.
    pub fn blocked_streams(&self) -> usize {
        self.inner.blocked.lock().expect("blocked streams").len()
    }

    /// What `GET /v1/ingest` shows (this host's view of pending ingest).
    pub fn status(&self) -> IngestStatus {
        let c = self.capacity();
        let nats = self
            .inner
            .nats
            .lock()
            .expect("nats status")
            .as_ref()
            .map(|s| s.view());
        IngestStatus {
            http: HttpIngestStatus {
                pending: c.events,
                bytes: c.bytes,
                capacity: IngestCapacity {
                    events: c.max_events,
                    bytes: c.max_bytes,
                },
                last_error: None,
                drops: Vec::new(),
                parked: 0,
                blocked: self
                    .inner
                    .blocked
                    .lock()
                    .expect("blocked streams")
                    .iter()
                    .map(|((project, path), (last_error, since))| BlockedStream {
                        project: project.clone(),
                        path: path.clone(),
                        last_error: last_error.clone(),
                        since: since.clone(),
                    })
                    .collect(),
            },
            nats,
        }
    }
}

/// Ingest with broker acceptance: HTTP ingest and the JetStream bridge.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IngestStatus {
    /// HTTP ingest: accepted events waiting to be appended.
    pub http: HttpIngestStatus,
    /// The JetStream bridge (`None`: not configured).
    pub nats: Option<nats::BridgeStatus>,
}

/// HTTP ingest's pending events and capacity.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpIngestStatus {
    /// Accepted events waiting to be appended (parked ones apart).
    pub pending: u64,
    /// The bytes of the pending and parked events: what counts against
    /// capacity.
    pub bytes: u64,
    /// The most that may be pending.
    pub capacity: IngestCapacity,
    /// The last event dropped for good, and why (from `drops`; events
    /// refused for good are parked now, never dropped).
    pub last_error: Option<String>,
    /// The events dropped for good (they can never be appended: their key
    /// was used with other content, the stream refuses them for good),
    /// oldest first: the latest 64, kept in storage across restarts.
    pub drops: Vec<crate::storage::DroppedEvent>,
    /// Accepted events refused for good and kept (all projects; each
    /// project lists its own at `GET /v1/projects/{p}/ingest/parked`).
    pub parked: u64,
    /// Streams whose pending events wait because their next append was
    /// refused for now (a reactor that cannot run yet, a paused stream,
    /// storage); they are tried again, in order.
    pub blocked: Vec<BlockedStream>,
}

/// A stream whose HTTP ingest waits on a refusal for now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockedStream {
    /// The project (empty: the global namespace).
    pub project: String,
    /// The stream's path.
    pub path: String,
    /// Why its last append was refused.
    pub last_error: String,
    /// Since when (RFC 3339).
    pub since: String,
}

/// An accepted event refused for good (a reactor's final refusal, a key
/// used with other content, a JetStream message that is not an event):
/// kept with its whole input until it is redriven or discarded
/// (`GET /v1/projects/{p}/ingest/parked`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParkedEvent {
    /// Its id, for `:redrive` and `:discard`.
    pub id: i64,
    /// Its stream's path (empty: a JetStream subject that names none).
    pub path: String,
    /// The event as accepted (`null`: a JetStream message that is not one).
    pub event: Option<serde_json::Value>,
    /// Why it was refused.
    pub reason: String,
    /// When it was accepted (RFC 3339).
    pub accepted_at: String,
    /// When it was parked (RFC 3339).
    pub parked_at: String,
    /// `http` or `nats`.
    pub source: String,
    /// For `nats`: the message as JetStream held it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats: Option<ParkedMessage>,
}

/// A parked JetStream message as the broker held it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParkedMessage {
    /// Its subject.
    pub subject: String,
    /// Its stream sequence.
    pub sequence: u64,
    /// Its payload, base64 (standard alphabet, padded).
    pub raw: String,
}

impl ParkedEvent {
    pub(crate) fn from_row(row: crate::storage::ParkedRow) -> ParkedEvent {
        let nats = match (row.subject, row.sequence) {
            (Some(subject), Some(sequence)) => Some(ParkedMessage {
                subject,
                sequence: sequence as u64,
                raw: row.raw.unwrap_or_default(),
            }),
            _ => None,
        };
        ParkedEvent {
            id: row.id,
            path: row.path,
            event: serde_json::from_str(&row.body).ok(),
            reason: row.reason,
            accepted_at: row.accepted_at,
            parked_at: row.parked_at,
            source: row.source,
            nats,
        }
    }
}

/// A page of a project's parked events, oldest first.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParkedPage {
    /// The events.
    pub parked: Vec<ParkedEvent>,
    /// Pass as `afterId` for the next page (`null`: none).
    pub next_after_id: Option<i64>,
}

/// Which parked events to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedQuery {
    /// Only this stream's.
    pub path: Option<String>,
    /// After this id.
    pub after_id: i64,
    /// At most this many (1 to 1000).
    pub limit: usize,
}

/// The most parked events in one page.
pub const PARKED_LIMIT_MAX: usize = 1000;

impl Default for ParkedQuery {
    fn default() -> ParkedQuery {
        ParkedQuery {
            path: None,
            after_id: 0,
            limit: 100,
        }
    }
}

/// How much accepted ingest may wait.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IngestCapacity {
    /// Events.
    pub events: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The stream a JetStream subject names: `streamhost.{project}.ingest.a.b`
/// is stream `/a/b` of project `project` (`streamhost.{project}.ingest` alone
/// is the root stream).
pub fn parse_subject(subject: &str) -> Result<StreamAddress, String> {
    parse_subject_as(subject, "ingest")
}

/// The stream a subject of `kind` names: `streamhost.{project}.{kind}.a.b`
/// is stream `/a/b` of project `project`.
pub fn parse_subject_as(subject: &str, kind: &str) -> Result<StreamAddress, String> {
    let mut tokens = subject.split('.');
    if tokens.next() != Some("streamhost") {
        return Err(format!(
            "subject {subject:?} does not start with \"streamhost.\""
        ));
    }
    let project = tokens
        .next()
        .ok_or_else(|| format!("subject {subject:?} names no project"))?;
    if tokens.next() != Some(kind) {
        return Err(format!(
            "subject {subject:?} is not streamhost.{{project}}.{kind}.{{path tokens}}"
        ));
    }
    let namespace =
        Namespace::project(project).map_err(|e| format!("subject {subject:?}: {}", e.message))?;
    let path = format!("/{}", tokens.collect::<Vec<_>>().join("/"));
    StreamAddress::new(namespace, &path).map_err(|e| format!("subject {subject:?}: {}", e.message))
}

/// An event from a JetStream message: its payload is an `EventInput` (JSON);
/// `Nats-Msg-Id` is its idempotency key (a key inside the body must agree).
pub fn event_from_message(
    msg_id: Option<&str>,
    payload: &[u8],
    max_event_bytes: u64,
) -> Result<EventInput, String> {
    let Some(msg_id) = msg_id.filter(|m| !m.is_empty()) else {
        return Err("the message has no Nats-Msg-Id header (it is the idempotency key)".into());
    };
    let mut de = serde_json::Deserializer::from_slice(payload);
    let mut event: EventInput = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            format!(
                "the message is not an event (JSON with \"type\"): {}",
                e.inner()
            )
        } else {
            format!("the message is not an event: {path}: {}", e.inner())
        }
    })?;
    match &event.idempotency_key {
        Some(k) if k != msg_id => {
            return Err(format!(
                "idempotencyKey {k:?} differs from the Nats-Msg-Id {msg_id:?}"
            ))
        }
        _ => event.idempotency_key = Some(msg_id.to_string()),
    }
    validate_event(0, &event, max_event_bytes)
        .map_err(|e| e.message.replacen("events[0]", "the event", 1))?;
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn capacity_refuses_what_does_not_fit_and_keeps_what_was_taken() {
        let mut c = Capacity::new(&IngestConfig {
            max_pending_events: 3,
            max_pending_bytes: 100,
            max_pending_events_per_project: Some(3),
            max_pending_bytes_per_project: Some(100),
            ..IngestConfig::default()
        });
        c.reserve("a", 2, 50).unwrap();
        let e = c.reserve("b", 2, 10).unwrap_err();
        assert_eq!(e.code, "capacity-exhausted");
        assert_eq!(e.retry_after_s, Some(CAPACITY_RETRY_AFTER_S));
        assert!(e.message.contains("2 of 3 events pending"), "{}", e.message);
        let e = c.reserve("b", 1, 51).unwrap_err();
        assert!(e.message.contains("50 of 100 bytes"), "{}", e.message);
        assert_eq!((c.events, c.bytes), (2, 50));
        c.reserve("b", 1, 50).unwrap();
        c.release("a", 2, 50);
        c.release("b", 1, 50);
        assert_eq!((c.events, c.bytes), (0, 0));
        c.release("a", 1, 1);
        assert_eq!((c.events, c.bytes), (0, 0));
        assert!(c.by_project.is_empty());
    }

    #[test]
    fn a_project_at_its_share_leaves_the_others_room() {
        let mut c = Capacity::new(&IngestConfig {
            max_pending_events: 8,
            max_pending_bytes: 1000,
            max_event_bytes: 100,
            ..IngestConfig::default()
        });
        assert_eq!((c.project_max_events, c.project_max_bytes), (2, 250));
        c.reserve("evil", 2, 20).unwrap();
        let e = c.reserve("evil", 1, 10).unwrap_err();
        assert!(e.message.contains("project \"evil\""), "{}", e.message);
        assert!(e.message.contains("2 of 2 events"), "{}", e.message);
        c.reserve("good", 2, 20).unwrap();
        c.release("evil", 2, 20);
        c.reserve("evil", 1, 10).unwrap();
    }

    #[test]
    fn subjects_name_a_project_and_a_path() {
        let a = parse_subject("streamhost.acme.ingest.orders.eu").unwrap();
        assert_eq!(a.namespace, Namespace::project("acme").unwrap());
        assert_eq!(a.path, "/orders/eu");
        assert_eq!(parse_subject("streamhost.acme.ingest").unwrap().path, "/");
        for bad in [
            "other.acme.ingest.x",
            "streamhost",
            "streamhost.acme.events.x",
            "streamhost.Acme!.ingest.x",
        ] {
            assert!(parse_subject(bad).is_err(), "{bad}");
        }
        let e = parse_subject("streamhost.acme.events.x").unwrap_err();
        assert!(e.contains("streamhost.acme.events.x"), "{e}");
    }

    #[test]
    fn a_message_is_an_event_keyed_by_its_msg_id() {
        let e =
            event_from_message(Some("k1"), br#"{"type":"order","payload":{"n":1}}"#, 1024).unwrap();
        assert_eq!(e.idempotency_key.as_deref(), Some("k1"));
        assert_eq!(e.event_type, "order");
        let no_id = event_from_message(None, br#"{"type":"x"}"#, 1024).unwrap_err();
        assert!(no_id.contains("Nats-Msg-Id"), "{no_id}");
        let bad = event_from_message(Some("k"), b"not json", 1024).unwrap_err();
        assert!(bad.contains("not an event"), "{bad}");
        let field =
            event_from_message(Some("k"), br#"{"type":"x","payload":3}"#, 1024).unwrap_err();
        assert!(field.contains("payload"), "{field}");
        let differ = event_from_message(Some("k"), br#"{"type":"x","idempotencyKey":"j"}"#, 1024)
            .unwrap_err();
        assert!(differ.contains("differs"), "{differ}");
        let platform = event_from_message(
            Some("k"),
            br#"{"type":"events.iterate.com/stream/subscription-delivery-halted"}"#,
            1024,
        )
        .unwrap_err();
        assert!(platform.contains("platform-authored"), "{platform}");
        let big = event_from_message(
            Some("k"),
            br#"{"type":"x","payload":{"s":"0123456789"}}"#,
            20,
        )
        .unwrap_err();
        assert!(big.contains("over the ingest limit"), "{big}");
    }

    #[test]
    fn ingest_refuses_what_a_buffer_cannot_honour() {
        let ev = |v: Value| serde_json::from_value::<EventInput>(v).unwrap();
        let no_key = validate_event(0, &ev(json!({"type": "x"})), 1024).unwrap_err();
        assert!(no_key.message.contains("idempotencyKey is required"));
        let offset = validate_event(
            1,
            &ev(json!({"type": "x", "idempotencyKey": "k", "offset": 3})),
            1024,
        )
        .unwrap_err();
        assert!(offset.message.starts_with("events[1].offset"));
        let control = validate_event(
            0,
            &ev(json!({"type": "events.iterate.com/stream/paused", "idempotencyKey": "k"})),
            1024,
        )
        .unwrap_err();
        assert!(control.message.contains("stream control event"));
        let ok = validate_event(0, &ev(json!({"type": "x", "idempotencyKey": "k"})), 1024).unwrap();
        assert_eq!(ok, r#"{"type":"x","idempotencyKey":"k"}"#.len());
    }
}
