//! The NATS JetStream bridge: consumes the JetStream stream
//! `STREAMHOST_INGEST` into streams, with two durable consumers: one for
//! events (subjects `streamhost.{project}.ingest.>`), one for resumes of
//! halted subscriptions (`streamhost.{project}.resume.>`, each message
//! `{"subscriptionKey"}` resuming that subscription of the stream its
//! subject names once, as `:resumeSubscription`; its `Nats-Msg-Id` is the
//! resume's idempotency key).
//!
//! At start it creates the stream if absent with the safe configuration
//! (file storage, `LimitsPolicy`, `DiscardNew`, no age limit, no TTL or
//! rollup, 50 000 messages, 512 MiB, 1 MiB a message, the configured
//! replicas), reads it back and refuses one with an unsafe difference,
//! naming each. A registered stream whose only differences are safe (a
//! subject of ours missing, as the resume subject on a stream created by an
//! older build; a limit lower than ours; another replica count) is updated
//! in place and read back; on any error it stays unconsumed. The stream's
//! identity (account, domain, name, creation time) must match a fence
//! registered in the database: a first, empty stream is registered at once;
//! a non-empty stream never registered, or a recreated one, is refused until
//! `streamhost ingest register` (which needs it empty). The fence is checked
//! again before every round of acks and deletions.
//!
//! Each message is an `EventInput` (JSON) keyed by its `Nats-Msg-Id`. A
//! stream's messages are appended in sequence order; only after the append
//! commits is each acked and then deleted from JetStream, which frees its
//! capacity (under `LimitsPolicy` an ack alone frees nothing): the prefix of
//! terminal messages with one purge, a message behind a waiting one alone. A crash
//! before the delete redelivers the message, and its idempotency key makes
//! the append a replay. A message that can never be appended (not an event,
//! or refused for good, as by a reactor's final refusal) is parked with its
//! raw bytes, subject and sequence (see `drain.rs`: listed, redriven or
//! discarded per project) and its diagnostic (sequence, reason) committed
//! to the fence's latest 64, then it is acked and deleted. A stream that
//! refuses for now (paused, a reactor that cannot run yet) keeps its
//! messages unacked in JetStream (capacity stays taken) and its later
//! messages wait behind them, tried again after the delivery backoff. A
//! resume that can never apply (no such subscription, not a resume) is a
//! diagnostic, then acked and deleted; one refused for now is redelivered
//! after the backoff.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::{FutureExt, StreamExt};
use serde_json::Value;

use super::{drain::is_retryable, event_from_message, parse_subject, Ingest};
use crate::actor::{Streams, StreamsRef};
use crate::clock::format_timestamp;
use crate::config::NatsStorage;
use crate::storage::{FenceIdentity, IngestOp, WriteOp, DIAGNOSTICS_KEPT};
use crate::stream::{AppendInput, Authority, EventInput, StreamAddress};

/// Several hosts: the bridge's lease is a row of `stream_leases` under a
/// key no project can have, so one host at a time consumes.
pub const BRIDGE_LEASE_PROJECT: &str = "!bridge";
pub const BRIDGE_LEASE_PATH: &str = "/nats";

/// The JetStream stream consumed.
pub const STREAM_NAME: &str = "STREAMHOST_INGEST";
/// The subjects of events.
pub const INGEST_SUBJECTS: &str = "streamhost.*.ingest.>";
/// The subjects of resumes.
pub const RESUME_SUBJECTS: &str = "streamhost.*.resume.>";
/// The durable consumer of events this host reads with (recreated at every
/// start, so everything still in the stream is delivered again).
pub const CONSUMER_NAME: &str = "streamhost-bridge";
/// The durable consumer of resumes (recreated at every start too).
pub const RESUME_CONSUMER_NAME: &str = "streamhost-resume";
/// Messages delivered and not yet acked, at most, for each consumer.
pub const MAX_ACK_PENDING: i64 = 50_000;
pub const MAX_MESSAGES: i64 = 50_000;
pub const MAX_BYTES: i64 = 512 * 1024 * 1024;
/// The stream's bytes at most in memory storage (`[ingest] nats-storage =
/// "memory"`, development only).
pub const MEMORY_MAX_BYTES: i64 = 20 * 1024 * 1024;
pub const MAX_MESSAGE_SIZE: i32 = 1024 * 1024;
/// A delivery not acked after this is sent again (held messages are kept
/// alive with progress acks well before).
const ACK_WAIT: Duration = Duration::from_secs(30);
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// Longest wait for the next message before looking at held streams again.
const HOLD: Duration = Duration::from_secs(1);
const BATCH_MAX: usize = 1000;

/// What `GET /v1/ingest` shows of the bridge.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub url: String,
    pub fence: Option<(i64, FenceIdentity)>,
    /// Messages in the JetStream stream (accepted, not yet terminal).
    pub pending: Option<u64>,
    pub consuming: bool,
    pub last_error: Option<String>,
    pub diagnostics: VecDeque<(u64, String)>,
    /// The durable consumers read with (set once they are created).
    pub consumers: Vec<BridgeConsumer>,
    /// What startup last updated in place on the registered stream.
    pub updated: Vec<String>,
}

impl Status {
    /// The view `GET /v1/ingest` serves.
    pub fn view(&self) -> BridgeStatus {
        BridgeStatus {
            url: self.url.clone(),
            stream: STREAM_NAME.to_string(),
            fence: self.fence.as_ref().map(|(_, f)| f.clone()),
            consuming: self.consuming,
            pending: self.pending,
            consumers: self.consumers.clone(),
            updated: self.updated.clone(),
            last_error: self.last_error.clone(),
            diagnostics: self
                .diagnostics
                .iter()
                .map(|(sequence, reason)| Diagnostic {
                    sequence: *sequence,
                    reason: reason.clone(),
                })
                .collect(),
        }
    }
}

