//! The processors' effect outbox: listing a project's effects, reading one,
//! retrying and cancelling. `GET /v1/projects/{p}/effects[/{id}]` and
//! `POST .../effects/{id}:retry|:cancel` over HTTP.

use serde::Serialize;
use serde_json::Value;

use super::wait::Look;
use super::Host;
use crate::clock::format_timestamp;
use crate::error::Error;
use crate::storage::{EffectOp, EffectRow, WriteOp};

pub use crate::effect::Status as EffectStatus;

/// Most effects in one page.
pub const EFFECT_LIMIT_MAX: usize = 500;

/// Which effects of a project to list: a page in id order, filtered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectFilter {
    /// Only those of this source stream (a canonical path).
    pub stream: Option<String>,
    /// Only those of this component.
    pub component: Option<String>,
    /// Only those in this status.
    pub status: Option<EffectStatus>,
    /// Only those that will run by this time (ms since the epoch): pending
    /// ones due at or before it (`?due=before:T`).
    pub due_before_ms: Option<i64>,
    /// Only those with a larger id (the previous page's `next_after_id`).
    pub after_id: i64,
    /// At most this many (1 to [`EFFECT_LIMIT_MAX`]).
    pub limit: usize,
}

impl Default for EffectFilter {
    fn default() -> Self {
        EffectFilter {
            stream: None,
            component: None,
            status: None,
            due_before_ms: None,
            after_id: 0,
            limit: 100,
        }
    }
}

impl EffectFilter {
    /// The first 100 effects.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only those of source stream `path`.
    pub fn stream(mut self, path: impl Into<String>) -> Self {
        self.stream = Some(path.into());
        self
    }

    /// Only those of `component`.
    pub fn component(mut self, component: impl Into<String>) -> Self {
        self.component = Some(component.into());
        self
    }

    /// Only those in `status`.
    pub fn status(mut self, status: EffectStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Only those that will run by `ms` (ms since the epoch): pending ones
    /// due at or before it.
    pub fn due_before(mut self, ms: i64) -> Self {
        self.due_before_ms = Some(ms);
        self
    }

    /// Only those after effect `id`.
    pub fn after_id(mut self, id: i64) -> Self {
        self.after_id = id;
        self
    }

    /// At most `limit`.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

/// An effect of the outbox.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Effect {
    /// Its id in the project.
    pub id: i64,
    /// The processor's source stream.
    pub stream: String,
    /// The source stream's lifetime.
    pub stream_id: String,
    /// The processor's component, or `reactor:<name>` for a reactor's.
    pub component: String,
    /// Who produced it: the processor's component or the reactor's name.
    pub consumer: String,
    /// `processor` or `reactor`.
    pub consumer_kind: &'static str,
    /// Its envelope's type, if it has one.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub effect_type: Option<String>,
    /// Its envelope's metadata, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Its ordering group, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Not attempted before this time (RFC 3339), if it was delayed.
    pub not_before: Option<String>,
    /// The offsets of the source events folded by the call that asked it
    /// (one event for a reactor), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<EffectCause>,
    /// The trace context it carries on (its cause's), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace::Trace>,
    /// The effect's key (its identity with the instance).
    pub key: String,
    /// The checkpoint that committed it.
    pub checkpoint_offset: u64,
    /// What it does: `{"append": ...}`, `{"webhook": ...}` or `{"itx": ...}`.
    pub target: Value,
    /// Where it is in its life.
    pub status: EffectStatus,
    /// Attempts so far.
    pub attempts: u32,
    /// When a pending effect is next attempted (RFC 3339).
    pub next_attempt_at: Option<String>,
    /// The last attempt's failure.
    pub last_error: Option<String>,
    /// What a done effect answered.
    pub result: Option<Value>,
    /// When it was committed (RFC 3339).
    pub created_at: String,
    /// When it was done, failed or cancelled (RFC 3339).
    pub settled_at: Option<String>,
}

impl Effect {
    /// The effect of a stored row.
    fn from_row(e: EffectRow) -> Self {
        // The outbox stores only these names (`effect::Status`).
        let status = EffectStatus::parse(&e.status).unwrap_or(EffectStatus::Failed);
        let next_attempt_at =
            (status == EffectStatus::Pending).then(|| format_timestamp(e.due_at_ms));
        let (kind, consumer) = crate::effect::consumer(&e.component);
        let consumer = consumer.to_string();
        let effect_type = e
            .target
            .get("type")
            .and_then(Value::as_str)
            .map(str::to_string);
        let metadata = e.target.get("metadata").filter(|m| m.is_object()).cloned();
        let group = e
            .target
            .get("group")
            .and_then(Value::as_str)
            .map(str::to_string);
        let cause =
            crate::effect::stored_cause(&e.target).map(|(from_offset, to_offset)| EffectCause {
                from_offset,
                to_offset,
            });
        let trace = crate::effect::stored_trace(&e.target);
        let mut target = e.target;
        if let Value::Object(t) = &mut target {
            for envelope in ["type", "metadata", "group", "cause", "trace"] {
                t.remove(envelope);
            }
        }
        Effect {
            id: e.id,
            stream: e.path,
            stream_id: e.stream_id,
            component: e.component,
            consumer,
            consumer_kind: kind,
            effect_type,
            metadata,
            group,
            not_before: e.not_before_ms.map(format_timestamp),
            cause,
            trace,
            key: e.key,
            checkpoint_offset: e.checkpoint_offset,
            target,
            status,
            attempts: e.attempts,
            next_attempt_at,
            last_error: e.last_error,
            result: e.result,
            created_at: e.created_at,
            settled_at: e.settled_at,
        }
    }
}

/// The source events an effect came of: those folded by the call that
/// asked it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectCause {
    /// The first.
    pub from_offset: u64,
    /// The last.
    pub to_offset: u64,
}

