//! The group-commit writer: one thread owns the write connection, takes every
//! queued write (from any stream), commits them in one transaction and only
//! then answers each of them. Each write runs in its own savepoint, so one
//! failing write does not take the others down.

use std::fmt;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use anyhow::{Context, Result};
use tokio::sync::oneshot;

use super::effects::{EffectOp, EffectSource, NewEffect};
use super::faults::{Fault, Faults};
use super::sql::{args, Db, Dialect, PgConn};
use crate::metrics::Metrics;

/// Most writes coalesced into one transaction.
pub const GROUP_WRITES_MAX: usize = 4096;

/// A stream that a commit writes to.
#[derive(Debug, Clone)]
pub enum StreamRef {
    /// An existing stream row; `expected_head` is its head before this commit
    /// (checked, so a lost commit can never leave a gap in the offsets).
    Existing { row_id: i64, expected_head: u64 },
    /// A stream this commit creates.
    New(NewStream),
}

/// Identity of a stream being created.
#[derive(Debug, Clone)]
pub struct NewStream {
    pub project: String,
    pub path: String,
    pub stream_id: String,
    pub created_at: String,
}

/// One committed event as stored.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub offset: u64,
    pub event_type: String,
    pub idempotency_key: Option<String>,
    pub body: String,
}

/// One subscription cursor row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorRow {
    pub subscription_key: String,
    pub generation: u64,
    pub acknowledged_offset: u64,
    /// Skip policy counters, kept across restarts.
    pub failing_offset: Option<u64>,
    pub failing_attempts: u32,
    pub skips: u32,
}

/// One actor round: events appended to one stream plus its new head and
/// state, and the cursor rows repaired from that state.
#[derive(Debug, Clone)]
pub struct StreamCommit {
    pub stream: StreamRef,
    pub events: Vec<StoredEvent>,
    pub head_offset: u64,
    pub state_json: String,
    pub state_offset: u64,
    pub cursors: Vec<CursorRow>,
    pub removed_cursors: Vec<String>,
    /// The owner's lease, checked in the transaction (several hosts).
    pub fence: Option<super::Fence>,
}

/// A write for the group-commit writer.
#[derive(Debug, Clone)]
pub enum WriteOp {
    Commit(StreamCommit),
    /// Wipe a stream: its events, cursors and row.
    Reset {
        row_id: i64,
        fence: Option<super::Fence>,
    },
    /// Move delivery cursors forward.
    Cursors {
        row_id: i64,
        cursors: Vec<CursorRow>,
        fence: Option<super::Fence>,
    },
    /// Deploy (or replace) a component; answers 1 for a new version, 0
    /// when the bytes are those already deployed.
    Deploy(Deployment),
    /// A processor's new checkpoint, state and effects.
    Checkpoint(Checkpoint),
    /// The last failure of a processor instance, in full.
    ProcessorFailure(ProcessorFailure),
    /// Outbox bookkeeping: backfill, lease, settle, retry, cancel.
    Effect(EffectOp),
    /// Ingest: accepted events, their departure, fences, diagnostics.
    Ingest(super::IngestOp),
    /// The subscriptions halted by component `name` were resumed for version
    /// `digest`.
    ResumesDone {
        project: String,
        name: String,
        digest: String,
    },
    /// Every instance was refolded with `digest`: the pending refold is done.
    RefoldDone {
        project: String,
        name: String,
        digest: String,
    },
}

/// A processor instance's failure, kept whole (the halt fact carries a
/// capped message).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessorFailure {
    pub row_id: i64,
    pub component: String,
    pub stream_id: String,
    pub failed_at: String,
    pub offset: Option<u64>,
    pub message: String,
    pub repro: Option<String>,
}

/// A component deployment.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub project: String,
    pub name: String,
    pub digest: String,
    pub exports: Vec<String>,
    pub bytes: Vec<u8>,
    pub deployed_at: String,
    /// Record, in the same transaction, that every instance must be
    /// refolded with this version (done even across a restart).
    pub refold: bool,
}