/// The JetStream bridge: what it consumes and how it goes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BridgeStatus {
    /// The NATS server's URL.
    pub url: String,
    /// The JetStream stream it consumes.
    pub stream: String,
    /// The registered stream's identity (`None`: none registered yet).
    pub fence: Option<FenceIdentity>,
    /// Whether it is consuming now.
    pub consuming: bool,
    /// Messages in the JetStream stream (accepted, not yet appended).
    pub pending: Option<u64>,
    /// Its durable consumers: events, then resumes.
    pub consumers: Vec<BridgeConsumer>,
    /// The safe fields startup last updated in place on the registered
    /// stream (empty: none differed).
    pub updated: Vec<String>,
    /// Why it is not consuming, or the last failure.
    pub last_error: Option<String>,
    /// The latest messages removed as never appendable (at most 64).
    pub diagnostics: Vec<Diagnostic>,
}

/// One of the bridge's durable consumers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BridgeConsumer {
    /// Its durable name.
    pub name: String,
    /// The subjects it reads.
    pub filter_subject: String,
    /// Messages delivered to it and not yet acked, at most.
    pub max_ack_pending: i64,
}

/// A message the bridge removed because it can never be appended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    /// Its JetStream sequence.
    pub sequence: u64,
    /// Why it cannot be appended.
    pub reason: String,
}

/// The configuration the bridge creates its stream with, in `storage` with
/// `replicas`: in memory (development only) the stream is capped at
/// [`MEMORY_MAX_BYTES`].
pub fn safe_config(storage: NatsStorage, replicas: usize) -> stream::Config {
    let (storage, max_bytes) = match storage {
        NatsStorage::File => (stream::StorageType::File, MAX_BYTES),
        NatsStorage::Memory => (stream::StorageType::Memory, MEMORY_MAX_BYTES),
    };
    stream::Config {
        name: STREAM_NAME.to_string(),
        subjects: vec![INGEST_SUBJECTS.to_string(), RESUME_SUBJECTS.to_string()],
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::New,
        max_age: Duration::ZERO,
        max_messages: MAX_MESSAGES,
        max_bytes,
        max_message_size: MAX_MESSAGE_SIZE,
        storage,
        num_replicas: replicas,
        ..Default::default()
    }
}

/// How a stream's configuration differs from the safe one.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Differences {
    /// Unsafe differences, each naming its field: the stream is not
    /// consumed.
    pub refused: Vec<String>,
    /// Safe ones, each naming its field: startup updates them in place on a
    /// registered stream (a subject of ours missing, a limit lower than
    /// ours, another replica count).
    pub updatable: Vec<String>,
}

/// How a stream's configuration differs from the safe one in `storage` with
/// `replicas` (a memory stream is refused unless memory was asked for, and a
/// file stream when it was).
pub fn config_differences(
    c: &stream::Config,
    storage: NatsStorage,
    replicas: usize,
) -> Differences {
    let safe = safe_config(storage, replicas);
    let mut out = Vec::new();
    let mut updatable = Vec::new();
    let foreign: Vec<&String> = c
        .subjects
        .iter()
        .filter(|s| !safe.subjects.contains(s))
        .collect();
    if !foreign.is_empty() {
        out.push(format!(
            "subjects include {foreign:?}, not only {:?}",
            safe.subjects
        ));
    }
    let missing: Vec<&String> = safe
        .subjects
        .iter()
        .filter(|s| !c.subjects.contains(s))
        .collect();
    if !missing.is_empty() {
        updatable.push(format!("subjects lack {missing:?}"));
    }
    // A limit lower than ours may be raised in place (more room, nothing
    // discarded); a higher one (or none: 0 or -1) is refused.
    for (what, is, ours) in [
        ("max messages", c.max_messages, safe.max_messages),
        ("max bytes", c.max_bytes, safe.max_bytes),
        (
            "max message size",
            i64::from(c.max_message_size),
            i64::from(safe.max_message_size),
        ),
    ] {
        if is != ours && is > 0 && is < ours {
            updatable.push(format!("{what} is {is}, raised to {ours}"));
        } else if is != ours {
            out.push(format!("{what} is {is}, not {ours}"));
        }
    }
    let is_replicas = c.num_replicas.max(1);
    if is_replicas != replicas {
        updatable.push(format!("replicas are {is_replicas}, set to {replicas}"));
    }
    let mut check = |ok: bool, what: String| {
        if !ok {
            out.push(what)
        }
    };
    check(
        c.storage == safe.storage,
        format!(
            "storage is {:?}, not {:?}{}",
            c.storage,
            safe.storage,
            match storage {
                NatsStorage::File => "",
                NatsStorage::Memory => " ([ingest] nats-storage = \"memory\")",
            }
        ),
    );
    check(
        c.retention == stream::RetentionPolicy::Limits,
        format!("retention is {:?}, not limits", c.retention),
    );
    check(
        c.discard == stream::DiscardPolicy::New,
        format!("discard is {:?}, not new", c.discard),
    );
    check(
        c.max_age.is_zero(),
        format!("max age is {:?}, not 0 (messages would expire)", c.max_age),
    );
    check(
        c.max_messages_per_subject <= 0,
        format!(
            "max messages per subject is {} (older messages would be discarded)",
            c.max_messages_per_subject
        ),
    );
    check(!c.allow_rollup, "rollup is allowed".into());
    check(!c.allow_message_ttl, "message TTL is allowed".into());
    check(
        c.subject_delete_marker_ttl.is_none(),
        "subject delete markers are on".into(),
    );
    check(!c.sealed, "the stream is sealed".into());
    check(!c.deny_delete, "message deletion is denied".into());
    check(
        !c.no_ack,
        "no-ack is set (publishers get no acceptance)".into(),
    );
    check(c.mirror.is_none(), "the stream is a mirror".into());
    check(
        c.sources.as_ref().is_none_or(|s| s.is_empty()),
        "the stream has sources".into(),
    );
    check(
        c.subject_transform.is_none(),
        "the stream transforms subjects".into(),
    );
    Differences {
        refused: out,
        updatable,
    }
}

/// `c` with its safe fields set to ours: what startup updates a registered
/// stream to when [`Differences::updatable`] is all that differs.
pub fn updated_config(c: &stream::Config, storage: NatsStorage, replicas: usize) -> stream::Config {
    let safe = safe_config(storage, replicas);
    stream::Config {
        subjects: safe.subjects,
        max_messages: safe.max_messages,
        max_bytes: safe.max_bytes,
        max_message_size: safe.max_message_size,
        num_replicas: safe.num_replicas,
        ..c.clone()
    }
}