/// A page of effects.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectsPage {
    /// The effects, by id.
    pub effects: Vec<Effect>,
    /// The last id when the page is full: the next page's
    /// [`EffectFilter::after_id`].
    pub next_after_id: Option<i64>,
}

impl Host {
    /// A page of `project`'s effects.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "effector", std::fs::read(guests.join("effector.wasm"))?)).await?;
    /// # let jobs = host.stream("acme", "/jobs")?;
    /// # host.subscribe(&jobs, &streamhost::Subscription::wake("effector", "effector").from_beginning()).await?;
    /// # let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    /// # host.append(&jobs, [streamhost::EventInput::new("events.example/effects-requested").payload(serde_json::json!({"effects": [
    /// #     {"key": "note", "append": {"streamPath": "/notes", "type": "noted", "payload": {}}},
    /// #     {"key": "hook", "webhook": {"url": format!("http://{closed}/"), "body": {}}},
    /// # ]}))]).await?;
    /// # let head = host.state(&jobs).await?.max_offset;
    /// # host.wait_for_processor(&jobs, "effector", head, std::time::Duration::from_secs(60)).await?; // its effects commit with its checkpoint
    /// use std::time::Duration;
    /// use streamhost::{EffectFilter, EffectStatus};
    ///
    /// let page = host.effects("acme", EffectFilter::new()).await?;
    /// let note = page.effects.iter().find(|e| e.key == "note").expect("the append effect");
    /// assert_eq!(note.component, "effector");
    /// let done = |e: &streamhost::Effect| e.status == EffectStatus::Succeeded;
    /// host.wait_for_effect("acme", note.id, done, Duration::from_secs(60)).await?;
    /// let succeeded = host.effects("acme", EffectFilter::new().status(EffectStatus::Succeeded)).await?;
    /// assert_eq!(succeeded.effects[0].key, "note");
    /// # Ok(()) }
    /// ```
    pub async fn effects(&self, project: &str, filter: EffectFilter) -> Result<EffectsPage, Error> {
        crate::stream::Namespace::project(project)?;
        if !(1..=EFFECT_LIMIT_MAX).contains(&filter.limit) {
            return Err(Error::invalid(format!(
                "limit {} is out of range: it must be 1 to {EFFECT_LIMIT_MAX}",
                filter.limit
            )));
        }
        let path = filter
            .stream
            .as_deref()
            .map(crate::stream::canonicalize_path)
            .transpose()?;
        let q = crate::storage::EffectQuery {
            project: project.to_string(),
            path,
            component: filter.component,
            status: filter.status.map(|s| s.as_str().to_string()),
            due_before_ms: filter.due_before_ms,
            after_id: filter.after_id,
            limit: filter.limit,
        };
        let limit = q.limit;
        let rows = self
            .read_storage("listing effects", move |s| s.list_effects(&q))
            .await?;
        let next_after_id = (rows.len() == limit).then(|| rows[rows.len() - 1].id);
        Ok(EffectsPage {
            effects: rows.into_iter().map(Effect::from_row).collect(),
            next_after_id,
        })
    }

