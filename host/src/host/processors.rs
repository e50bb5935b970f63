//! Processor instances on a stream: the instance's checkpoint and health,
//! its keyed state, and verifying it against a refold of its log.
//! `GET {stream}:processors/{component}[/keys[/{key}]]` and
//! `POST {stream}:verifyProcessor` over HTTP.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::request::{StreamAnswer, StreamRequest};
use super::wait::Look;
use super::Host;
use crate::error::Error;
use crate::processor::keyed::{value_from_json, value_json};
use crate::stream::{CoreState, StreamAddress};
use crate::subscription::{OutboundSubscription, Receiver};

/// What a processor instance is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessorStatus {
    /// Folding, or folded within the idle teardown time.
    Active,
    /// Caught up and torn down.
    Idle,
    /// Its last wake failed; it is retried with backoff.
    Failing,
    /// Stopped on a failure until it is resumed or a new version is deployed.
    Halted,
}

/// A processor instance: its checkpoint, state and health.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorInstance {
    /// The component.
    pub component: String,
    /// The version that wrote the checkpoint.
    pub digest: Option<String>,
    /// The source stream's lifetime.
    pub stream_id: String,
    /// The last source offset folded (0: none yet).
    pub checkpoint_offset: u64,
    /// The folded JSON state (`None` before the first checkpoint).
    pub state: Option<Value>,
    /// What the instance is doing.
    pub status: ProcessorStatus,
    /// The last failure's message while it is failing or halted.
    pub last_error: Option<String>,
    /// The last failure, kept across restarts.
    pub last_failure: Option<ProcessorFailure>,
    /// When the checkpoint was written (RFC 3339).
    pub updated_at: Option<String>,
}

/// A processor's last failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorFailure {
    /// When it failed (RFC 3339).
    pub failed_at: String,
    /// The event it failed on, when known.
    pub offset: Option<u64>,
    /// The guest's own words (its stderr's tail first).
    pub message: String,
    /// A command that runs the failing fold under the `wasmtime` CLI.
    pub repro: Option<String>,
    /// The processor has since folded past it and is neither failing nor
    /// halted: the failure is history, not a problem.
    #[serde(default)]
    pub resolved: bool,
}

/// Which keys of a processor's keyed state to read: a page in byte order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeysQuery {
    /// Only keys starting with this.
    pub prefix: String,
    /// Only keys after this one (the previous page's `next_after`).
    pub after: Option<String>,
    /// At most this many (at most [`KEYS_LIMIT_MAX`]).
    pub limit: usize,
}

/// Most keys in one page.
pub const KEYS_LIMIT_MAX: usize = 1000;

impl Default for KeysQuery {
    fn default() -> Self {
        KeysQuery {
            prefix: String::new(),
            after: None,
            limit: 100,
        }
    }
}

impl KeysQuery {
    /// The first 100 keys.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only keys starting with `prefix`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Only keys after `key`.
    pub fn after(mut self, key: impl Into<String>) -> Self {
        self.after = Some(key.into());
        self
    }

    /// At most `limit` keys (1 to [`KEYS_LIMIT_MAX`]).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

/// One key of a processor's keyed state and its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value's bytes (served as text when UTF-8, else `{"base64": ...}`).
    #[serde(
        serialize_with = "serialize_value",
        deserialize_with = "deserialize_value"
    )]
    pub value: Vec<u8>,
}

fn serialize_value<S: Serializer>(value: &[u8], s: S) -> Result<S::Ok, S::Error> {
    value_json(value).serialize(s)
}

fn deserialize_value<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    value_from_json("value", &Value::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn deserialize_maybe_value<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        v => value_from_json("value", &v)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

fn serialize_maybe_value<S: Serializer>(value: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    value.as_deref().map(value_json).serialize(s)
}

/// A page of keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeysPage {
    /// The keys, in byte order.
    pub keys: Vec<KeyValue>,
    /// The last key when there are more: the next page's
    /// [`KeysQuery::after`].
    pub next_after: Option<String>,
}

/// What verifying an instance found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// The component.
    pub component: String,
    /// The version refolded (the checkpoint's).
    pub digest: String,
    /// The offset folded up to.
    pub checkpoint_offset: u64,
    /// The refold's state and keys equal the stored ones.
    pub matches: bool,
    /// The stored JSON state.
    pub stored_state: Value,
    /// The refold's JSON state.
    pub refolded_state: Value,
    /// Distinct keys compared.
    pub keys_compared: u64,
    /// The first key (in byte order) whose values differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_differing_key: Option<DifferingKey>,
    /// The offsets of redacted events the refold met (`:redact`): the guest
    /// saw their payload as `null`, so a state folded from them before
    /// their redaction may differ from the refold's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redacted_offsets: Vec<u64>,
}

/// A key whose stored and refolded values differ (`None`: absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DifferingKey {
    /// The key.
    pub key: String,
    /// Its stored value.
    #[serde(
        serialize_with = "serialize_maybe_value",
        deserialize_with = "deserialize_maybe_value"
    )]
    pub stored: Option<Vec<u8>>,
    /// Its refolded value.
    #[serde(
        serialize_with = "serialize_maybe_value",
        deserialize_with = "deserialize_maybe_value"
    )]
    pub refolded: Option<Vec<u8>>,
}