/// Where the bridge keeps its JetStream stream: `[ingest] nats-storage` and
/// `nats-replicas`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// File (durable) or memory (development only).
    pub storage: NatsStorage,
    /// Copies the JetStream cluster keeps (1 on a single server).
    pub replicas: usize,
}

/// Starts the bridge; it ends with the stream registry.
pub fn start(streams: StreamsRef, ingest: Ingest, url: String, placement: Placement) {
    let storage = placement.storage;
    ingest.update_nats(|s| s.url = url.clone());
    if storage == NatsStorage::Memory {
        tracing::warn!(
            nats = %url,
            "the ingest stream {STREAM_NAME} is in JetStream memory storage ([ingest] \
             nats-storage = \"memory\"): not durable, what the broker accepted is lost when it \
             restarts, and it holds at most 20 MiB; for development only"
        );
    }
    tokio::spawn(run(streams, ingest, url, placement));
}

async fn run(streams: StreamsRef, ingest: Ingest, url: String, placement: Placement) {
    let mut backoff = Duration::from_millis(500);
    let mut last_logged: Option<String> = None;
    loop {
        let Some(live) = streams.upgrade() else {
            return;
        };
        drop(live);
        let mut reply = ingest.take_register_reply();
        match session(&streams, &ingest, &url, placement, &mut reply).await {
            Ok(()) => return,
            Err(e) => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(e.clone()));
                }
                // Logged when it changes: a refused stream stays refused
                // (and shown in GET /v1/ingest) between the retries.
                if ingest.status().nats.is_some_and(|n| n.consuming) {
                    last_logged = None; // it had recovered since
                }
                if last_logged.as_deref() != Some(e.as_str()) {
                    tracing::error!(nats = %url, error = %e, "ingest bridge stopped; trying again");
                    last_logged = Some(e.clone());
                }
                ingest.update_nats(|s| {
                    s.last_error = Some(e);
                    s.consuming = false;
                });
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = ingest.register_bell().notified() => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One connection: verify, then consume until an error (or the host goes:
/// `Ok`). `register`: a registration request, answered once consuming.
async fn session(
    streams: &StreamsRef,
    ingest: &Ingest,
    url: &str,
    placement: Placement,
    register: &mut Option<super::RegisterReply>,
) -> Result<(), String> {
    let Placement { storage, replicas } = placement;
    // Several hosts: one consumes (it holds the bridge's lease); the others
    // try again, and take over when that host stops renewing.
    let lease = {
        let Some(live) = streams.upgrade() else {
            return Ok(());
        };
        let storage = live.storage().clone();
        drop(live);
        let lapses = storage.lease_lapses();
        let held = tokio::task::spawn_blocking({
            let storage = storage.clone();
            move || storage.acquire_lease(BRIDGE_LEASE_PROJECT, BRIDGE_LEASE_PATH)
        })
        .await
        .map_err(|e| e.to_string())?;
        match held {
            Ok(None) => None,
            Ok(Some(_)) => Some((storage, lapses)),
            Err(e) => {
                return Err(match e.downcast_ref::<crate::storage::OwnedElsewhere>() {
                    Some(o) => format!(
                        "the host at {} runs the bridge (one host at a time); this host takes \
                         over if it stops renewing its lease",
                        o.url
                    ),
                    None => format!("taking the bridge's lease: {e:#}"),
                })
            }
        }
    };
    let client = async_nats::connect(url)
        .await
        .map_err(|e| format!("connecting to NATS at {url}: {e}"))?;
    let js = jetstream::new(client.clone());
    let account = account_of(&client).await?;
    let domain = domain_of(&js).await?;
    // Created with the safe configuration if absent; an existing one is
    // checked: refused for an unsafe difference, updated in place (once
    // registered) for safe ones.
    let mut stream = js
        .get_or_create_stream(safe_config(storage, replicas))
        .await
        .map_err(|e| format!("creating or reading JetStream stream {STREAM_NAME}: {e}"))?;
    let mut info = stream
        .info()
        .await
        .map_err(|e| format!("reading back JetStream stream {STREAM_NAME}: {e}"))?
        .clone();
    let differences = config_differences(&info.config, storage, replicas);
    if !differences.refused.is_empty() {
        return Err(format!(
            "JetStream stream {STREAM_NAME} is not configured safely, so it is not consumed: {}",
            differences.refused.join("; ")
        ));
    }
    let identity = FenceIdentity {
        account,
        domain,
        stream: STREAM_NAME.to_string(),
        created: created_of(&info),
    };
    let Some(live) = streams.upgrade() else {
        return Ok(());
    };
    let fence = fence_for(&live, &identity, info.state.messages, register.is_some()).await?;
    drop(live);
    if !differences.updatable.is_empty() {
        info = update_in_place(&js, &mut stream, &info, &identity, placement, &differences).await?;
        ingest.update_nats(|s| s.updated = differences.updatable.clone());
    }
    let Some(live) = streams.upgrade() else {
        return Ok(());
    };
    let diagnostics = {
        let storage = live.storage().clone();
        tokio::task::spawn_blocking(move || storage.ingest_diagnostics(fence))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("reading diagnostics: {e:#}"))?
    };
    drop(live);
    let consumers = [
        BridgeConsumer {
            name: CONSUMER_NAME.to_string(),
            filter_subject: INGEST_SUBJECTS.to_string(),
            max_ack_pending: MAX_ACK_PENDING,
        },
        BridgeConsumer {
            name: RESUME_CONSUMER_NAME.to_string(),
            filter_subject: RESUME_SUBJECTS.to_string(),
            max_ack_pending: MAX_ACK_PENDING,
        },
    ];
    let mut streams_of_messages = Vec::new();
    for c in &consumers {
        let _ = stream.delete_consumer(&c.name).await;
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(c.name.clone()),
                filter_subject: c.filter_subject.clone(),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_ack_pending: c.max_ack_pending,
                deliver_policy: jetstream::consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("creating consumer {}: {e}", c.name))?;
        streams_of_messages.push(
            consumer
                .messages()
                .await
                .map_err(|e| format!("consuming {STREAM_NAME} ({}): {e}", c.name))?,
        );
    }
    let mut resumes = streams_of_messages.pop().expect("two consumers");
    let mut messages = streams_of_messages.pop().expect("two consumers");
    ingest.update_nats(|s| {
        s.fence = Some((fence, identity.clone()));
        s.diagnostics = diagnostics.into_iter().collect();
        s.consuming = true;
        s.last_error = None;
        s.pending = Some(info.state.messages);
        s.consumers = consumers.to_vec();
    });
    tracing::info!(stream = STREAM_NAME, fence, "ingest bridge consuming");
    if let Some(reply) = register.take() {
        let _ = reply.send(Ok(()));
    }
    let mut bridge = Bridge {
        ingest: ingest.clone(),
        client,
        js,
        stream,
        identity,
        fence,
        queues: HashMap::new(),
        queued: HashSet::new(),
        max_seen: 0,
        purged_below: 0,
        last_progress: Instant::now(),
        lease,
        retry_round: ingest.retry_round(),
    };
    loop {
        // The next message of either consumer (or, after HOLD, none: held
        // streams are looked at again).
        let first = tokio::time::timeout(HOLD, async {
            tokio::select! {
                m = messages.next() => (m, None),
                r = resumes.next() => (None, r),
            }
        })
        .await;
        let mut batch = Vec::new();
        let mut resume_batch = Vec::new();
        match first {
            Ok((Some(m), _)) => batch.push(m),
            Ok((_, Some(r))) => resume_batch.push(r),
            Ok((None, None)) => return Err("a JetStream consumer ended".into()),
            Err(_) => {}
        }
        while batch.len() < BATCH_MAX {
            match messages.next().now_or_never() {
                Some(Some(m)) => batch.push(m),
                _ => break,
            }
        }
        while resume_batch.len() < BATCH_MAX {
            match resumes.next().now_or_never() {
                Some(Some(r)) => resume_batch.push(r),
                _ => break,
            }
        }
        let Some(live) = streams.upgrade() else {
            return Ok(());
        };
        for m in batch {
            match received(m)? {
                Some(m) => bridge.admit(&live, m).await?,
                None => continue,
            }
        }
        bridge.append_due(&live).await?;
        for r in resume_batch {
            if let Some(r) = received(r)? {
                bridge.resume(&live, r).await?;
            }
        }
        bridge.keep_alive().await;
        if let Ok(info) = bridge.stream.info().await {
            let pending = info.state.messages;
            ingest.update_nats(|s| s.pending = Some(pending));
        }
    }
}