    /// Effect `id` of `project`, or `effect-not-found`.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "effector", std::fs::read(guests.join("effector.wasm"))?)).await?;
    /// # let jobs = host.stream("acme", "/jobs")?;
    /// # host.subscribe(&jobs, &streamhost::Subscription::wake("effector", "effector").from_beginning()).await?;
    /// # let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    /// # host.append(&jobs, [streamhost::EventInput::new("events.example/effects-requested").payload(serde_json::json!({"effects": [
    /// #     {"key": "note", "append": {"streamPath": "/notes", "type": "noted", "payload": {}}},
    /// #     {"key": "hook", "webhook": {"url": format!("http://{closed}/"), "body": {}}},
    /// # ]}))]).await?;
    /// # let head = host.state(&jobs).await?.max_offset;
    /// # host.wait_for_processor(&jobs, "effector", head, std::time::Duration::from_secs(60)).await?; // its effects commit with its checkpoint
    /// use streamhost::EffectFilter;
    ///
    /// let page = host.effects("acme", EffectFilter::new().stream("/jobs")).await?;
    /// let first = host.effect("acme", page.effects[0].id).await?;
    /// assert_eq!(first.stream, "/jobs");
    /// assert_eq!(host.effect("acme", 9999).await.unwrap_err().code, "effect-not-found");
    /// # Ok(()) }
    /// ```
    pub async fn effect(&self, project: &str, id: i64) -> Result<Effect, Error> {
        let p = project.to_string();
        self.read_storage("reading the effect", move |s| s.effect(&p, id))
            .await?
            .map(Effect::from_row)
            .ok_or_else(|| {
                Error::not_found(
                    "effect-not-found",
                    format!("effect {id} does not exist in project {project:?}"),
                )
            })
    }

    /// Waits until effect `id` of `project` is as `until` asks (a status,
    /// an attempt made) and answers it then; `timeout` naming its status
    /// once `within` has passed. Looks again whenever an effect's execution
    /// ends on this host, and every quarter second (another host's
    /// executions, a cancel or a retry ring no bell here).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "effector", std::fs::read(guests.join("effector.wasm"))?)).await?;
    /// # let jobs = host.stream("acme", "/jobs")?;
    /// # host.subscribe(&jobs, &streamhost::Subscription::wake("effector", "effector").from_beginning()).await?;
    /// # host.append(&jobs, [streamhost::EventInput::new("events.example/effects-requested").payload(serde_json::json!({"effects": [
    /// #     {"key": "note", "append": {"streamPath": "/notes", "type": "noted", "payload": {}}},
    /// # ]}))]).await?;
    /// # let head = host.state(&jobs).await?.max_offset;
    /// # host.wait_for_processor(&jobs, "effector", head, std::time::Duration::from_secs(60)).await?;
    /// use std::time::Duration;
    /// use streamhost::{EffectFilter, EffectStatus};
    ///
    /// let page = host.effects("acme", EffectFilter::new()).await?;
    /// let note = &page.effects[0];
    /// let settled = |e: &streamhost::Effect| e.settled_at.is_some();
    /// let done = host.wait_for_effect("acme", note.id, settled, Duration::from_secs(60)).await?;
    /// assert_eq!(done.status, EffectStatus::Succeeded);
    /// let never = host.wait_for_effect("acme", note.id, |e| e.attempts > 5, Duration::from_millis(50)).await;
    /// assert_eq!(never.unwrap_err().code, "timeout");
    /// # Ok(()) }
    /// ```
    pub async fn wait_for_effect(
        &self,
        project: &str,
        id: i64,
        until: impl Fn(&Effect) -> bool,
        within: std::time::Duration,
    ) -> Result<Effect, Error> {
        super::wait::until(
            &self.streams.executors().effects_ended,
            within,
            async || {
                let effect = self.effect(project, id).await?;
                Ok(match until(&effect) {
                    true => Look::Done(effect),
                    false => Look::NotYet(effect),
                })
            },
            |effect| {
                format!(
                    "effect {id} of project {project:?} is {:?} after {} attempts, not as waited for, within {} ms",
                    effect.status,
                    effect.attempts,
                    within.as_millis()
                )
            },
        )
        .await
    }