/// The subscription of a stream that wakes `component`.
pub(crate) fn wake_subscription(
    state: &CoreState,
    component: &str,
) -> Option<OutboundSubscription> {
    state
        .subscriptions
        .outbound
        .by_key
        .values()
        .find(|s| match &s.configuration.receiver {
            Receiver::ProcessorWake { expression } => {
                crate::itx::wake_component(expression).ok().as_deref() == Some(component)
            }
            _ => false,
        })
        .cloned()
}

fn processor_not_found(component: &str, address: &StreamAddress) -> Error {
    Error::not_found(
        "processor-not-found",
        format!(
            "processor {component:?} has no instance on stream {:?}",
            address.path
        ),
    )
}

impl Host {
    /// The instance of processor `component` on `stream`: its checkpoint,
    /// state and health, or `processor-not-found`.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # use serde_json::json;
    /// # host.deploy(streamhost::Deploy::new("acme", "ledger", std::fs::read(guests.join("ledger.wasm"))?)).await?;
    /// # let bank = host.stream("acme", "/bank")?;
    /// # host.subscribe(&bank, &streamhost::Subscription::wake("ledger", "ledger").from_beginning()).await?;
    /// # host.append(&bank, [
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "alice", "cents": 500})),
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "bob", "cents": 70})),
    /// #     streamhost::EventInput::new("withdrawn").payload(json!({"account": "alice", "cents": 120})),
    /// # ]).await?;
    /// # let head = host.state(&bank).await?.max_offset;
    /// # host.wait_for_processor(&bank, "ledger", head, std::time::Duration::from_secs(60)).await?;
    /// let ledger = host.processor(&bank, "ledger").await?;
    /// assert_eq!(ledger.state.expect("folded")["events"], 3);
    /// assert_eq!(ledger.last_failure, None);
    /// # Ok(()) }
    /// ```
    pub async fn processor(
        &self,
        stream: &StreamAddress,
        component: &str,
    ) -> Result<ProcessorInstance, Error> {
        match self
            .apply(
                stream,
                StreamRequest::Processor {
                    component: component.to_string(),
                },
            )
            .await?
        {
            StreamAnswer::Processor(x) => Ok(*x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::processor`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn processor_here(
        &self,
        stream: &StreamAddress,
        component: &str,
    ) -> Result<ProcessorInstance, Error> {
        let state = self.streams.state(stream).await?;
        let runtime = self.streams.runtime(stream).await?;
        let (ns, path) = (
            stream.namespace.storage_key().to_string(),
            stream.path.clone(),
        );
        let name = component.to_string();
        let (checkpoint, last_failure) = self
            .read_storage("reading the checkpoint", move |s| {
                Ok(match s.load_stream(&ns, &path)? {
                    Some(r) => (
                        s.checkpoint(r.row_id, &name)?,
                        s.processor_failure(r.row_id, &name)?,
                    ),
                    None => (None, None),
                })
            })
            .await?;
        let checkpoint = checkpoint.filter(|c| c.stream_id == state.stream_id);
        if wake_subscription(&state, component).is_none() && checkpoint.is_none() {
            return Err(processor_not_found(component, stream));
        }
        let delivery = runtime
            .subscriptions
            .into_values()
            .find(|d| d.processor.as_deref() == Some(component));
        let idle_ms = self.config.processors.idle_teardown_ms as i64;
        let now = self.streams.now_ms();
        let status = match &delivery {
            Some(d) if d.halted => ProcessorStatus::Halted,
            Some(d) if d.attempt > 0 => ProcessorStatus::Failing,
            Some(d)
                if d.in_flight_deadline_at.is_some()
                    || d.waiting_for_place
                    || d.last_delivery_at.is_some_and(|t| now - t < idle_ms) =>
            {
                ProcessorStatus::Active
            }
            _ => ProcessorStatus::Idle,
        };
        let checkpoint_offset = checkpoint.as_ref().map_or(0, |c| c.checkpoint_offset);
        let well = !matches!(status, ProcessorStatus::Failing | ProcessorStatus::Halted);
        Ok(ProcessorInstance {
            component: component.to_string(),
            digest: checkpoint.as_ref().map(|c| c.digest.clone()),
            stream_id: state.stream_id.clone(),
            checkpoint_offset,
            state: checkpoint
                .as_ref()
                .and_then(|c| serde_json::from_str(&c.state).ok()),
            status,
            last_error: delivery.and_then(|d| d.last_error),
            last_failure: last_failure
                .filter(|f| f.stream_id == state.stream_id)
                .map(|f| ProcessorFailure {
                    resolved: well && f.offset.is_none_or(|o| checkpoint_offset >= o),
                    failed_at: f.failed_at,
                    offset: f.offset,
                    message: f.message,
                    repro: f.repro,
                }),
            updated_at: checkpoint.map(|c| c.updated_at),
        })
    }

    /// Waits until processor `component` on `stream` has folded through
    /// `offset` (its checkpoint at or past it) and answers the instance
    /// then; `timeout` naming how far it got once `within` has passed, and
    /// `processor-halted` with the processor's last error as soon as it is
    /// halted (it folds no further until resumed or redeployed). Looks
    /// again whenever a wake on this host ends, and every quarter second
    /// (a refold, or a wake on another host, rings no bell here).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// use std::time::Duration;
    /// use streamhost::{Deploy, EventInput, Subscription};
    ///
    /// host.deploy(Deploy::new("acme", "counter", std::fs::read(guests.join("counter.wasm"))?)).await?;
    /// let clicks = host.stream("acme", "/clicks")?;
    /// host.subscribe(&clicks, &Subscription::wake("counter", "counter").from_beginning()).await?;
    /// let appended = host.append(&clicks, [EventInput::new("events.example/clicked")]).await?;
    /// let head = appended.events[0].offset;
    /// let counter = host.wait_for_processor(&clicks, "counter", head, Duration::from_secs(60)).await?;
    /// assert_eq!(counter.checkpoint_offset, head);
    /// let later = host.wait_for_processor(&clicks, "counter", head + 5, Duration::from_millis(50)).await;
    /// assert_eq!(later.unwrap_err().code, "timeout");
    /// # Ok(()) }
    /// ```
    pub async fn wait_for_processor(
        &self,
        stream: &StreamAddress,
        component: &str,
        offset: u64,
        within: std::time::Duration,
    ) -> Result<ProcessorInstance, Error> {
        super::wait::until(
            &self.streams.executors().wakes_ended,
            within,
            async || {
                let instance = self.processor(stream, component).await?;
                if instance.checkpoint_offset >= offset {
                    return Ok(Look::Done(instance));
                }
                if instance.status == ProcessorStatus::Halted {
                    return Err(Error::conflict(
                        "processor-halted",
                        format!(
                            "processor {component:?} on stream {:?} is halted at offset {} before reaching offset {offset}: {}",
                            stream.path,
                            instance.checkpoint_offset,
                            instance.last_error.as_deref().unwrap_or("no error recorded")
                        ),
                    ));
                }
                Ok(Look::NotYet(instance.checkpoint_offset))
            },
            |folded| {
                format!(
                    "processor {component:?} on stream {:?} folded through offset {folded}, not {offset}, within {} ms",
                    stream.path,
                    within.as_millis()
                )
            },
        )
        .await
    }

    /// The bucket of `component`'s instance on `stream` (0: no keys yet),
    /// or `processor-not-found`.
    async fn bucket_of(&self, stream: &StreamAddress, component: &str) -> Result<i64, Error> {
        let state = self.streams.state(stream).await?;
        let (ns, path) = (
            stream.namespace.storage_key().to_string(),
            stream.path.clone(),
        );
        let name = component.to_string();
        let checkpoint = self
            .read_storage("reading the checkpoint", move |s| {
                Ok(match s.load_stream(&ns, &path)? {
                    Some(r) => s.checkpoint(r.row_id, &name)?,
                    None => None,
                })
            })
            .await?
            .filter(|c| c.stream_id == state.stream_id);
        match checkpoint {
            Some(c) => Ok(c.bucket),
            None if wake_subscription(&state, component).is_some() => Ok(0),
            None => Err(processor_not_found(component, stream)),
        }
    }

    /// A page of the committed keys of processor `component` on `stream`,
    /// in byte order.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # use serde_json::json;
    /// # host.deploy(streamhost::Deploy::new("acme", "ledger", std::fs::read(guests.join("ledger.wasm"))?)).await?;
    /// # let bank = host.stream("acme", "/bank")?;
    /// # host.subscribe(&bank, &streamhost::Subscription::wake("ledger", "ledger").from_beginning()).await?;
    /// # host.append(&bank, [
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "alice", "cents": 500})),
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "bob", "cents": 70})),
    /// #     streamhost::EventInput::new("withdrawn").payload(json!({"account": "alice", "cents": 120})),
    /// # ]).await?;
    /// # let head = host.state(&bank).await?.max_offset;
    /// # host.wait_for_processor(&bank, "ledger", head, std::time::Duration::from_secs(60)).await?;
    /// use streamhost::KeysQuery;
    ///
    /// let page = host.processor_keys(&bank, "ledger", KeysQuery::new().prefix("balance/")).await?;
    /// let balances: Vec<(&str, &[u8])> =
    ///     page.keys.iter().map(|k| (k.key.as_str(), k.value.as_slice())).collect();
    /// assert_eq!(balances, [("balance/alice", &b"380"[..]), ("balance/bob", &b"70"[..])]);
    /// assert_eq!(page.next_after, None);
    /// # Ok(()) }
    /// ```
    pub async fn processor_keys(
        &self,
        stream: &StreamAddress,
        component: &str,
        query: KeysQuery,
    ) -> Result<KeysPage, Error> {
        match self
            .apply(
                stream,
                StreamRequest::ProcessorKeys {
                    component: component.to_string(),
                    query,
                },
            )
            .await?
        {
            StreamAnswer::Keys(x) => Ok(x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::processor_keys`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn processor_keys_here(
        &self,
        stream: &StreamAddress,
        component: &str,
        query: KeysQuery,
    ) -> Result<KeysPage, Error> {
        if !(1..=KEYS_LIMIT_MAX).contains(&query.limit) {
            return Err(Error::invalid(format!(
                "limit {} is out of range: it must be 1 to {KEYS_LIMIT_MAX}",
                query.limit
            )));
        }
        for (what, text) in [
            ("prefix", Some(&query.prefix)),
            ("after", query.after.as_ref()),
        ] {
            if text.is_some_and(|t| t.contains('\0')) {
                return Err(Error::invalid(format!(
                    "{what} {text:?} holds a NUL byte: keys are text without NUL"
                )));
            }
        }
        let bucket = self.bucket_of(stream, component).await?;
        let limit = query.limit;
        let mut rows = if bucket == 0 {
            Vec::new()
        } else {
            self.read_storage("reading the keys", move |s| {
                let max_bytes = s.bounds().read_bytes_max;
                s.keys_page(
                    bucket,
                    &query.prefix,
                    query.after.as_deref(),
                    limit + 1,
                    max_bytes,
                )
            })
            .await?
        };
        // Cut by its count (one more was read than is answered) or by its
        // bytes ([limits] max-read-bytes): the next page starts after it.
        let bytes: usize = rows.iter().map(|(k, v)| k.len() + v.len()).sum();
        let next_after = if rows.len() > limit {
            Some(rows[limit - 1].0.clone())
        } else if bytes >= self.streams.storage().bounds().read_bytes_max {
            rows.last().map(|(k, _)| k.clone())
        } else {
            None
        };
        rows.truncate(limit);
        Ok(KeysPage {
            keys: rows
                .into_iter()
                .map(|(key, value)| KeyValue { key, value })
                .collect(),
            next_after,
        })
    }

    /// One committed key of processor `component` on `stream`, or
    /// `key-not-found`.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # use serde_json::json;
    /// # host.deploy(streamhost::Deploy::new("acme", "ledger", std::fs::read(guests.join("ledger.wasm"))?)).await?;
    /// # let bank = host.stream("acme", "/bank")?;
    /// # host.subscribe(&bank, &streamhost::Subscription::wake("ledger", "ledger").from_beginning()).await?;
    /// # host.append(&bank, [
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "alice", "cents": 500})),
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "bob", "cents": 70})),
    /// #     streamhost::EventInput::new("withdrawn").payload(json!({"account": "alice", "cents": 120})),
    /// # ]).await?;
    /// # let head = host.state(&bank).await?.max_offset;
    /// # host.wait_for_processor(&bank, "ledger", head, std::time::Duration::from_secs(60)).await?;
    /// let bob = host.processor_key(&bank, "ledger", "balance/bob").await?;
    /// assert_eq!(bob.value, b"70");
    /// let carol = host.processor_key(&bank, "ledger", "balance/carol").await.unwrap_err();
    /// assert_eq!(carol.code, "key-not-found");
    /// # Ok(()) }
    /// ```
    pub async fn processor_key(
        &self,
        stream: &StreamAddress,
        component: &str,
        key: &str,
    ) -> Result<KeyValue, Error> {
        match self
            .apply(
                stream,
                StreamRequest::ProcessorKey {
                    component: component.to_string(),
                    key: key.to_string(),
                },
            )
            .await?
        {
            StreamAnswer::Key(x) => Ok(x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::processor_key`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn processor_key_here(
        &self,
        stream: &StreamAddress,
        component: &str,
        key: &str,
    ) -> Result<KeyValue, Error> {
        crate::processor::keyed::check_key(key).map_err(|e| match e {
            crate::processor::keyed::KeyedError::Refused(m) => Error::invalid(m),
            crate::processor::keyed::KeyedError::Storage(e) => Error::internal(format!("{e:#}")),
        })?;
        let bucket = self.bucket_of(stream, component).await?;
        let k = key.to_string();
        let value = if bucket == 0 {
            None
        } else {
            self.read_storage("reading the key", move |s| s.key_value(bucket, &k))
                .await?
        };
        match value {
            Some(value) => Ok(KeyValue {
                key: key.to_string(),
                value,
            }),
            None => Err(Error::not_found(
                "key-not-found",
                format!(
                    "processor {component:?} on stream {:?} has no key {key:?}",
                    stream.path
                ),
            )),
        }
    }

    /// Refolds processor `component` on `stream` from offset 0 in fresh
    /// instances of its checkpoint's version, and compares the state and
    /// every key with the stored ones.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # use serde_json::json;
    /// # host.deploy(streamhost::Deploy::new("acme", "ledger", std::fs::read(guests.join("ledger.wasm"))?)).await?;
    /// # let bank = host.stream("acme", "/bank")?;
    /// # host.subscribe(&bank, &streamhost::Subscription::wake("ledger", "ledger").from_beginning()).await?;
    /// # host.append(&bank, [
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "alice", "cents": 500})),
    /// #     streamhost::EventInput::new("deposited").payload(json!({"account": "bob", "cents": 70})),
    /// #     streamhost::EventInput::new("withdrawn").payload(json!({"account": "alice", "cents": 120})),
    /// # ]).await?;
    /// # let head = host.state(&bank).await?.max_offset;
    /// # host.wait_for_processor(&bank, "ledger", head, std::time::Duration::from_secs(60)).await?;
    /// let verified = host.verify_processor(&bank, "ledger").await?;
    /// assert!(verified.matches);
    /// assert_eq!(verified.first_differing_key, None);
    /// # Ok(()) }
    /// ```
    pub async fn verify_processor(
        &self,
        stream: &StreamAddress,
        component: &str,
    ) -> Result<Verification, Error> {
        match self
            .apply(
                stream,
                StreamRequest::VerifyProcessor {
                    component: component.to_string(),
                },
            )
            .await?
        {
            StreamAnswer::Verification(x) => Ok(*x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::verify_processor`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn verify_processor_here(
        &self,
        stream: &StreamAddress,
        component: &str,
    ) -> Result<Verification, Error> {
        let state = self.streams.state(stream).await?;
        let storage = self.streams.storage().clone();
        let runtime = self.streams.wasm_runtime().clone();
        let ns = stream.namespace.storage_key().to_string();
        let path = stream.path.clone();
        let component = component.to_string();
        let timeout_ms = self.config.delivery.timeout_ms;
        let limits = self.config.jsonata_limits();
        let filter = wake_subscription(&state, &component).and_then(|s| s.configuration.filter);
        let guest = runtime.clone();
        guest
            .run_guest(move || -> Result<Verification, Error> {
                let internal = |e: anyhow::Error| Error::internal(format!("{e:#}"));
                let row = storage
                    .load_stream(&ns, &path)
                    .map_err(internal)?
                    .ok_or_else(|| Error::stream_not_found(&path))?;
                let checkpoint = storage
                    .checkpoint(row.row_id, &component)
                    .map_err(internal)?
                    .filter(|c| c.stream_id == state.stream_id)
                    .ok_or_else(|| {
                        Error::not_found(
                            "processor-not-found",
                            format!("processor {component:?} has no checkpoint on stream {path:?}"),
                        )
                    })?;
                let digest = checkpoint.digest.clone();
                let bytes_storage = storage.clone();
                let prepared = runtime
                    .prepare(&checkpoint.digest, move || {
                        bytes_storage.component_bytes(&digest)
                    })
                    .map_err(internal)?;
                let (folded, scratch) = fold_from_start(
                    &FromStart {
                        storage: &storage,
                        project: &ns,
                        path: &path,
                        purpose: "verify",
                        runtime: &runtime,
                        prepared: &prepared,
                        component: &component,
                        timeout_ms,
                        row_id: row.row_id,
                        filter: filter.as_ref(),
                        limits,
                    },
                    crate::processor::stream_info(&state, checkpoint.checkpoint_offset),
                    checkpoint.checkpoint_offset,
                )?;
                let stored: Value = serde_json::from_str(&checkpoint.state).unwrap_or(Value::Null);
                let refolded: Value = serde_json::from_str(&folded).unwrap_or(Value::Null);
                let keys =
                    compare_keys(&storage, checkpoint.bucket, scratch.id()).map_err(internal)?;
                let redacted_offsets = storage
                    .redacted_offsets(row.row_id, checkpoint.checkpoint_offset)
                    .map_err(internal)?;
                Ok(Verification {
                    matches: stored == refolded && keys.differing.is_none(),
                    component,
                    digest: checkpoint.digest,
                    checkpoint_offset: checkpoint.checkpoint_offset,
                    stored_state: stored,
                    refolded_state: refolded,
                    keys_compared: keys.compared,
                    first_differing_key: keys.differing,
                    redacted_offsets,
                })
            })
            .await
            .map_err(|e| Error::internal(format!("verifying the processor panicked: {e}")))?
    }
}

/// What folding a processor from its initial state needs.
struct FromStart<'a> {
    storage: &'a crate::storage::Storage,
    /// The instance's project (storage key) and source path.
    project: &'a str,
    path: &'a str,
    /// Why it folds (`verify`, `at`): names its scratch bucket.
    purpose: &'a str,
    runtime: &'a crate::processor::runtime::Runtime,
    prepared: &'a crate::processor::runtime::Prepared,
    component: &'a str,
    timeout_ms: u64,
    row_id: i64,
    /// The processor-wake subscription's filter.
    filter: Option<&'a crate::subscription::Filter>,
    /// The bounds of its evaluations.
    limits: crate::jsonata::Limits,
}

/// Folds a processor from its initial state over the stream's committed
/// events in `(0, through]`, as its wakes would (`wake::fold_events`: the
/// environment is a function of the events, not of how the wakes cut the
/// batches), into a scratch bucket in storage (one of its own, dropped
/// with the answer); answers the state and the bucket.
fn fold_from_start(
    f: &FromStart<'_>,
    stream: crate::processor::runtime::StreamInfo,
    through: u64,
) -> Result<(String, crate::processor::scratch::Scratch), Error> {
    let guest = |e: crate::processor::runtime::GuestError| {
        Error::unprocessable(
            "processor-failed",
            format!("processor {:?}: {e}", f.component),
        )
    };
    let initial = f
        .runtime
        .initial_state(f.component, f.prepared, f.timeout_ms)
        .map_err(guest)?;
    // Retention removed what the instance's base folded: from there. (A
    // purpose of its own per call: folds of one instance at once do not
    // replace each other's.)
    let failed =
        |f: crate::delivery::Failure| Error::unavailable("storage-unavailable", f.message, 1);
    let (initial, after, scratch) = crate::processor::backfill::scratch_start(
        f.storage,
        f.row_id,
        &stream.stream_id,
        initial,
        crate::storage::ScratchInstance {
            project: f.project.to_string(),
            path: f.path.to_string(),
            component: f.component.to_string(),
            digest: f.prepared.digest.clone(),
            purpose: format!("{}/{}", f.purpose, uuid::Uuid::new_v4()),
        },
    )
    .map_err(failed)?;
    if through < after {
        return Err(Error::gone(
            "offset-gone",
            format!(
                "processor {:?}'s state at offset {through} is gone: retention removed events it \
                 folded, and its state is kept from offset {after} on",
                f.component
            ),
        ));
    }
    let (folded, bucket) = fold_range(
        f,
        stream,
        (initial, after, scratch.bucket()),
        through,
        Some(&scratch),
    )?;
    scratch.spill(bucket).map_err(failed)?;
    Ok((folded, scratch))
}

/// Folds a processor from `start` (a state, the offset it was folded
/// through, its keyed state) over the stream's committed events in
/// `(after, through]`, as its wakes would; answers the state and the
/// bucket with the fold's writes (those `spill` did not take).
fn fold_range(
    f: &FromStart<'_>,
    stream: crate::processor::runtime::StreamInfo,
    start: (String, u64, crate::processor::keyed::Bucket),
    through: u64,
    spill: Option<&crate::processor::scratch::Scratch>,
) -> Result<(String, crate::processor::keyed::Bucket), Error> {
    let announcement = f
        .runtime
        .describe(f.component, f.prepared, f.timeout_ms)
        .map_err(|e| {
            Error::unprocessable(
                "processor-failed",
                format!("processor {:?}: {e}", f.component),
            )
        })?;
    let compiled = crate::processor::wake::consumed(
        crate::filter::CompiledFilter::new(f.filter, false, f.limits).map_err(Error::invalid)?,
        &announcement,
    );
    let fold = crate::processor::backfill::RangeFold {
        guest: crate::processor::wake::Guest {
            runtime: f.runtime,
            prepared: f.prepared,
            component: f.component,
            timeout_ms: f.timeout_ms,
            output: None,
        },
        storage: f.storage,
        row_id: f.row_id,
        stream,
        filter: compiled,
        narrow: None,
        spill,
    };
    let (state, after, bucket) = start;
    let (folded, _, bucket) = fold
        .run(state, after, through, bucket, |_, _| Ok(()))
        .map_err(|f| Error::unprocessable("processor-failed", f.message))?;
    Ok((folded, bucket))
}

/// The keys under `prefix` of a bucket stored as `base` with `writes` over
/// it: at most [`STATE_AT_KEYS_MAX`] and about `max_bytes` of them, in key
/// order; and whether more exist.
fn keys_over(
    base: &crate::storage::StoredBucket,
    writes: &crate::storage::KeyWrites,
    prefix: &str,
    max_bytes: usize,
) -> anyhow::Result<(Vec<KeyValue>, bool)> {
    let under = || {
        writes
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
    };
    // Enough stored keys that the writes' deletes leave a full listing.
    let deletes = under().filter(|(_, v)| v.is_none()).count();
    let limit = STATE_AT_KEYS_MAX + 1 + deletes;
    let stored = base.page(prefix, limit, max_bytes)?;
    let full = stored.len() == limit;
    // A page the byte bound cut ends at its last key: what the writes put
    // after it is not listed (stored keys before it may be missing).
    let bytes: usize = stored.iter().map(|(k, v)| k.len() + v.len()).sum();
    let cut = !full && bytes >= max_bytes;
    let last = stored.last().map(|(k, _)| k.clone());
    let mut merged: std::collections::BTreeMap<String, Vec<u8>> = stored.into_iter().collect();
    for (k, v) in under() {
        if cut && last.as_ref().is_some_and(|l| k > l) {
            break;
        }
        match v {
            Some(v) => merged.insert(k.clone(), v.clone()),
            None => merged.remove(k),
        };
    }
    let more = full || cut || merged.len() > STATE_AT_KEYS_MAX;
    let listed = merged
        .into_iter()
        .take(STATE_AT_KEYS_MAX)
        .map(|(key, value)| KeyValue { key, value })
        .collect();
    Ok((listed, more))
}

/// A processor's state at an offset, folded on demand
/// (`:processors/{component}/at/{offset}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateAt {
    /// The component.
    pub component: String,
    /// The version that folded it: the one deployed now.
    pub digest: String,
    /// The offset it folded through.
    pub offset: u64,
    /// The state after the event at `offset`.
    pub state: Value,
    /// With a key prefix: its keyed state's keys under the prefix (in key
    /// order, at most [`STATE_AT_KEYS_MAX`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<KeyValue>>,
    /// Whether more keys matched than are listed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keys_truncated: bool,
}

/// The most keys a state at an offset lists.
pub const STATE_AT_KEYS_MAX: usize = 1000;

impl Host {
    /// The state (and, with `keys_prefix`, the keyed state under it) that
    /// the deployed version of `component` folds from its initial state
    /// over `stream` up to `offset`: computed on demand, stored nowhere,
    /// checkpoint and state untouched. The fold is the wakes' own (each
    /// guest call bounded by the delivery timeout, as a backfill's).
    pub async fn processor_at(
        &self,
        stream: &StreamAddress,
        component: &str,
        offset: u64,
        keys_prefix: Option<String>,
    ) -> Result<StateAt, Error> {
        match self
            .apply(
                stream,
                StreamRequest::ProcessorAt {
                    component: component.to_string(),
                    offset,
                    keys: keys_prefix,
                },
            )
            .await?
        {
            StreamAnswer::StateAt(x) => Ok(*x),
            other => Err(other.unexpected()),
        }
    }

    /// [`Host::processor_at`] on this host alone (see [`Host::apply`]).
    pub(crate) async fn processor_at_here(
        &self,
        stream: &StreamAddress,
        component: &str,
        offset: u64,
        keys_prefix: Option<String>,
    ) -> Result<StateAt, Error> {
        let state = self.streams.state(stream).await?;
        let sub = wake_subscription(&state, component).ok_or_else(|| {
            Error::not_found(
                "processor-not-found",
                format!(
                    "processor {component:?} has no processor-wake subscription on stream {:?}",
                    stream.path
                ),
            )
        })?;
        if offset > state.max_offset {
            return Err(Error::invalid(format!(
                "offset {offset} is beyond this stream's current maximum offset {}",
                state.max_offset
            )));
        }
        let storage = self.streams.storage().clone();
        let runtime = self.streams.wasm_runtime().clone();
        let ns = stream.namespace.storage_key().to_string();
        let path = stream.path.clone();
        let component = component.to_string();
        let timeout_ms = self.config.delivery.timeout_ms;
        let limits = self.config.jsonata_limits();
        // A fold is a call into the component: it takes one of the
        // project's places (a project folding back in time again and again
        // waits behind its own folds, then is refused).
        let place = self
            .streams
            .executors()
            .calls
            .enter_within(&ns, super::itx::CALL_WAIT)
            .await?;
        let guest = runtime.clone();
        guest
            .run_guest(move || -> Result<StateAt, Error> {
                let _place = place;
                let internal = |e: anyhow::Error| Error::internal(format!("{e:#}"));
                let row = storage
                    .load_stream(&ns, &path)
                    .map_err(internal)?
                    .ok_or_else(|| Error::stream_not_found(&path))?;
                let (prepared, _) = crate::processor::deployed(&storage, &runtime, &ns, &component)
                    .map_err(internal)?
                    .ok_or_else(|| super::components::component_not_found(&ns, &component))?;
                let from = FromStart {
                    storage: &storage,
                    project: &ns,
                    path: &path,
                    purpose: "at",
                    runtime: &runtime,
                    prepared: &prepared,
                    component: &component,
                    timeout_ms,
                    row_id: row.row_id,
                    filter: sub.configuration.filter.as_ref(),
                    limits,
                };
                // The instance's checkpoint, when the deployed version
                // folded it at or before the offset: the fold goes on from
                // it (its keys read as they were at it), not from the start.
                let snapshot = storage
                    .checkpoint_snapshot(row.row_id, &component)
                    .map_err(internal)?
                    .filter(|(c, _)| {
                        c.digest == prepared.digest
                            && c.stream_id == state.stream_id
                            && c.checkpoint_offset <= offset
                    });
                // The keys under the prefix: at most STATE_AT_KEYS_MAX, and
                // no more bytes than a page of reads (at least one key).
                let bound = storage.bounds().read_bytes_max;
                let listed = |base: &crate::storage::StoredBucket,
                              writes: &crate::storage::KeyWrites|
                 -> Result<(Option<Vec<KeyValue>>, bool), Error> {
                    match &keys_prefix {
                        None => Ok((None, false)),
                        Some(prefix) => {
                            let (keys, more) =
                                keys_over(base, writes, prefix, bound).map_err(internal)?;
                            Ok((Some(keys), more))
                        }
                    }
                };
                let stream = crate::processor::stream_info(&state, offset);
                let (folded, (keys, keys_truncated)) = match snapshot {
                    Some((checkpoint, stored)) => {
                        let stored = std::sync::Arc::new(stored);
                        let start = (
                            checkpoint.state,
                            checkpoint.checkpoint_offset,
                            crate::processor::keyed::Bucket::new(stored.clone()),
                        );
                        let (folded, bucket) = fold_range(&from, stream, start, offset, None)?;
                        (folded, listed(&stored, bucket.writes())?)
                    }
                    None => {
                        let (folded, scratch) = fold_from_start(&from, stream, offset)?;
                        let stored = storage.stored_bucket(scratch.id(), "");
                        (folded, listed(&stored, &Default::default())?)
                    }
                };
                Ok(StateAt {
                    component,
                    digest: prepared.digest.clone(),
                    offset,
                    state: serde_json::from_str(&folded).unwrap_or(Value::Null),
                    keys,
                    keys_truncated,
                })
            })
            .await
            .map_err(|e| Error::internal(format!("folding the processor panicked: {e}")))?
    }
}

/// A key the refold has and storage does not.
fn refolded_only(key: &str, value: &[u8]) -> DifferingKey {
    DifferingKey {
        key: key.to_string(),
        stored: None,
        refolded: Some(value.to_vec()),
    }
}

/// What comparing a stored bucket with a refold's found.
struct Compared {
    compared: u64,
    differing: Option<DifferingKey>,
}

/// Compares every key of the stored `bucket` (0: none) with the refold's
/// (`refolded`, its writes over an empty bucket), in byte order: the number
/// of distinct keys compared, and the first that differs.
fn compare_keys(
    storage: &crate::storage::Storage,
    bucket: i64,
    refolded: i64,
) -> anyhow::Result<Compared> {
    let mut stored_keys = crate::processor::scratch::StoredKeys::new(storage, refolded);
    let mut theirs = stored_keys.by_ref().peekable();
    let mut compared = 0u64;
    let mut differing: Option<DifferingKey> = None;
    let note = |d: DifferingKey, differing: &mut Option<DifferingKey>| {
        if differing.as_ref().is_none_or(|old| d.key < old.key) {
            *differing = Some(d);
        }
    };
    if bucket != 0 {
        storage.each_key(bucket, |key, value| {
            // Refolded keys before this stored one are missing from storage.
            while let Some((k, v)) = theirs.next_if(|(k, _)| k.as_str() < key.as_str()) {
                compared += 1;
                note(refolded_only(&k, &v), &mut differing);
            }
            compared += 1;
            match theirs.next_if(|(k, _)| k.as_str() == key.as_str()) {
                Some((_, v)) if v == value => {}
                other => note(
                    DifferingKey {
                        key,
                        stored: Some(value),
                        refolded: other.map(|(_, v)| v),
                    },
                    &mut differing,
                ),
            }
            Ok(())
        })?;
    }
    for (k, v) in theirs {
        compared += 1;
        note(refolded_only(&k, &v), &mut differing);
    }
    stored_keys.finish()?;
    Ok(Compared {
        compared,
        differing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{Checkpoint, CheckpointId, KeyWrites, Storage, WriteOp};

    fn writes(pairs: &[(&str, Option<&str>)]) -> KeyWrites {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(|v| v.as_bytes().to_vec())))
            .collect()
    }

    /// Stream 1's processor `c` checkpointed at `offset` (after the one at
    /// `offset - 1`, if any) with `keys` written to bucket 5.
    fn checkpoint(offset: u64, keys: KeyWrites) -> WriteOp {
        WriteOp::Checkpoint(Checkpoint {
            row_id: 1,
            project: "p".into(),
            path: "/s".into(),
            component: "c".into(),
            stream_id: "s1".into(),
            previous_offset: (offset > 1).then(|| CheckpointId {
                stream_id: "s1".into(),
                offset: offset - 1,
                digest: "d".into(),
                bucket: 5,
            }),
            offset,
            state: "{}".into(),
            digest: "d".into(),
            effects: Vec::new(),
            bucket: 5,
            keys,
            drop_bucket: None,
            adopts_scratch: false,
            updated_at: "t".into(),
            now_ms: 0,
            fence: None,
        })
    }

    fn listed(keys: &[KeyValue]) -> Vec<(&str, &str)> {
        keys.iter()
            .map(|k| (k.key.as_str(), std::str::from_utf8(&k.value).unwrap()))
            .collect()
    }

    #[test]
    fn keys_at_an_offset_are_the_checkpoints_under_the_folds_writes() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(
            dir.path(),
            crate::storage::Durability::Full,
            crate::storage::Bounds::default(),
            std::sync::Arc::new(|_, _, _| {}),
        )
        .unwrap();
        let stored = writes(&[
            ("b/1", Some("1")),
            ("b/2", Some("2")),
            ("b/3", Some("3")),
            ("x", Some("9")),
        ]);
        storage.commit_blocking(checkpoint(1, stored)).unwrap();
        let (row, base) = storage.checkpoint_snapshot(1, "c").unwrap().unwrap();
        assert_eq!(row.checkpoint_offset, 1);
        // The fold after the checkpoint wrote b/2 again, deleted b/3 and
        // added b/0 and b/4; x and y are not under the prefix.
        let w = writes(&[
            ("b/0", Some("0")),
            ("b/2", Some("20")),
            ("b/3", None),
            ("b/4", Some("4")),
            ("y", Some("8")),
        ]);
        let (keys, more) = keys_over(&base, &w, "b/", 1 << 20).unwrap();
        assert_eq!(
            listed(&keys),
            [("b/0", "0"), ("b/1", "1"), ("b/2", "20"), ("b/4", "4")]
        );
        assert!(!more);
        // A wake that commits meanwhile does not change what the snapshot
        // reads.
        storage
            .commit_blocking(checkpoint(2, writes(&[("b/1", None)])))
            .unwrap();
        let (keys, _) = keys_over(&base, &writes(&[]), "b/", 1 << 20).unwrap();
        assert_eq!(listed(&keys), [("b/1", "1"), ("b/2", "2"), ("b/3", "3")]);
        // A page the byte bound cuts ends at its last stored key, and says
        // more exist.
        let (keys, more) = keys_over(&base, &w, "b/", 1).unwrap();
        assert_eq!(listed(&keys), [("b/0", "0"), ("b/1", "1")]);
        assert!(more);
    }
}