/// A message a consumer received; `None` for a missed heartbeat (the
/// client issues its pull again: a passing hiccup).
fn received(
    m: Result<jetstream::Message, pull::MessagesError>,
) -> Result<Option<jetstream::Message>, String> {
    match m {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == pull::MessagesErrorKind::MissingHeartbeat => {
            tracing::warn!(error = %e, "ingest bridge: a missed heartbeat");
            Ok(None)
        }
        Err(e) => Err(format!("receiving from {STREAM_NAME}: {e}")),
    }
}

/// Updates a registered stream's safe fields in place, reads it back and
/// checks it again: any error, a difference left or another identity
/// afterwards leaves the bridge not consuming (the error says which).
async fn update_in_place(
    js: &jetstream::Context,
    stream: &mut stream::Stream,
    info: &stream::Info,
    identity: &FenceIdentity,
    placement: Placement,
    differences: &Differences,
) -> Result<stream::Info, String> {
    let Placement { storage, replicas } = placement;
    let what = differences.updatable.join("; ");
    js.update_stream(updated_config(&info.config, storage, replicas))
        .await
        .map_err(|e| {
            format!(
                "updating JetStream stream {STREAM_NAME} in place ({what}) failed, so it is not \
                 consumed: {e}"
            )
        })?;
    let after = stream
        .info()
        .await
        .map_err(|e| format!("reading back JetStream stream {STREAM_NAME} after updating it: {e}"))?
        .clone();
    let left = config_differences(&after.config, storage, replicas);
    if !left.refused.is_empty() || !left.updatable.is_empty() {
        return Err(format!(
            "JetStream stream {STREAM_NAME} read back after updating it in place ({what}) still \
             differs, so it is not consumed: {}",
            [left.refused, left.updatable].concat().join("; ")
        ));
    }
    let now = FenceIdentity {
        created: created_of(&after),
        ..identity.clone()
    };
    let changes = identity_changes(identity, &now);
    if !changes.is_empty() {
        return Err(format!(
            "JetStream stream {STREAM_NAME} is another incarnation after updating it in place \
             ({}), so it is not consumed",
            changes.join("; ")
        ));
    }
    tracing::info!(stream = STREAM_NAME, updated = %what, "ingest stream updated in place");
    Ok(after)
}

/// The JetStream domain of the connection's account (empty: none).
async fn domain_of(js: &jetstream::Context) -> Result<String, String> {
    Ok(js
        .query_account()
        .await
        .map_err(|e| format!("reading the JetStream account: {e}"))?
        .domain
        .unwrap_or_default())
}

/// How the identity the broker reports now differs from the fence's: the
/// account, the domain or the stream's creation time (empty: the same).
pub fn identity_changes(fence: &FenceIdentity, now: &FenceIdentity) -> Vec<String> {
    let mut changes = Vec::new();
    for (what, was, is) in [
        ("account", &fence.account, &now.account),
        ("domain", &fence.domain, &now.domain),
        ("stream name", &fence.stream, &now.stream),
        ("creation time", &fence.created, &now.created),
    ] {
        if was != is {
            changes.push(format!("{what} {is:?}, the fence's {was:?}"));
        }
    }
    changes
}