/// A processor checkpoint to commit: the state after folding through
/// `offset`, the effects of that batch, and the digest that made them.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub row_id: i64,
    /// The processor's namespace ('' for global) and source path: with the
    /// component and key, the identity of each effect.
    pub project: String,
    pub path: String,
    pub component: String,
    pub stream_id: String,
    /// The checkpoint this batch started from (`None`: a fresh instance);
    /// checked so two writers can never interleave.
    pub previous_offset: Option<(String, u64)>,
    pub offset: u64,
    pub state: String,
    pub digest: String,
    pub effects: Vec<NewEffect>,
    pub updated_at: String,
    pub now_ms: i64,
}

/// Why a write did not commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitError(pub String);

impl fmt::Display for CommitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

struct Job {
    op: WriteOp,
    reply: oneshot::Sender<Result<i64, CommitError>>,
}

pub(super) struct WriterHandle {
    tx: mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

/// The one write connection, of either engine.
pub(super) enum WriteConn {
    Sqlite(rusqlite::Connection),
    /// The connection and its URL, to connect again after losing it.
    Postgres(Box<PgConn>, super::sql::PgTarget),
}

impl WriteConn {
    fn db(&self) -> Db<'_> {
        match self {
            WriteConn::Sqlite(c) => Db::Sqlite(c),
            WriteConn::Postgres(c, _) => Db::Postgres(c),
        }
    }

    /// The connection to commit on: a PostgreSQL connection the server
    /// closed is replaced (a commit on it could only fail).
    fn ready(&mut self) -> Db<'_> {
        if let WriteConn::Postgres(c, target) = self {
            if c.is_closed() {
                match PgConn::connect(target) {
                    Ok(new) => **c = new,
                    Err(e) => tracing::error!(error = %format!("{e:#}"), "reconnecting the writer"),
                }
            }
        }
        self.db()
    }
}

/// What the writer thread and a direct committer share: the one write
/// connection (whoever holds the lock commits), the metrics, the cache.
struct Shared {
    conn: std::sync::Mutex<WriteConn>,
    metrics: Metrics,
    hot: Arc<super::hot::Hot>,
    faults: Faults,
}

impl WriterHandle {
    pub(super) fn start(
        conn: WriteConn,
        metrics: Metrics,
        hot: Arc<super::hot::Hot>,
    ) -> Result<WriterHandle> {
        let (tx, rx) = mpsc::channel::<Job>();
        let faults = Faults::from_env()?;
        if faults.active() {
            tracing::warn!(faults = ?faults, "storage faults are injected on purpose ({})", super::faults::ENV);
        }
        let shared = Arc::new(Shared {
            conn: std::sync::Mutex::new(conn),
            metrics,
            hot,
            faults,
        });
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("streamhost-writer".into())
            .spawn(move || run(&writer, rx))
            .context("starting the writer thread")?;
        Ok(WriterHandle { tx, shared })
    }

    pub(super) fn submit(&self, op: WriteOp) -> oneshot::Receiver<Result<i64, CommitError>> {
        let (reply, rx) = oneshot::channel();
        if let Err(mpsc::SendError(job)) = self.tx.send(Job { op, reply }) {
            let _ = job
                .reply
                .send(Err(CommitError("the storage writer has stopped".into())));
        }
        rx
    }

    /// Commits `op` on this (blocking) thread when the writer is idle, or
    /// through the writer's next group when it is busy, and answers after
    /// the commit. An idle writer would commit `op` alone anyway; doing it
    /// here saves waking the writer thread and being woken by it.
    pub(super) fn commit_blocking(&self, op: WriteOp) -> Result<i64, CommitError> {
        match self.shared.conn.try_lock() {
            Ok(mut conn) => {
                let mut ops = [op];
                commit(&self.shared, conn.ready(), &mut ops)
                    .pop()
                    .expect("one result per write")
            }
            Err(_) => self
                .submit(op)
                .blocking_recv()
                .unwrap_or_else(|_| Err(CommitError("the storage writer has stopped".into()))),
        }
    }
}

fn run(shared: &Shared, rx: mpsc::Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < GROUP_WRITES_MAX {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let (mut ops, replies): (Vec<WriteOp>, Vec<_>) =
            jobs.into_iter().map(|j| (j.op, j.reply)).unzip();
        let results = {
            let mut conn = shared.conn.lock().unwrap_or_else(|p| p.into_inner());
            commit(shared, conn.ready(), &mut ops)
        };
        for (reply, result) in replies.into_iter().zip(results) {
            let _ = reply.send(result);
        }
    }
}