    /// Attempts a failed or cancelled effect again (`effect-not-retryable`
    /// otherwise); answers it, pending.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "effector", std::fs::read(guests.join("effector.wasm"))?)).await?;
    /// # let jobs = host.stream("acme", "/jobs")?;
    /// # host.subscribe(&jobs, &streamhost::Subscription::wake("effector", "effector").from_beginning()).await?;
    /// # let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    /// # host.append(&jobs, [streamhost::EventInput::new("events.example/effects-requested").payload(serde_json::json!({"effects": [
    /// #     {"key": "note", "append": {"streamPath": "/notes", "type": "noted", "payload": {}}},
    /// #     {"key": "hook", "webhook": {"url": format!("http://{closed}/"), "body": {}}},
    /// # ]}))]).await?;
    /// # let head = host.state(&jobs).await?.max_offset;
    /// # host.wait_for_processor(&jobs, "effector", head, std::time::Duration::from_secs(60)).await?; // its effects commit with its checkpoint
    /// use streamhost::{EffectFilter, EffectStatus};
    ///
    /// let page = host.effects("acme", EffectFilter::new()).await?;
    /// let hook = page.effects.iter().find(|e| e.key == "hook").expect("the webhook effect");
    /// // The webhook's receiver is down: its first attempt fails, and it
    /// // waits for its next.
    /// let attempted = |e: &streamhost::Effect| e.attempts >= 1 && e.status != EffectStatus::Running;
    /// host.wait_for_effect("acme", hook.id, attempted, std::time::Duration::from_secs(60)).await?;
    /// host.cancel_effect("acme", hook.id).await?;
    /// // A cancelled (or dead) effect runs again, from a first attempt.
    /// let retried = host.retry_effect("acme", hook.id).await?;
    /// assert!(matches!(retried.status, EffectStatus::Pending | EffectStatus::Running));
    /// # Ok(()) }
    /// ```
    pub async fn retry_effect(&self, project: &str, id: i64) -> Result<Effect, Error> {
        let now_ms = self.streams.now_ms();
        let op = EffectOp::Retry { id, now_ms };
        let retried = self
            .change_effect(
                project,
                id,
                op,
                "effect-not-retryable",
                "only a failed or cancelled effect can be retried",
            )
            .await?;
        self.streams.executors().effects.ring();
        Ok(retried)
    }

    /// Cancels a pending or failed effect (`effect-not-cancellable`
    /// otherwise); answers it, cancelled.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().into(), ..Default::default() })?;
    /// # let guests = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/processors/target/wasm32-wasip2/release"));
    /// # host.deploy(streamhost::Deploy::new("acme", "effector", std::fs::read(guests.join("effector.wasm"))?)).await?;
    /// # let jobs = host.stream("acme", "/jobs")?;
    /// # host.subscribe(&jobs, &streamhost::Subscription::wake("effector", "effector").from_beginning()).await?;
    /// # let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    /// # host.append(&jobs, [streamhost::EventInput::new("events.example/effects-requested").payload(serde_json::json!({"effects": [
    /// #     {"key": "note", "append": {"streamPath": "/notes", "type": "noted", "payload": {}}},
    /// #     {"key": "hook", "webhook": {"url": format!("http://{closed}/"), "body": {}}},
    /// # ]}))]).await?;
    /// # let head = host.state(&jobs).await?.max_offset;
    /// # host.wait_for_processor(&jobs, "effector", head, std::time::Duration::from_secs(60)).await?; // its effects commit with its checkpoint
    /// use streamhost::{EffectFilter, EffectStatus};
    ///
    /// let page = host.effects("acme", EffectFilter::new()).await?;
    /// let hook = page.effects.iter().find(|e| e.key == "hook").expect("the webhook effect");
    /// // The webhook's receiver is down: cancel it once its first attempt is over.
    /// let attempted = |e: &streamhost::Effect| e.attempts >= 1 && e.status != EffectStatus::Running;
    /// host.wait_for_effect("acme", hook.id, attempted, std::time::Duration::from_secs(60)).await?;
    /// let cancelled = host.cancel_effect("acme", hook.id).await?;
    /// assert_eq!(cancelled.status, EffectStatus::Cancelled);
    /// # Ok(()) }
    /// ```
    pub async fn cancel_effect(&self, project: &str, id: i64) -> Result<Effect, Error> {
        let settled_at = format_timestamp(self.streams.now_ms());
        let op = EffectOp::Cancel { id, settled_at };
        self.change_effect(
            project,
            id,
            op,
            "effect-not-cancellable",
            "only a pending or failed effect can be cancelled",
        )
        .await
    }

    async fn change_effect(
        &self,
        project: &str,
        id: i64,
        op: EffectOp,
        code: &'static str,
        allowed: &str,
    ) -> Result<Effect, Error> {
        self.effect(project, id).await?;
        let changed = self
            .streams
            .storage()
            .submit(WriteOp::Effect(op))
            .await
            .map_err(|_| Error::internal("the storage writer stopped"))?
            .map_err(|e| Error::internal(format!("updating effect {id} failed: {e}")))?;
        let after = self.effect(project, id).await?;
        if changed == 0 {
            return Err(Error::conflict(
                code,
                format!("effect {id} is {}: {allowed}", after.status.as_str()),
            ));
        }
        Ok(after)
    }
}