/// The account this connection acts in, as the broker reports it.
async fn account_of(client: &async_nats::Client) -> Result<String, String> {
    let reply = client
        .request("$SYS.REQ.USER.INFO", "".into())
        .await
        .map_err(|e| {
            format!("the broker did not report an account identity ($SYS.REQ.USER.INFO): {e}")
        })?;
    let v: Value = serde_json::from_slice(&reply.payload)
        .map_err(|e| format!("the broker's $SYS.REQ.USER.INFO answer is not JSON: {e}"))?;
    match v.pointer("/data/account").and_then(Value::as_str) {
        Some(a) if !a.is_empty() => Ok(a.to_string()),
        _ => Err(format!(
            "the broker reported no account identity ($SYS.REQ.USER.INFO answered {v})"
        )),
    }
}

fn created_of(info: &stream::Info) -> String {
    let nanos = info.created.unix_timestamp_nanos();
    let at = chrono::DateTime::from_timestamp_nanos(nanos as i64);
    at.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// The fence this incarnation may be consumed under, registering a first
/// (or, when asked, a recreated) empty stream.
async fn fence_for(
    streams: &Streams,
    identity: &FenceIdentity,
    messages: u64,
    requested: bool,
) -> Result<i64, String> {
    let storage = streams.storage().clone();
    let fences = tokio::task::spawn_blocking(move || storage.ingest_fences(STREAM_NAME))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("reading ingest fences: {e:#}"))?;
    if let Some(f) = fences.iter().find(|f| f.identity == *identity) {
        return Ok(f.id);
    }
    if let Some(previous) = fences.first() {
        if !requested {
            return Err(format!(
                "JetStream stream {STREAM_NAME} was recreated (created {}, account {:?}, domain {:?}; \
                 the registered one was created {}, account {:?}, domain {:?}): it is not consumed \
                 until `streamhost ingest register`",
                identity.created,
                identity.account,
                identity.domain,
                previous.identity.created,
                previous.identity.account,
                previous.identity.domain
            ));
        }
    }
    if messages > 0 {
        return Err(format!(
            "JetStream stream {STREAM_NAME} holds {messages} messages but was never registered: \
             registration needs an empty stream (drain or purge it with publishers stopped, then \
             `streamhost ingest register`)"
        ));
    }
    let op = IngestOp::Register {
        identity: identity.clone(),
        registered_at: format_timestamp(crate::clock::Clock::now_ms(&crate::clock::SystemClock)),
    };
    let id = match streams.storage().submit(WriteOp::Ingest(op)).await {
        Ok(Ok(id)) => id,
        Ok(Err(e)) => return Err(format!("registering the fence: {e}")),
        Err(_) => return Err("the storage writer stopped".into()),
    };
    tracing::info!(stream = STREAM_NAME, created = %identity.created, fence = id, "ingest fence registered");
    Ok(id)
}

/// A message waiting for its append.
struct Queued {
    message: jetstream::Message,
    sequence: u64,
    event: EventInput,
}

/// A stream's queue: messages in sequence order, and when to try next.
struct Queue {
    messages: VecDeque<Queued>,
    not_before: Instant,
    /// Refusals for now in a row: the backoff before the next try.
    failures: u32,
}

struct Bridge {
    ingest: Ingest,
    /// The connection, to ask the broker again which account it acts in.
    client: async_nats::Client,
    js: jetstream::Context,
    stream: stream::Stream,
    identity: FenceIdentity,
    fence: i64,
    queues: HashMap<StreamAddress, Queue>,
    /// Sequences queued (a redelivery of one is not queued twice).
    queued: HashSet<u64>,
    /// The highest sequence received.
    max_seen: u64,
    /// Every sequence below this was purged.
    purged_below: u64,
    last_progress: Instant,
    /// Several hosts: the storage whose tenure holds the bridge's lease,
    /// and its lapse count when the lease was taken.
    lease: Option<(crate::storage::Storage, u64)>,
    /// The last [`Ingest::retry_now`] round seen.
    retry_round: u64,
}

impl Bridge {
    /// Several hosts: this host still surely holds the bridge's lease (its
    /// renewals are on time and never lapsed since it took it); checked
    /// before every ack, purge and delete, so a host that loses the lease
    /// stops at once and another may take over.
    fn still_held(&self) -> Result<(), String> {
        match &self.lease {
            Some((storage, lapses))
                if !storage.lease_valid() || storage.lease_lapses() != *lapses =>
            {
                Err(
                    "this host lost the bridge's lease (its renewals were late): it stops \
                     acking and deleting; the bridge runs where the lease is now"
                        .into(),
                )
            }
            _ => Ok(()),
        }
    }

    /// Queues a message behind its stream's, or rejects it.
    async fn admit(
        &mut self,
        streams: &Streams,
        message: jetstream::Message,
    ) -> Result<(), String> {
        let sequence = message
            .info()
            .map_err(|e| format!("a message without JetStream metadata: {e}"))?
            .stream_sequence;
        self.max_seen = self.max_seen.max(sequence);
        if self.queued.contains(&sequence) {
            return Ok(());
        }
        let msg_id = msg_id_of(&message);
        let parsed = parse_subject(message.subject.as_str()).and_then(|address| {
            event_from_message(
                msg_id.as_deref(),
                &message.payload,
                self.ingest.config().max_event_bytes,
            )
            .map(|mut event| {
                // The message's W3C trace context headers, as an HTTP
                // append's (a malformed one is ignored).
                if event.trace.is_none() {
                    let header = |name: &str| {
                        message
                            .headers
                            .as_ref()
                            .and_then(|h| h.get(name))
                            .map(|v| v.as_str())
                    };
                    event.trace = header("traceparent")
                        .and_then(|t| crate::trace::Trace::parse(t, header("tracestate")));
                }
                (address, event)
            })
        });
        match parsed {
            Ok((address, event)) => {
                self.queued.insert(sequence);
                self.queues
                    .entry(address)
                    .or_insert_with(|| Queue {
                        messages: VecDeque::new(),
                        not_before: Instant::now(),
                        failures: 0,
                    })
                    .messages
                    .push_back(Queued {
                        message,
                        sequence,
                        event,
                    });
                Ok(())
            }
            Err(reason) => self.reject(streams, &message, sequence, None, reason).await,
        }
    }