/// Commits `ops` in one transaction (the caller holds the connection),
/// records it, and lets the cache learn what committed before anyone is
/// answered.
fn commit(shared: &Shared, conn: Db<'_>, ops: &mut [WriteOp]) -> Vec<Result<i64, CommitError>> {
    let events = |op: &WriteOp| match op {
        WriteOp::Commit(c) => c.events.len(),
        _ => 0,
    };
    let span = tracing::debug_span!(
        "commit",
        writes = ops.len(),
        events = ops.iter().map(events).sum::<usize>()
    )
    .entered();
    let started = Instant::now();
    let results = commit_group(conn, ops, &shared.faults);
    let elapsed = started.elapsed();
    let committed: usize = ops
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|(op, _)| events(op))
        .sum();
    shared.metrics.observe_commit(elapsed, ops.len(), committed);
    tracing::debug!(elapsed_us = elapsed.as_micros() as u64, "group committed");
    drop(span);
    if results.iter().any(Result::is_err) {
        // A failed COMMIT may still have reached the disk (an fsync error
        // leaves the outcome unknown): nothing cached is trusted any more.
        shared.hot.clear();
    }
    shared.hot.committed(
        ops.iter_mut()
            .zip(&results)
            .filter_map(|(op, r)| r.as_ref().ok().map(|row_id| (op, *row_id))),
    );
    results
}

/// Runs one of the fixed transaction-control statements (prepared once per
/// connection, not parsed per commit).
fn control(conn: Db<'_>, sql: &str) -> Result<()> {
    conn.control(sql)
}

fn commit_group(conn: Db<'_>, ops: &[WriteOp], faults: &Faults) -> Vec<Result<i64, CommitError>> {
    let fail_all = |e: &dyn fmt::Display| -> Vec<Result<i64, CommitError>> {
        ops.iter()
            .map(|_| Err(CommitError(format!("transaction failed: {e}"))))
            .collect()
    };
    // COMMIT, or the fault injected in its place (see `faults`).
    let finish = || -> Result<(), String> {
        match faults.next() {
            Fault::None => control(conn, "COMMIT").map_err(|e| e.to_string()),
            Fault::BeforeCommit => {
                let _ = control(conn, "ROLLBACK");
                Err("disk I/O error (injected before commit)".into())
            }
            Fault::AfterCommit => {
                control(conn, "COMMIT").map_err(|e| e.to_string())?;
                Err("disk I/O error (injected after commit: the outcome is unknown)".into())
            }
        }
    };
    let begin = match conn.dialect() {
        Dialect::Sqlite => "BEGIN IMMEDIATE",
        Dialect::Postgres => "BEGIN",
    };
    if let Err(e) = control(conn, begin) {
        return fail_all(&e);
    }
    // A write alone in its transaction needs no savepoint: rolling the
    // transaction back undoes it the same.
    if let [op] = ops {
        return match apply(conn, op) {
            Ok(row_id) => match finish() {
                Ok(()) => vec![Ok(row_id)],
                Err(e) => {
                    tracing::error!(error = %e, "group commit failed");
                    let _ = control(conn, "ROLLBACK");
                    fail_all(&e)
                }
            },
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "write rolled back");
                let _ = control(conn, "ROLLBACK");
                vec![Err(CommitError(format!("{e:#}")))]
            }
        };
    }
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        if let Err(e) = control(conn, "SAVEPOINT op") {
            let _ = control(conn, "ROLLBACK");
            return fail_all(&e);
        }
        match apply(conn, op) {
            Ok(row_id) => {
                let _ = control(conn, "RELEASE op");
                results.push(Ok(row_id));
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "write rolled back");
                let _ = control(conn, "ROLLBACK TO op");
                let _ = control(conn, "RELEASE op");
                results.push(Err(CommitError(format!("{e:#}"))));
            }
        }
    }
    if let Err(e) = finish() {
        tracing::error!(error = %e, "group commit failed");
        let _ = control(conn, "ROLLBACK");
        return fail_all(&e);
    }
    results
}