    /// Appends the queued messages of every stream not waiting, then acks
    /// and deletes them.
    async fn append_due(&mut self, streams: &Streams) -> Result<(), String> {
        let now = Instant::now();
        if self.ingest.retry_round() != self.retry_round {
            self.retry_round = self.ingest.retry_round();
            for q in self.queues.values_mut() {
                q.not_before = now;
            }
        }
        let due: Vec<(StreamAddress, Vec<Queued>)> = self
            .queues
            .iter_mut()
            .filter(|(_, q)| q.not_before <= now && !q.messages.is_empty())
            .map(|(a, q)| {
                let n = q.messages.len().min(BATCH_MAX);
                (a.clone(), q.messages.drain(..n).collect())
            })
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        let results = futures_util::future::join_all(due.into_iter().map(|(address, msgs)| {
            let streams = streams.clone();
            async move {
                let input = AppendInput {
                    events: msgs.iter().map(|q| q.event.clone()).collect(),
                    expected_stream_id: None,
                };
                let result = streams.append(&address, input, Authority::Public).await;
                (address, msgs, result)
            }
        }))
        .await;
        let mut done: Vec<Queued> = Vec::new();
        for (address, msgs, result) in results {
            match result {
                Ok(_) => {
                    if let Some(q) = self.queues.get_mut(&address) {
                        q.failures = 0;
                    }
                    done.extend(msgs)
                }
                Err(e) if is_retryable(&e) => self.hold(address, msgs),
                Err(_) => {
                    // One of them can never be appended: find it.
                    let mut msgs = msgs.into_iter();
                    while let Some(q) = msgs.next() {
                        let input = AppendInput {
                            events: vec![q.event.clone()],
                            expected_stream_id: None,
                        };
                        match streams.append(&address, input, Authority::Public).await {
                            Ok(_) => {
                                if let Some(queue) = self.queues.get_mut(&address) {
                                    queue.failures = 0;
                                }
                                done.push(q)
                            }
                            Err(e) if is_retryable(&e) => {
                                let rest: Vec<Queued> = std::iter::once(q).chain(msgs).collect();
                                self.hold(address.clone(), rest);
                                break;
                            }
                            Err(e) => {
                                let reason = format!(
                                    "could not be appended to {address}: {} ({})",
                                    e.message, e.code
                                );
                                self.queued.remove(&q.sequence);
                                self.reject(
                                    streams,
                                    &q.message,
                                    q.sequence,
                                    Some(&q.event),
                                    reason,
                                )
                                .await?;
                            }
                        }
                    }
                }
            }
        }
        self.queues.retain(|_, q| !q.messages.is_empty());
        if done.is_empty() {
            return Ok(());
        }
        self.check_fence().await?;
        for q in &done {
            q.message
                .ack()
                .await
                .map_err(|e| format!("acking message {}: {e}", q.sequence))?;
        }
        for q in &done {
            self.queued.remove(&q.sequence);
        }
        self.reclaim(&done).await
    }

    /// Removes terminal messages from JetStream, which frees their capacity:
    /// every sequence below the lowest one still waiting (and not past the
    /// last one received) with one purge, the rest one by one. The consumer
    /// receives in sequence order, so a sequence below that floor was
    /// received, and is terminal (appended or rejected) unless waiting.
    async fn reclaim(&mut self, done: &[Queued]) -> Result<(), String> {
        self.still_held()?;
        let floor = self
            .queued
            .iter()
            .min()
            .copied()
            .unwrap_or(u64::MAX)
            .min(self.max_seen + 1);
        if floor > self.purged_below {
            // Only events' subjects: resumes are the other consumer's.
            self.stream
                .purge()
                .filter(INGEST_SUBJECTS)
                .sequence(floor)
                .await
                .map_err(|e| format!("purging messages below {floor} after their appends: {e}"))?;
            self.purged_below = floor;
        }
        let deletes = done
            .iter()
            .filter(|q| q.sequence >= floor)
            .map(|q| self.stream.delete_message(q.sequence));
        for r in futures_util::future::join_all(deletes).await {
            r.map_err(|e| format!("deleting a message after its append: {e}"))?;
        }
        Ok(())
    }

    /// Puts messages back at the front of their stream's queue, to be tried
    /// again after the delivery backoff.
    fn hold(&mut self, address: StreamAddress, msgs: Vec<Queued>) {
        let q = self.queues.entry(address).or_insert_with(|| Queue {
            messages: VecDeque::new(),
            not_before: Instant::now(),
            failures: 0,
        });
        for m in msgs.into_iter().rev() {
            q.messages.push_front(m);
        }
        q.failures = q.failures.saturating_add(1);
        q.not_before = Instant::now() + self.ingest.backoff(q.failures);
    }

    /// Held messages stay delivered to this consumer (no redelivery behind
    /// the queue's back).
    async fn keep_alive(&mut self) {
        if self.last_progress.elapsed() < PROGRESS_EVERY {
            return;
        }
        self.last_progress = Instant::now();
        for q in self.queues.values().flat_map(|q| q.messages.iter()) {
            let _ = q.message.ack_with(jetstream::AckKind::Progress).await;
        }
    }

    /// Parks a message refused for good (or not an event at all) with its
    /// whole input and a diagnostic, then acks and deletes it: it stays in
    /// storage, counted against its project's ingest capacity, until it is
    /// redriven or discarded.
    async fn reject(
        &mut self,
        streams: &Streams,
        message: &jetstream::Message,
        sequence: u64,
        event: Option<&EventInput>,
        reason: String,
    ) -> Result<(), String> {
        use base64::Engine as _;
        tracing::warn!(sequence, %reason, "ingest message refused for good: parked");
        let subject = message.subject.as_str();
        let (project, path) = match parse_subject(subject) {
            Ok(a) => (a.namespace.storage_key().to_string(), a.path),
            // Its project, if the subject names a valid one.
            Err(_) => (
                subject
                    .split('.')
                    .nth(1)
                    .filter(|p| crate::stream::Namespace::project(p).is_ok())
                    .unwrap_or_default()
                    .to_string(),
                String::new(),
            ),
        };
        let now = format_timestamp(streams.now_ms());
        let row = crate::storage::NewParked {
            project: project.clone(),
            path,
            key: format!("nats:{}:{sequence}", self.fence),
            body: event
                .and_then(|e| serde_json::to_string(e).ok())
                .unwrap_or_default(),
            raw: base64::engine::general_purpose::STANDARD.encode(&message.payload),
            subject: subject.to_string(),
            sequence,
            reason: reason.clone(),
            accepted_at: now.clone(),
        };
        let park = IngestOp::ParkMessage {
            row,
            parked_at: now,
        };
        match streams.storage().submit(WriteOp::Ingest(park)).await {
            Ok(Ok(bytes)) => {
                if bytes > 0 {
                    self.ingest.charge(&project, 1, bytes as u64);
                }
            }
            Ok(Err(e)) => return Err(format!("parking a refused message: {e}")),
            Err(_) => return Err("the storage writer stopped".into()),
        }
        self.forget(streams, message, sequence, reason).await
    }

    /// Records a message's diagnostic (the fence's latest 64), then acks and
    /// deletes it.
    async fn forget(
        &mut self,
        streams: &Streams,
        message: &jetstream::Message,
        sequence: u64,
        reason: String,
    ) -> Result<(), String> {
        let op = IngestOp::Diagnostic {
            fence: self.fence,
            sequence,
            reason: reason.clone(),
        };
        match streams.storage().submit(WriteOp::Ingest(op)).await {
            Ok(Ok(new)) => {
                if new > 0 {
                    self.ingest.update_nats(|s| {
                        s.diagnostics.push_back((sequence, reason));
                        while s.diagnostics.len() > DIAGNOSTICS_KEPT as usize {
                            s.diagnostics.pop_front();
                        }
                    });
                }
            }
            Ok(Err(e)) => return Err(format!("recording a rejection: {e}")),
            Err(_) => return Err("the storage writer stopped".into()),
        }
        self.check_fence().await?;
        message
            .ack()
            .await
            .map_err(|e| format!("acking refused message {sequence}: {e}"))?;
        self.stream
            .delete_message(sequence)
            .await
            .map_err(|e| format!("deleting refused message {sequence}: {e}"))?;
        Ok(())
    }

    /// Resumes the subscription a resume message names, once (its
    /// `Nats-Msg-Id` is the resume's idempotency key), then acks and
    /// deletes the message. One that can never apply (not a resume, no such
    /// subscription) is a diagnostic, acked and deleted; one refused for now
    /// (the stream paused, its storage unavailable) is delivered again after
    /// the delivery backoff.
    async fn resume(
        &mut self,
        streams: &Streams,
        message: jetstream::Message,
    ) -> Result<(), String> {
        let info = message
            .info()
            .map_err(|e| format!("a message without JetStream metadata: {e}"))?;
        let (sequence, delivered) = (info.stream_sequence, info.delivered);
        let msg_id = msg_id_of(&message);
        let (address, key, id) =
            match resume_from_message(message.subject.as_str(), msg_id, &message.payload) {
                Ok(r) => r,
                Err(reason) => {
                    tracing::warn!(sequence, %reason, "ingest resume message refused for good");
                    return self.forget(streams, &message, sequence, reason).await;
                }
            };
        match streams.resume_subscription(&address, &key, Some(id)).await {
            Ok(_) => {
                self.check_fence().await?;
                message
                    .ack()
                    .await
                    .map_err(|e| format!("acking resume message {sequence}: {e}"))?;
                self.still_held()?;
                self.stream
                    .delete_message(sequence)
                    .await
                    .map_err(|e| format!("deleting resume message {sequence}: {e}"))?;
                Ok(())
            }
            Err(e) if is_retryable(&e) => {
                let attempts = u32::try_from(delivered).unwrap_or(u32::MAX).max(1);
                let _ = message
                    .ack_with(jetstream::AckKind::Nak(Some(self.ingest.backoff(attempts))))
                    .await;
                Ok(())
            }
            Err(e) => {
                let reason = format!(
                    "could not resume subscription {key:?} of {address}: {} ({})",
                    e.message, e.code
                );
                tracing::warn!(sequence, %reason, "ingest resume message refused for good");
                self.forget(streams, &message, sequence, reason).await
            }
        }
    }

    /// The stream is still the incarnation of the fence, in the same
    /// account and domain: asked of the broker again before every round
    /// of acks, purges and deletes (the broker has no conditional delete,
    /// so this check is what keeps a round off another incarnation).
    async fn check_fence(&mut self) -> Result<(), String> {
        self.still_held()?;
        let account = account_of(&self.client).await?;
        let domain = domain_of(&self.js).await?;
        let info = self
            .stream
            .info()
            .await
            .map_err(|e| format!("reading JetStream stream {STREAM_NAME}: {e}"))?;
        let now = FenceIdentity {
            account,
            domain,
            stream: info.config.name.clone(),
            created: created_of(info),
        };
        let changes = identity_changes(&self.identity, &now);
        if !changes.is_empty() {
            return Err(format!(
                "JetStream stream {STREAM_NAME} is no longer the fenced one ({}): it was recreated \
                 or the connection acts elsewhere, so nothing more is acked or deleted from it",
                changes.join("; ")
            ));
        }
        Ok(())
    }
}

/// A message's `Nats-Msg-Id` header, if it has one.
fn msg_id_of(message: &jetstream::Message) -> Option<String> {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|v| v.as_str().to_string())
}