fn apply(conn: Db<'_>, op: &WriteOp) -> Result<i64> {
    match op {
        WriteOp::Commit(c) => {
            if let Some(fence) = &c.fence {
                super::lease::check(conn, fence)?;
            }
            let row_id = match &c.stream {
                StreamRef::New(n) => conn
                    .query_one(
                        "INSERT INTO streams (project, path, stream_id, created_at, head_offset, state_json, state_offset)
                         VALUES (?1, ?2, ?3, ?4, 0, '', 0) RETURNING id",
                        args![&n.project, &n.path, &n.stream_id, &n.created_at],
                        |r| r.int(0),
                    )
                    .with_context(|| format!("creating stream {:?} in {:?}", n.path, n.project))?,
                StreamRef::Existing {
                    row_id,
                    expected_head,
                } => {
                    let head = conn
                        .query_one(
                            "SELECT head_offset FROM streams WHERE id = ?1",
                            args![row_id],
                            |r| r.int(0),
                        )
                        .with_context(|| format!("stream row {row_id} is missing"))?;
                    anyhow::ensure!(
                        head as u64 == *expected_head,
                        "stream row {row_id} has head offset {head}, expected {expected_head}"
                    );
                    *row_id
                }
            };
            for e in &c.events {
                conn.execute(
                    "INSERT INTO events (stream, \"offset\", type, idempotency_key, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                    args![
                        row_id,
                        e.offset as i64,
                        &e.event_type,
                        &e.idempotency_key,
                        &e.body
                    ],
                )
                .with_context(|| format!("inserting the event at offset {}", e.offset))?;
            }
            conn.execute(
                "UPDATE streams SET head_offset = ?2, state_json = ?3, state_offset = ?4 WHERE id = ?1",
                args![
                    row_id,
                    c.head_offset as i64,
                    &c.state_json,
                    c.state_offset as i64
                ],
            )?;
            upsert_cursors(conn, row_id, &c.cursors)?;
            for key in &c.removed_cursors {
                conn.execute(
                    "DELETE FROM subscription_cursors WHERE stream = ?1 AND subscription_key = ?2",
                    args![row_id, key],
                )?;
            }
            Ok(row_id)
        }
        WriteOp::Cursors {
            row_id,
            cursors,
            fence,
        } => {
            if let Some(fence) = fence {
                super::lease::check(conn, fence)?;
            }
            upsert_cursors(conn, *row_id, cursors)?;
            Ok(*row_id)
        }
        WriteOp::Deploy(d) => {
            conn.execute(
                "INSERT INTO component_blobs (digest, bytes) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                args![&d.digest, &d.bytes],
            )?;
            let current = conn.query_opt(
                "SELECT digest FROM components WHERE project = ?1 AND name = ?2",
                args![&d.project, &d.name],
                |r| r.text(0),
            )?;
            if current.as_deref() == Some(d.digest.as_str()) {
                // The same bytes again: not a new version.
                return Ok(0);
            }
            let exports = serde_json::to_string(&d.exports)?;
            conn.execute(
                "INSERT INTO components (project, name, digest, exports, deployed_at) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (project, name) DO UPDATE SET digest = excluded.digest,
                     exports = excluded.exports, deployed_at = excluded.deployed_at",
                args![&d.project, &d.name, &d.digest, &exports, &d.deployed_at],
            )?;
            conn.execute(
                "INSERT INTO component_versions (project, name, digest, deployed_at) VALUES (?1, ?2, ?3, ?4)",
                args![&d.project, &d.name, &d.digest, &d.deployed_at],
            )?;
            conn.execute(
                "INSERT INTO pending_resumes (project, name, digest) VALUES (?1, ?2, ?3)
                 ON CONFLICT (project, name) DO UPDATE SET digest = excluded.digest",
                args![&d.project, &d.name, &d.digest],
            )?;
            if d.refold {
                conn.execute(
                    "INSERT INTO pending_refolds (project, name, digest, requested_at) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (project, name) DO UPDATE SET digest = excluded.digest,
                         requested_at = excluded.requested_at",
                    args![&d.project, &d.name, &d.digest, &d.deployed_at],
                )?;
            } else {
                // A version deployed without a refold supersedes one pending.
                conn.execute(
                    "DELETE FROM pending_refolds WHERE project = ?1 AND name = ?2",
                    args![&d.project, &d.name],
                )?;
            }
            Ok(1)
        }
        WriteOp::Checkpoint(c) => {
            let current = conn
                .query_opt(
                    "SELECT stream_id, checkpoint_offset FROM processor_checkpoints WHERE stream = ?1 AND component = ?2",
                    args![c.row_id, &c.component],
                    |r| Ok((r.text(0)?, r.int(1)? as u64)),
                )?;
            anyhow::ensure!(
                current == c.previous_offset,
                "the checkpoint of processor {:?} moved (expected {:?}, found {:?})",
                c.component,
                c.previous_offset,
                current
            );
            conn.execute(
                "INSERT INTO processor_checkpoints (stream, component, stream_id, checkpoint_offset, state, digest, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (stream, component) DO UPDATE SET stream_id = excluded.stream_id,
                     checkpoint_offset = excluded.checkpoint_offset, state = excluded.state,
                     digest = excluded.digest, updated_at = excluded.updated_at",
                args![
                    c.row_id,
                    &c.component,
                    &c.stream_id,
                    c.offset as i64,
                    &c.state,
                    &c.digest,
                    &c.updated_at
                ],
            )?;
            if !c.effects.is_empty() {
                let source = EffectSource {
                    project: c.project.clone(),
                    path: c.path.clone(),
                    stream_id: c.stream_id.clone(),
                    component: c.component.clone(),
                };
                super::effects::insert(conn, &source, &c.effects, c.now_ms, &c.updated_at)?;
            }
            Ok(c.row_id)
        }
        WriteOp::ProcessorFailure(f) => {
            conn.execute(
                "INSERT INTO processor_failures (stream, component, stream_id, failed_at, \"offset\", message, repro)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (stream, component) DO UPDATE SET stream_id = excluded.stream_id,
                     failed_at = excluded.failed_at, \"offset\" = excluded.\"offset\",
                     message = excluded.message, repro = excluded.repro",
                args![
                    f.row_id,
                    &f.component,
                    &f.stream_id,
                    &f.failed_at,
                    f.offset.map(|o| o as i64),
                    &f.message,
                    &f.repro
                ],
            )?;
            Ok(f.row_id)
        }
        WriteOp::Effect(op) => super::effects::apply(conn, op),
        WriteOp::Ingest(op) => super::ingest::apply(conn, op),
        WriteOp::ResumesDone {
            project,
            name,
            digest,
        } => Ok(conn.execute(
            "DELETE FROM pending_resumes WHERE project = ?1 AND name = ?2 AND digest = ?3",
            args![project, name, digest],
        )? as i64),
        WriteOp::RefoldDone {
            project,
            name,
            digest,
        } => Ok(conn.execute(
            "DELETE FROM pending_refolds WHERE project = ?1 AND name = ?2 AND digest = ?3",
            args![project, name, digest],
        )? as i64),
        WriteOp::Reset { row_id, fence } => {
            if let Some(fence) = fence {
                super::lease::check(conn, fence)?;
            }
            for sql in [
                "DELETE FROM events WHERE stream = ?1",
                "DELETE FROM subscription_cursors WHERE stream = ?1",
                "DELETE FROM processor_checkpoints WHERE stream = ?1",
                "DELETE FROM processor_failures WHERE stream = ?1",
                "DELETE FROM streams WHERE id = ?1",
            ] {
                conn.execute(sql, args![row_id])?;
            }
            Ok(*row_id)
        }
    }
}

fn upsert_cursors(conn: Db<'_>, row_id: i64, cursors: &[CursorRow]) -> Result<()> {
    for c in cursors {
        conn.execute(
            "INSERT INTO subscription_cursors (stream, subscription_key, generation, acknowledged_offset,
                                               failing_offset, failing_attempts, skips)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (stream, subscription_key)
             DO UPDATE SET generation = excluded.generation, acknowledged_offset = excluded.acknowledged_offset,
                 failing_offset = excluded.failing_offset, failing_attempts = excluded.failing_attempts,
                 skips = excluded.skips",
            args![
                row_id,
                &c.subscription_key,
                c.generation as i64,
                c.acknowledged_offset as i64,
                c.failing_offset.map(|o| o as i64),
                c.failing_attempts,
                c.skips
            ],
        )
        .with_context(|| {
            format!(
                "writing the cursor of subscription {:?}",
                c.subscription_key
            )
        })?;
    }
    Ok(())
}