/// What a resume message asks: the stream its subject names
/// (`streamhost.{project}.resume.{path tokens}`), the subscription's key
/// (its payload, `{"subscriptionKey"}`) and its `Nats-Msg-Id` (the resume's
/// idempotency key).
pub fn resume_from_message(
    subject: &str,
    msg_id: Option<String>,
    payload: &[u8],
) -> Result<(StreamAddress, String, String), String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Resume {
        subscription_key: String,
    }
    let address = super::parse_subject_as(subject, "resume")?;
    let Some(msg_id) = msg_id.filter(|m| !m.is_empty()) else {
        return Err(
            "the resume message has no Nats-Msg-Id header (it is the resume's idempotency key)"
                .into(),
        );
    };
    let resume: Resume = serde_json::from_slice(payload)
        .map_err(|e| format!("the resume message is not {{\"subscriptionKey\": \"...\"}}: {e}"))?;
    if resume.subscription_key.is_empty() {
        return Err("the resume message's subscriptionKey is empty".into());
    }
    Ok((address, resume.subscription_key, msg_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_names_each_part_of_the_identity_that_changed() {
        let fence = FenceIdentity {
            account: "A".into(),
            domain: "hub".into(),
            stream: STREAM_NAME.into(),
            created: "2026-12-01T00:00:00Z".into(),
        };
        assert!(identity_changes(&fence, &fence.clone()).is_empty());
        let moved = FenceIdentity {
            account: "B".into(),
            domain: "leaf".into(),
            created: "2026-12-02T00:00:00Z".into(),
            ..fence.clone()
        };
        let changes = identity_changes(&fence, &moved);
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert!(changes[0].contains("account \"B\", the fence's \"A\""));
        assert!(changes[1].contains("domain \"leaf\""));
        assert!(changes[2].contains("creation time"));
    }

    #[test]
    fn the_safe_configuration_passes_and_each_unsafe_field_is_named() {
        assert_eq!(
            config_differences(&safe_config(NatsStorage::File, 1), NatsStorage::File, 1),
            Differences::default()
        );
        let mut c = safe_config(NatsStorage::File, 1);
        c.max_age = Duration::from_secs(60);
        c.discard = stream::DiscardPolicy::Old;
        c.storage = stream::StorageType::Memory;
        c.allow_rollup = true;
        c.max_messages = 1_000_000;
        c.max_message_size = -1;
        c.subjects.push("orders.>".into());
        let d = config_differences(&c, NatsStorage::File, 1);
        assert_eq!(d.refused.len(), 7, "{d:?}");
        assert!(d.updatable.is_empty(), "{d:?}");
        for part in [
            "max age",
            "discard",
            "storage",
            "rollup",
            "max messages is 1000000, not 50000",
            "max message size is -1, not 1048576",
            "subjects include [\"orders.>\"]",
        ] {
            assert!(d.refused.iter().any(|x| x.contains(part)), "{part}: {d:?}");
        }
    }

    #[test]
    fn a_missing_subject_of_ours_a_lower_limit_and_replicas_are_updated_in_place() {
        // A stream as an older build created it: events' subjects only.
        let mut c = safe_config(NatsStorage::File, 1);
        c.subjects = vec![INGEST_SUBJECTS.into()];
        c.max_bytes = 1024;
        c.num_replicas = 0; // the server's default: one
        let d = config_differences(&c, NatsStorage::File, 3);
        assert!(d.refused.is_empty(), "{d:?}");
        assert_eq!(
            d.updatable,
            vec![
                format!("subjects lack [{RESUME_SUBJECTS:?}]"),
                format!("max bytes is 1024, raised to {MAX_BYTES}"),
                "replicas are 1, set to 3".to_string(),
            ]
        );
        let updated = updated_config(&c, NatsStorage::File, 3);
        assert_eq!(
            config_differences(&updated, NatsStorage::File, 3),
            Differences::default()
        );
        assert_eq!(updated.name, c.name);
        // Higher limits are not lowered in place: refused.
        c.max_bytes = MAX_BYTES * 2;
        let d = config_differences(&c, NatsStorage::File, 1);
        assert_eq!(d.refused.len(), 1, "{d:?}");
    }

    #[test]
    fn memory_storage_is_safe_only_when_asked_for_and_capped() {
        let memory = safe_config(NatsStorage::Memory, 1);
        assert_eq!(memory.storage, stream::StorageType::Memory);
        assert_eq!(memory.max_bytes, MEMORY_MAX_BYTES);
        assert_eq!(
            config_differences(&memory, NatsStorage::Memory, 1),
            Differences::default()
        );
        let refused = config_differences(&memory, NatsStorage::File, 1);
        assert_eq!(refused.refused.len(), 1, "{refused:?}");
        assert!(
            refused.refused[0].contains("storage is Memory, not File"),
            "{refused:?}"
        );
        // Its 20 MiB is lower than the file stream's 512 MiB: raised in
        // place were it not refused for its storage.
        assert_eq!(refused.updatable.len(), 1, "{refused:?}");
        let file = config_differences(&safe_config(NatsStorage::File, 1), NatsStorage::Memory, 1);
        assert!(
            file.refused
                .iter()
                .any(|d| d.contains("[ingest] nats-storage = \"memory\"")),
            "{file:?}"
        );
    }

    #[test]
    fn a_resume_message_names_its_stream_its_subscription_and_its_key() {
        let (address, key, id) = resume_from_message(
            "streamhost.acme.resume.orders.eu",
            Some("r-1".into()),
            br#"{"subscriptionKey": "to-billing"}"#,
        )
        .unwrap();
        assert_eq!(address.path, "/orders/eu");
        assert_eq!(address.namespace.storage_key(), "acme");
        assert_eq!((key.as_str(), id.as_str()), ("to-billing", "r-1"));
        for (subject, id, payload, says) in [
            (
                "streamhost.acme.ingest.orders",
                Some("r"),
                "{\"subscriptionKey\":\"k\"}",
                "streamhost.{project}.resume.",
            ),
            (
                "streamhost.acme.resume.orders",
                None,
                "{\"subscriptionKey\":\"k\"}",
                "no Nats-Msg-Id",
            ),
            (
                "streamhost.acme.resume.orders",
                Some("r"),
                "{\"key\":\"k\"}",
                "is not {\"subscriptionKey\"",
            ),
            (
                "streamhost.acme.resume.orders",
                Some("r"),
                "[1]",
                "is not {\"subscriptionKey\"",
            ),
            (
                "streamhost.acme.resume.orders",
                Some("r"),
                "{\"subscriptionKey\":\"\"}",
                "is empty",
            ),
            (
                "streamhost.BAD PROJECT.resume.orders",
                Some("r"),
                "{\"subscriptionKey\":\"k\"}",
                "BAD PROJECT",
            ),
        ] {
            let e = resume_from_message(subject, id.map(str::to_string), payload.as_bytes())
                .unwrap_err();
            assert!(e.contains(says), "{subject} {payload}: {e}");
        }
    }
}
