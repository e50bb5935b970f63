//! The group-commit writer: one thread owns the write connection, takes every
//! queued write (from any stream), commits them in one transaction and only
//! then answers each of them. Each write runs in its own savepoint, so one
//! failing write does not take the others down. A large append never holds
//! up the others' commits: on SQLite its bodies are written in parts
//! between the groups (`parts.rs`), on PostgreSQL it commits on a lane of
//! its own, a second thread and connection ([`run_large_lane`]).

use std::fmt;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use anyhow::{Context, Result};
use tokio::sync::oneshot;

use super::effects::{EffectOp, EffectSource, NewEffect};
use super::faults::{Fault, Faults};
use super::sql::{args, Db, Dialect, PgConn};

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
    /// The event as the API serves it (JSON text), shared: the commit, the
    /// hot tail and the append's answer hold the same text.
    pub body: Arc<String>,
}

impl StoredEvent {
    /// The bytes it takes as stored, as `streams.bytes` counts them: its
    /// type, idempotency key and body.
    pub fn stored_bytes(&self) -> u64 {
        (self.event_type.len()
            + self.idempotency_key.as_deref().map_or(0, str::len)
            + self.body.len()) as u64
    }
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
    /// Consecutive failed attempts of the run and the last one's error
    /// (capped): `:runtime` shows them after a restart.
    pub attempts: u32,
    pub last_error: Option<String>,
    /// What the run measured (next attempt, bytes, latencies), JSON; it
    /// rides on the writes the cursor and counters cause.
    pub measurements: Option<String>,
}

impl CursorRow {
    /// Whether `other` records the same counters (cursor aside).
    pub fn same_counters(&self, other: &CursorRow) -> bool {
        (
            self.failing_offset,
            self.failing_attempts,
            self.skips,
            self.attempts,
        ) == (
            other.failing_offset,
            other.failing_attempts,
            other.skips,
            other.attempts,
        ) && self.last_error == other.last_error
    }
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
    /// The effects of the round's events (reactors'): inserted in the
    /// same transaction as the events, or not at all.
    pub effects: Vec<super::effects::EffectInsert>,
    /// The append effects whose events the round stores: settled in the
    /// same transaction as the events (one commit, not two after another).
    pub settled: Option<super::effects::AppendSettled>,
    /// Committed events the round redacts (`event-redacted`), their new
    /// bodies replacing the stored ones in the same transaction as the
    /// round's audit line (the stream's bytes follow).
    pub redactions: Vec<StoredEvent>,
    /// Retention's removal (`events-removed`): the stored events through
    /// this offset are deleted in the same transaction as the round's
    /// audit line (the stream's bytes follow).
    pub removed_through: Option<u64>,
    /// Events whose bodies the writer wrote in parts before this commit
    /// (SQLite, bodies over `parts::LARGE_BODY_BYTES`): (index in
    /// `events`, body id). Set by the writer; empty when submitted.
    pub staged: Vec<(usize, i64)>,
}

impl StreamCommit {
    /// Asserts the log's invariants on what this round writes, for both
    /// engines (a failure is a bug in the actor, never bad input): its
    /// events follow the stream's head in increasing offsets (ephemeral
    /// events take offsets without rows, so the stored ones may skip), a
    /// new stream starts at offset 1, and the head covers them all.
    pub fn assert_invariants(&self) {
        let head = match &self.stream {
            StreamRef::New(_) => {
                if let Some(first) = self.events.first() {
                    assert_eq!(
                        first.offset, 1,
                        "invariant dense-offsets: a new stream's first stored event is offset 1"
                    );
                }
                0
            }
            StreamRef::Existing { expected_head, .. } => *expected_head,
        };
        let mut previous = head;
        for e in &self.events {
            assert!(
                e.offset > previous,
                "invariant dense-offsets: the round's event at offset {} does not follow \
                 offset {previous} (the stream's head was {head})",
                e.offset
            );
            previous = e.offset;
        }
        assert!(
            self.head_offset >= previous,
            "invariant dense-offsets: head offset {} is below the round's last event {previous}",
            self.head_offset
        );
    }
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
    /// A project's webhook signing secrets change; answers 1 when they did.
    WebhookSecret {
        project: String,
        change: SecretChange,
    },
    /// Keeps a processor instance's base (retention): its checkpoint's
    /// state and keys, copied in the transaction into a bucket of the
    /// base's own, replacing an older base. Answers the base's offset, or
    /// -1 when the instance has no checkpoint of `stream_id`.
    KeepBase {
        row_id: i64,
        component: String,
        stream_id: String,
        /// The stream's removal digest the base is kept for.
        chain: String,
    },
    /// A shadow's or a refold's keyed state in storage (see
    /// [`super::ScratchOp`]).
    Scratch(super::ScratchOp),
}

/// A change of a project's webhook signing secrets.
#[derive(Clone)]
pub enum SecretChange {
    /// `secret` signs from now on; the one that did (if any) becomes the
    /// previous, which signs too until retired (a secret before it is
    /// dropped).
    Rotate { secret: String, at: String },
    /// The previous secret no longer signs.
    RetirePrevious,
}

impl fmt::Debug for SecretChange {
    /// Never the secret itself (logs and errors print write ops).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretChange::Rotate { at, .. } => write!(f, "Rotate {{ at: {at:?} }}"),
            SecretChange::RetirePrevious => f.write_str("RetirePrevious"),
        }
    }
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
    /// How the instances of the version it replaces are treated: a
    /// refold or a shadow is recorded in the same transaction (done even
    /// across a restart); a shadow's bytes are stored while the current
    /// version stays current.
    pub mode: streamhost_core::component::DeployMode,
    /// How many versions of the component are kept, the newest
    /// ([`super::Bounds::versions_kept`]).
    pub versions_kept: usize,
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
    /// The checkpoint this batch started from (`None`: a fresh instance),
    /// its version included; the write replaces exactly that row, so two
    /// writers (a wake and a refold's switch, or two hosts) never
    /// interleave.
    pub previous_offset: Option<super::CheckpointId>,
    pub offset: u64,
    pub state: String,
    pub digest: String,
    pub effects: Vec<NewEffect>,
    /// The bucket of its keyed state, and the fold's writes to it.
    pub bucket: i64,
    pub keys: super::keys::Writes,
    /// The bucket this checkpoint's replaces, whose rows go (a new source
    /// lifetime starts from an empty bucket; a refold switches to its own).
    pub drop_bucket: Option<i64>,
    /// `bucket` is a fold's scratch bucket, adopted by this checkpoint (a
    /// promotion, a refold's switch): refused if it was dropped.
    pub adopts_scratch: bool,
    pub updated_at: String,
    pub now_ms: i64,
    /// The source's owner's lease (several hosts), checked in the
    /// transaction: a deposed owner's wake commits nothing.
    pub fence: Option<super::Fence>,
}

/// Why a write did not commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitError {
    message: String,
    /// Why the storage refused the write, when its caller acts on it.
    refusal: Option<Refusal>,
    duplicate_key: bool,
    /// The disk (or the process's file size limit) is full.
    full: bool,
    /// Known not to have committed (its own statements failed and were
    /// rolled back), as opposed to an outcome the writer cannot know.
    rolled_back: bool,
}

impl CommitError {
    pub fn new(message: impl Into<String>) -> CommitError {
        CommitError {
            message: message.into(),
            refusal: None,
            duplicate_key: false,
            full: false,
            rolled_back: false,
        }
    }

    /// A write the log's idempotency index refused (the actors'
    /// simulation's storage).
    #[doc(hidden)]
    pub fn duplicate(message: impl Into<String>) -> CommitError {
        CommitError {
            message: message.into(),
            refusal: None,
            duplicate_key: true,
            full: false,
            rolled_back: true,
        }
    }

    /// The write's own failure (rolled back alone, nothing of it
    /// committed).
    fn of_write(e: &anyhow::Error) -> CommitError {
        CommitError {
            message: format!("{e:#}"),
            refusal: e
                .chain()
                .find_map(|c| c.downcast_ref::<Refused>())
                .map(|r| r.refusal.clone()),
            duplicate_key: e.downcast_ref::<DuplicateKey>().is_some(),
            full: false,
            rolled_back: true,
        }
    }

    /// The write failed because the disk is full (`why` says what is).
    fn of_full_disk(mut self, why: &str) -> CommitError {
        self.message = format!("{} (the disk is full: {why})", self.message);
        self.full = true;
        self
    }

    /// The disk (or the process's file size limit) is full: nothing more
    /// commits until room is made.
    pub fn full(&self) -> bool {
        self.full
    }

    /// What went wrong, in words.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Why the storage refused the write, when it is a refusal its caller
    /// acts on (nothing of it committed).
    pub fn refusal(&self) -> Option<&Refusal> {
        self.refusal.as_ref()
    }

    /// The write was refused, whole, because an event's idempotency key is
    /// already in the stream's log: nothing of it committed, and planning
    /// it again with its keys read from the log answers it.
    pub fn duplicate_key(&self) -> bool {
        self.duplicate_key
    }
}

impl fmt::Display for CommitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Why the storage refused a write, for its caller to act on: the write
/// committed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A checkpoint switch (a refold's, a shadow's promotion) whose live
    /// checkpoint moved first: a wake committed; fold the rest and retry.
    CheckpointMoved,
    /// An ingest acceptance one of whose idempotency keys is already in
    /// the stream.
    KeyInStream,
    /// An ingest acceptance whose idempotency key `.0` is pending with
    /// other content.
    KeyConflict(String),
    /// Ingest capacity: `.0` names the bound and how full it is.
    CapacityExhausted(String),
}

/// A [`Refusal`] and its words: the error a write's statements return.
#[derive(Debug)]
pub struct Refused {
    pub refusal: Refusal,
    pub message: String,
}

impl Refused {
    /// The error of a write refused for `refusal`, in words.
    pub fn error(refusal: Refusal, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Refused {
            refusal,
            message: message.into(),
        })
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refused {}

/// An event's idempotency key is already in its stream's log (the unique
/// index `events_by_key` refused the insert).
#[derive(Debug)]
pub struct DuplicateKey {
    /// The refused event's offset, where the engine tells.
    pub offset: Option<u64>,
}

impl fmt::Display for DuplicateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(offset) => write!(
                f,
                "the idempotency key of the event at offset {offset} is already in the stream's log"
            ),
            None => f.write_str("an event's idempotency key is already in the stream's log"),
        }
    }
}

impl std::error::Error for DuplicateKey {}

struct Job {
    op: WriteOp,
    reply: oneshot::Sender<Result<i64, CommitError>>,
    /// Its large bodies being written in parts (SQLite), until they all are.
    staging: Option<Staging>,
}

/// A commit's large bodies, written a part at a time before it commits.
struct Staging {
    /// (index in the commit's events, body id, bytes written, parts written).
    bodies: Vec<(usize, i64, usize, i64)>,
}

impl Staging {
    /// The bodies of `op` to write in parts, if any (none were yet: a
    /// write submitted again is staged again).
    fn of(op: &mut WriteOp) -> Option<Staging> {
        let WriteOp::Commit(c) = op else {
            return None;
        };
        c.staged.clear();
        let bodies: Vec<(usize, i64, usize, i64)> = c
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.body.len() > super::parts::LARGE_BODY_BYTES)
            .map(|(i, _)| (i, super::keys::new_bucket_id(), 0, 0))
            .collect();
        (!bodies.is_empty()).then_some(Staging { bodies })
    }

    /// Whether every body is written.
    fn done(&self) -> bool {
        self.bodies.is_empty()
    }
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
/// connection (whoever holds the lock commits), the commit observer, the
/// cache.
struct Shared {
    conn: std::sync::Mutex<WriteConn>,
    observe: crate::CommitObserver,
    hot: Arc<super::hot::Hot>,
    faults: Faults,
    /// Why the host cannot write now: the writer thread stopped, or the
    /// last transaction failed as a whole (cleared by the next commit).
    unable: std::sync::Mutex<Option<String>>,
    /// Whether `unable` holds a reason (read on every commit without the
    /// lock).
    unable_set: std::sync::atomic::AtomicBool,
    /// SQLite: the data dir, whose room is looked at when a commit fails.
    dir: Option<std::path::PathBuf>,
    /// SQLite: copies the WAL into the database file beside the writer.
    checkpointer: Option<super::checkpointer::Checkpointer>,
    /// PostgreSQL: large appends commit on a lane of their own (see
    /// [`run_large_lane`]).
    large_lane: bool,
}

impl Shared {
    /// A transaction committed (the checkpointer wakes).
    fn wrote(&self) {
        if let Some(c) = &self.checkpointer {
            c.wrote();
        }
    }

    fn set_unable(&self, why: Option<String>) {
        use std::sync::atomic::Ordering;
        // A commit that succeeds while all is well (the usual case) takes
        // no lock.
        if why.is_none() && !self.unable_set.load(Ordering::Acquire) {
            return;
        }
        let mut unable = self.unable.lock().unwrap_or_else(|p| p.into_inner());
        self.unable_set.store(why.is_some(), Ordering::Release);
        *unable = why;
    }
}

/// Marks the host unable to write when the writer thread ends, whatever
/// ends it (a panic unwinding it when no stop-the-process policy is
/// installed, see `streamhost_core::invariant`).
struct WriterExit(Arc<Shared>);

impl Drop for WriterExit {
    fn drop(&mut self) {
        let why = if std::thread::panicking() {
            "the storage writer thread panicked"
        } else {
            "the storage writer thread stopped"
        };
        self.0.set_unable(Some(why.into()));
    }
}

/// Starts the checkpointer of the writer's database (at `path`), with the
/// writer's `synchronous`.
fn checkpoint_beside(
    conn: &rusqlite::Connection,
    path: &std::path::Path,
) -> Result<super::checkpointer::Checkpointer> {
    let synchronous: i64 = conn.pragma_query_value(None, "synchronous", |r| r.get(0))?;
    super::checkpointer::Checkpointer::start(path, &synchronous.to_string())
}

/// Starts a thread named `name` that commits through `shared` (the writer,
/// or its lane of large appends); however it ends, the host is then marked
/// unable to write ([`WriterExit`]).
fn spawn_writing(
    shared: &Arc<Shared>,
    name: &str,
    f: impl FnOnce(&Shared) + Send + 'static,
) -> std::io::Result<()> {
    let shared = shared.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let exit = WriterExit(shared);
            f(&exit.0)
        })
        .map(drop)
}

impl WriterHandle {
    pub(super) fn start(
        conn: WriteConn,
        observe: crate::CommitObserver,
        hot: Arc<super::hot::Hot>,
    ) -> Result<WriterHandle> {
        let (tx, rx) = mpsc::channel::<Job>();
        let faults = Faults::from_env()?;
        if faults.active() {
            tracing::warn!(faults = ?faults, "storage faults are injected on purpose ({})", super::faults::ENV);
        }
        let (dir, checkpointer) = match &conn {
            WriteConn::Sqlite(c) => match c.path().filter(|p| !p.is_empty()) {
                Some(path) => {
                    let path = std::path::Path::new(path);
                    (
                        path.parent().map(|d| d.to_path_buf()),
                        Some(checkpoint_beside(c, path)?),
                    )
                }
                None => (None, None),
            },
            WriteConn::Postgres(..) => (None, None),
        };
        // PostgreSQL: large appends commit on a second connection, on a
        // thread of their own, beside the writer's groups.
        let large = match &conn {
            WriteConn::Postgres(_, target) => {
                let second = PgConn::connect(target)
                    .context("connecting the writer's lane for large appends")?;
                Some((
                    WriteConn::Postgres(Box::new(second), target.clone()),
                    mpsc::channel::<Job>(),
                ))
            }
            WriteConn::Sqlite(_) => None,
        };
        let (large_conn, lane) = match large {
            Some((c, (tx, rx))) => (Some((c, rx)), Some(tx)),
            None => (None, None),
        };
        let shared = Arc::new(Shared {
            dir,
            checkpointer,
            large_lane: lane.is_some(),
            conn: std::sync::Mutex::new(conn),
            observe,
            hot,
            faults,
            unable: std::sync::Mutex::new(None),
            unable_set: std::sync::atomic::AtomicBool::new(false),
        });
        spawn_writing(&shared, "streamhost-writer", move |s| run(s, rx, lane))
            .context("starting the writer thread")?;
        if let Some((conn, rx)) = large_conn {
            spawn_writing(&shared, "streamhost-writer-large", move |s| {
                run_large_lane(s, conn, rx)
            })
            .context("starting the writer's lane for large appends")?;
        }
        Ok(WriterHandle { tx, shared })
    }

    /// Why the host cannot write now (`None`: it can).
    pub(super) fn unable_to_write(&self) -> Option<String> {
        self.shared
            .unable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn submit(&self, op: WriteOp) -> oneshot::Receiver<Result<i64, CommitError>> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            op,
            reply,
            staging: None,
        };
        if let Err(mpsc::SendError(job)) = self.tx.send(job) {
            let _ = job
                .reply
                .send(Err(CommitError::new("the storage writer has stopped")));
        }
        rx
    }

    /// Commits `op` on this (blocking) thread when the writer is idle, or
    /// through the writer's next group when it is busy, and answers after
    /// the commit. An idle writer would commit `op` alone anyway; doing it
    /// here saves waking the writer thread and being woken by it.
    pub(super) fn commit_blocking(&self, op: WriteOp) -> Result<i64, CommitError> {
        // Large bodies are written in parts by the writer thread, between
        // other groups (SQLite); a large append commits on its lane
        // (PostgreSQL).
        let in_parts = self.shared.dir.is_some()
            && matches!(&op, WriteOp::Commit(c)
                if c.events.iter().any(|e| e.body.len() > super::parts::LARGE_BODY_BYTES));
        let in_lane = self.shared.large_lane && is_large_append(&op);
        let conn = if in_parts || in_lane {
            Err(std::sync::TryLockError::WouldBlock)
        } else {
            self.shared.conn.try_lock()
        };
        match conn {
            Ok(mut conn) => {
                let mut ops = [op];
                commit(&self.shared, conn.ready(), &mut ops)
                    .pop()
                    .expect("one result per write")
            }
            Err(_) => self
                .submit(op)
                .blocking_recv()
                .unwrap_or_else(|_| Err(CommitError::new("the storage writer has stopped"))),
        }
    }
}

/// The writer thread: commits the queued writes in groups. `lane`
/// (PostgreSQL) takes the large appends; it ends when this does.
fn run(shared: &Shared, rx: mpsc::Receiver<Job>, lane: Option<mpsc::Sender<Job>>) {
    // Writes queued and not yet committed, oldest first.
    let mut queued: std::collections::VecDeque<Job> = std::collections::VecDeque::new();
    let mut large_turn = false;
    // SQLite: large bodies are written in parts before their commit.
    let in_parts = shared.dir.is_some();
    loop {
        // A job's large bodies are looked for once, as it arrives; on
        // PostgreSQL a large append goes to its lane.
        let arrived = |queued: &mut std::collections::VecDeque<Job>, mut job: Job| match &lane {
            Some(lane) if is_large_append(&job.op) => {
                if let Err(mpsc::SendError(job)) = lane.send(job) {
                    let _ = job.reply.send(Err(CommitError::new(
                        "the storage writer's lane for large appends has stopped",
                    )));
                }
            }
            _ => {
                if in_parts {
                    job.staging = Staging::of(&mut job.op);
                }
                queued.push_back(job);
            }
        };
        if queued.is_empty() {
            match rx.recv() {
                Ok(job) => arrived(&mut queued, job),
                Err(_) => return,
            }
        }
        while queued.len() < GROUP_WRITES_MAX {
            match rx.try_recv() {
                Ok(job) => arrived(&mut queued, job),
                Err(_) => break,
            }
        }
        if queued.is_empty() {
            continue;
        }
        // The writes ready to commit (their parts, if any, written).
        let ready: Vec<usize> = (0..queued.len())
            .filter(|&i| queued[i].staging.as_ref().is_none_or(Staging::done))
            .collect();
        if !ready.is_empty() {
            let bytes: Vec<usize> = ready.iter().map(|&i| op_bytes(&queued[i].op)).collect();
            let chosen = next_group(&bytes, large_turn);
            large_turn = next_is_large_turn(&bytes, &chosen);
            let group: Vec<usize> = chosen.into_iter().map(|g| ready[g]).collect();
            let mut jobs = Vec::with_capacity(group.len());
            let mut rest = std::collections::VecDeque::with_capacity(queued.len() - group.len());
            let mut taken = group.iter().peekable();
            for (i, job) in queued.drain(..).enumerate() {
                if taken.next_if_eq(&&i).is_some() {
                    jobs.push(job);
                } else {
                    rest.push_back(job);
                }
            }
            queued = rest;
            let (mut ops, replies): (Vec<WriteOp>, Vec<_>) =
                jobs.into_iter().map(|j| (j.op, j.reply)).unzip();
            let results = {
                let mut conn = shared.conn.lock().unwrap_or_else(|p| p.into_inner());
                let conn = conn.ready();
                let results = commit(shared, conn, &mut ops);
                drop_unadopted(conn, &ops, &results);
                results
            };
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
        // Then one part of the oldest large body still being written.
        if let Some(i) = queued
            .iter()
            .position(|j| j.staging.as_ref().is_some_and(|s| !s.done()))
        {
            let written = {
                let mut conn = shared.conn.lock().unwrap_or_else(|p| p.into_inner());
                write_next_part(shared, conn.ready(), &mut queued[i])
            };
            if let Err(e) = written {
                let job = queued.remove(i).expect("the job just written");
                let mut conn = shared.conn.lock().unwrap_or_else(|p| p.into_inner());
                let ids: Vec<i64> = match &job.op {
                    WriteOp::Commit(c) => c.staged.iter().map(|(_, id)| *id).collect(),
                    _ => Vec::new(),
                };
                let ids: Vec<i64> = ids
                    .into_iter()
                    .chain(
                        job.staging
                            .iter()
                            .flat_map(|s| s.bodies.iter().map(|b| b.1)),
                    )
                    .collect();
                drop_bodies(conn.ready(), &ids);
                let _ = job.reply.send(Err(e));
            }
        }
    }
}

/// Whether `op` is an append large enough for PostgreSQL's lane of large
/// appends: one whose events' bodies pass [`LARGE_WRITE_BYTES`]. (Only
/// appends: each touches its own stream's rows, so it commits beside the
/// writer's groups without waiting for them or holding them up.)
fn is_large_append(op: &WriteOp) -> bool {
    matches!(op, WriteOp::Commit(_)) && op_bytes(op) > LARGE_WRITE_BYTES
}

/// PostgreSQL's lane of large appends: commits each, oldest first, alone,
/// on its own connection, while the writer thread commits the small ones.
/// A quiet project's append then waits for no other project's large one
/// (the database runs both transactions at once); one project's large
/// appends wait for each other.
fn run_large_lane(shared: &Shared, mut conn: WriteConn, rx: mpsc::Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let mut ops = [job.op];
        let result = commit(shared, conn.ready(), &mut ops)
            .pop()
            .expect("one result per write");
        let _ = job.reply.send(result);
    }
}

/// Writes the next part of `job`'s large bodies in a transaction of its
/// own; a body whose last part is written is the commit's to take.
fn write_next_part(shared: &Shared, conn: Db<'_>, job: &mut Job) -> Result<(), CommitError> {
    let (WriteOp::Commit(c), Some(staging)) = (&mut job.op, job.staging.as_mut()) else {
        return Ok(());
    };
    let Some(body) = staging.bodies.first_mut() else {
        return Ok(());
    };
    let (index, id, from, seq) = *body;
    let part = super::parts::next_part(&c.events[index].body, from);
    let full = |e: CommitError| match shared.dir.as_deref().and_then(disk_full) {
        Some(why) => e.of_full_disk(&why),
        None => e,
    };
    control(conn, "BEGIN IMMEDIATE").map_err(|e| full(CommitError::of_write(&e)))?;
    if let Err(e) = super::parts::write_part(conn, id, seq, part) {
        let _ = control(conn, "ROLLBACK");
        return Err(full(CommitError::of_write(&e)));
    }
    finish_group(conn, &shared.faults).map_err(|e| full(CommitError::new(e)))?;
    shared.wrote();
    body.2 += part.len();
    body.3 += 1;
    if body.2 == c.events[index].body.len() {
        c.staged.push((index, id));
        staging.bodies.remove(0);
    }
    Ok(())
}

/// The bodies written in parts for writes that did not commit go (their
/// append failed; the actor plans it again).
fn drop_unadopted(conn: Db<'_>, ops: &[WriteOp], results: &[Result<i64, CommitError>]) {
    let ids: Vec<i64> = ops
        .iter()
        .zip(results)
        .filter(|(_, r)| r.is_err())
        .filter_map(|(op, _)| match op {
            WriteOp::Commit(c) => Some(c.staged.iter().map(|(_, id)| *id)),
            _ => None,
        })
        .flatten()
        .collect();
    drop_bodies(conn, &ids);
}

/// Drops bodies `ids` no commit took, in a transaction of its own.
fn drop_bodies(conn: Db<'_>, ids: &[i64]) {
    if ids.is_empty() {
        return;
    }
    let dropped = control(conn, "BEGIN IMMEDIATE")
        .and_then(|()| super::parts::drop_uncommitted(conn, ids))
        .and_then(|()| control(conn, "COMMIT"));
    if let Err(e) = dropped {
        let _ = control(conn, "ROLLBACK");
        tracing::warn!(error = %format!("{e:#}"), "dropping the parts of bodies no commit took (the next start drops them)");
    }
}

/// A write of more bytes than this commits in a group of its own: the
/// small writes queued beside it (other streams', other projects') do
/// not wait for its bytes to reach the disk.
const LARGE_WRITE_BYTES: usize = 256 * 1024;
/// Most bytes of small writes in one group.
const GROUP_BYTES_MAX: usize = 4 * 1024 * 1024;

/// The bytes a write puts on disk, roughly: its events, state and
/// component (what makes one write slow to commit).
fn op_bytes(op: &WriteOp) -> usize {
    match op {
        WriteOp::Commit(c) => {
            let body = |(i, e): (usize, &StoredEvent)| match c.staged.iter().find(|(s, _)| *s == i)
            {
                Some((_, id)) => super::parts::body_ref(*id, e.body.len()).len(),
                None => e.body.len(),
            };
            c.events.iter().enumerate().map(body).sum::<usize>() + c.state_json.len()
        }
        WriteOp::Deploy(d) => d.bytes.len(),
        WriteOp::Checkpoint(c) => c.state.len() + keys_bytes(&c.keys),
        WriteOp::Scratch(super::ScratchOp::Write { keys, .. }) => keys_bytes(keys),
        _ => 0,
    }
}

/// The bytes of keyed writes: keys and values.
fn keys_bytes(keys: &super::keys::Writes) -> usize {
    keys.iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum()
}

/// Which queued writes (their bytes, oldest first) commit next, in order:
/// the small ones, up to [`GROUP_BYTES_MAX`] (always one) and
/// [`GROUP_WRITES_MAX`]; a large one alone, when no small one waits or on
/// its turn (`large_turn`: a group of small ones went while it waited).
/// Every write a stream or a caller submits waits for its answer before
/// the next, so writes queued together are independent and may commit in
/// any order.
fn next_group(bytes: &[usize], large_turn: bool) -> Vec<usize> {
    let first_large = bytes.iter().position(|&b| b > LARGE_WRITE_BYTES);
    if let (true, Some(i)) = (large_turn, first_large) {
        return vec![i];
    }
    let mut group = Vec::new();
    let mut total = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b > LARGE_WRITE_BYTES {
            continue;
        }
        if group.len() == GROUP_WRITES_MAX || (!group.is_empty() && total + b > GROUP_BYTES_MAX) {
            break;
        }
        total += b;
        group.push(i);
    }
    if group.is_empty() {
        group.extend(first_large);
    }
    group
}

/// Whether a large write goes next: one waits, and `group` (of
/// [`next_group`]) passed it by.
fn next_is_large_turn(bytes: &[usize], group: &[usize]) -> bool {
    group.iter().all(|&i| bytes[i] <= LARGE_WRITE_BYTES)
        && bytes.iter().any(|&b| b > LARGE_WRITE_BYTES)
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
    let mut results = commit_group(shared, conn, ops);
    if results
        .iter()
        .any(|r| r.as_ref().is_err_and(|e| !e.rolled_back))
    {
        // A failed transaction: was it for want of room?
        if let Some(why) = shared.dir.as_deref().and_then(disk_full) {
            for r in results.iter_mut() {
                if let Err(e) = r {
                    *e = e.clone().of_full_disk(&why);
                }
            }
        }
    }
    let elapsed = started.elapsed();
    let committed: usize = ops
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|(op, _)| events(op))
        .sum();
    (shared.observe)(elapsed, ops.len(), committed);
    if results.iter().any(Result::is_ok) {
        shared.wrote();
        shared.set_unable(None);
    } else if let Some(Err(e)) = results
        .iter()
        .find(|r| r.as_ref().is_err_and(|e| !e.rolled_back))
    {
        // The transaction failed as a whole (not one write's own refusal).
        shared.set_unable(Some(format!("the last commit failed: {e}")));
    }
    tracing::debug!(elapsed_us = elapsed.as_micros() as u64, "group committed");
    drop(span);
    if results
        .iter()
        .any(|r| r.as_ref().is_err_and(|e| !e.rolled_back))
    {
        // A failed COMMIT may still have reached the disk (an fsync error
        // leaves the outcome unknown): nothing cached is trusted any more.
        // (A write whose own statement failed was rolled back alone.)
        shared.hot.clear();
    }
    shared.hot.committed(
        ops.iter_mut()
            .zip(&results)
            .filter_map(|(op, r)| r.as_ref().ok().map(|row_id| (op, *row_id))),
    );
    results
}

/// Keeps the newest `d.versions_kept` versions of `d`'s component
/// (`[processors] max-versions-per-component`), and drops
/// the bytes of those it let go that nothing else names (a current
/// component, a version kept, a refold or shadow pending, a checkpoint
/// folded by it; bytes are shared by digest across projects).
fn trim_versions(conn: Db<'_>, d: &Deployment) -> Result<()> {
    let id = conn.pick("rowid", "id");
    let keep = d.versions_kept.max(1) as i64;
    let older = format!(
        "FROM component_versions WHERE project = ?1 AND name = ?2 AND {id} NOT IN (
             SELECT {id} FROM component_versions WHERE project = ?1 AND name = ?2
             ORDER BY {id} DESC LIMIT ?3)"
    );
    let gone = conn.query_all(
        &format!("SELECT DISTINCT digest {older}"),
        args![&d.project, &d.name, keep],
        |r| r.text(0),
    )?;
    if gone.is_empty() {
        return Ok(());
    }
    conn.execute(&format!("DELETE {older}"), args![&d.project, &d.name, keep])?;
    for digest in gone {
        conn.execute(
            "DELETE FROM component_blobs WHERE digest = ?1
               AND NOT EXISTS (SELECT 1 FROM component_versions WHERE digest = ?1)
               AND NOT EXISTS (SELECT 1 FROM components WHERE digest = ?1)
               AND NOT EXISTS (SELECT 1 FROM pending_refolds WHERE digest = ?1)
               AND NOT EXISTS (SELECT 1 FROM processor_checkpoints WHERE digest = ?1)",
            args![&digest],
        )?;
    }
    Ok(())
}

/// Runs one of the fixed transaction-control statements (prepared once per
/// connection, not parsed per commit).
fn control(conn: Db<'_>, sql: &str) -> Result<()> {
    conn.control(sql)
}

/// COMMIT, or the fault injected in its place (see `faults`).
fn finish(conn: Db<'_>, faults: &Faults) -> Result<(), String> {
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
        Fault::Panic => panic!(
            "invariant writer-test: a writer panic injected on purpose ({})",
            super::faults::ENV
        ),
    }
}

/// Free bytes below which a data dir's disk counts as full.
const FULL_BELOW_BYTES: u64 = 1024 * 1024;

/// Why the disk holding `dir` is full, if it is: almost no room left on
/// its file system, or a database file at the process's file size limit
/// (RLIMIT_FSIZE; the server ignores SIGXFSZ, so a write past it fails).
fn disk_full(dir: &std::path::Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `path` is a valid C string; `st` is a valid statvfs to write.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } == 0 {
        let free = st.f_bavail as u64 * st.f_frsize as u64;
        if free < FULL_BELOW_BYTES {
            return Some(format!("{} has {free} bytes free", dir.display()));
        }
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to write.
    if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) } == 0
        && limit.rlim_cur != libc::RLIM_INFINITY
    {
        let largest = ["streamhost.db", "streamhost.db-wal"]
            .iter()
            .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
            .map(|m| m.len())
            .max()
            .unwrap_or(0);
        if largest.saturating_add(FULL_BELOW_BYTES) >= limit.rlim_cur {
            return Some(format!(
                "a database file of {largest} bytes is at the process's file size limit \
                 (RLIMIT_FSIZE, {} bytes)",
                limit.rlim_cur
            ));
        }
    }
    None
}

fn fail_all(ops: &[WriteOp], e: &dyn fmt::Display) -> Vec<Result<i64, CommitError>> {
    ops.iter()
        .map(|_| Err(CommitError::new(format!("transaction failed: {e}"))))
        .collect()
}

fn commit_group(shared: &Shared, conn: Db<'_>, ops: &[WriteOp]) -> Vec<Result<i64, CommitError>> {
    let faults = &shared.faults;
    let redacting = conn.dialect() == Dialect::Sqlite
        && ops
            .iter()
            .any(|op| matches!(op, WriteOp::Commit(c) if !c.redactions.is_empty()));
    if !redacting {
        return commit_group_of(conn, ops, faults);
    }
    // A redaction leaves no copy of what it erased in the database file:
    // SQLite zeroes the freed content (`secure_delete`) while the group
    // commits, and a checkpoint then copies the rewritten pages over the
    // old ones and truncates the WAL that held their earlier images (a
    // reader holding an older snapshot can keep that from completing now:
    // the next checkpoint does).
    let set = |on: bool| {
        let sql = if on {
            "PRAGMA secure_delete = ON"
        } else {
            "PRAGMA secure_delete = OFF"
        };
        if let Err(e) = conn.query_opt(sql, args![], |r| r.int(0)) {
            tracing::warn!(error = %format!("{e:#}"), "setting secure_delete");
        }
    };
    set(true);
    let results = commit_group_of(conn, ops, faults);
    set(false);
    if results.iter().any(Result::is_ok) {
        // The checkpointer's run (SQLite answers busy at once, without
        // waiting, to a second checkpointer) ends first.
        let _held = shared.checkpointer.as_ref().map(|c| c.hold());
        truncate_wal(conn);
    }
    results
}

/// Checkpoints the whole WAL and truncates it (after a redaction), waiting
/// for readers at most 100 ms: the writer holds everyone's next commit
/// meanwhile.
fn truncate_wal(conn: Db<'_>) {
    for sql in [
        "PRAGMA busy_timeout = 100",
        "PRAGMA wal_checkpoint(TRUNCATE)",
        "PRAGMA busy_timeout = 10000",
    ] {
        if let Err(e) = conn.query_opt(sql, args![], |r| r.int(0)) {
            tracing::warn!(error = %format!("{e:#}"), sql, "checkpointing after a redaction");
        }
    }
}

fn commit_group_of(
    conn: Db<'_>,
    ops: &[WriteOp],
    faults: &Faults,
) -> Vec<Result<i64, CommitError>> {
    if let Db::Postgres(pg) = conn {
        if ops.iter().any(|op| matches!(op, WriteOp::Commit(_))) {
            return commit_group_pipelined(pg, ops, faults);
        }
    }
    let fail_all = |e: &dyn fmt::Display| fail_all(ops, e);
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
            Ok(row_id) => match finish_group(conn, faults) {
                Ok(()) => vec![Ok(row_id)],
                Err(e) => fail_all(&e),
            },
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "write rolled back");
                let _ = control(conn, "ROLLBACK");
                vec![Err(CommitError::of_write(&e))]
            }
        };
    }
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        match apply_in_savepoint(conn, op) {
            Ok(result) => results.push(result),
            Err(e) => return fail_all(&e),
        }
    }
    match finish_group(conn, faults) {
        Ok(()) => results,
        Err(e) => fail_all(&e),
    }
}

/// Applies `op` in a savepoint of its own: its failure rolls back only
/// its own statements. An error: the savepoint itself failed (the
/// transaction is rolled back).
fn apply_in_savepoint(conn: Db<'_>, op: &WriteOp) -> Result<Result<i64, CommitError>> {
    if let Err(e) = control(conn, "SAVEPOINT op") {
        let _ = control(conn, "ROLLBACK");
        return Err(e);
    }
    Ok(match apply(conn, op) {
        Ok(row_id) => {
            let _ = control(conn, "RELEASE op");
            Ok(row_id)
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "write rolled back");
            let _ = control(conn, "ROLLBACK TO op");
            let _ = control(conn, "RELEASE op");
            Err(CommitError::of_write(&e))
        }
    })
}

/// Runs one-statement writes, each in a savepoint of its own as
/// [`apply_in_savepoint`] does, pipelined: one round trip for all of them
/// unless one fails (then the rest go again after it is rolled back).
/// Answers each write's rows. An error: a savepoint itself failed (the
/// transaction is rolled back).
fn pipeline_in_savepoints(
    pg: &PgConn,
    writes: &[(&str, Vec<super::sql::Arg<'_>>)],
) -> Result<Vec<Result<i64, CommitError>>> {
    let conn = Db::Postgres(pg);
    let mut out = Vec::with_capacity(writes.len());
    while out.len() < writes.len() {
        let rest = &writes[out.len()..];
        let mut statements: Vec<(&str, &[super::sql::Arg<'_>])> =
            Vec::with_capacity(3 * rest.len());
        for (sql, args) in rest {
            statements.push(("SAVEPOINT op", &[]));
            statements.push((sql, args.as_slice()));
            statements.push(("RELEASE op", &[]));
        }
        let answers = pg.pipeline(&statements).inspect_err(|_| {
            let _ = control(conn, "ROLLBACK");
        })?;
        let mut answers = answers.into_iter();
        while let (Some(savepoint), Some(write), Some(release)) =
            (answers.next(), answers.next(), answers.next())
        {
            if let Err(e) = savepoint {
                let _ = control(conn, "ROLLBACK");
                return Err(e.into());
            }
            match write {
                Ok(rows) => {
                    if let Err(e) = release {
                        let _ = control(conn, "ROLLBACK");
                        return Err(e.into());
                    }
                    out.push(Ok(rows.len() as i64));
                }
                Err(e) => {
                    // Every statement after it failed for the aborted
                    // transaction: undo this one, then send the rest again.
                    let e = anyhow::Error::from(e);
                    tracing::error!(error = %format!("{e:#}"), "write rolled back");
                    control(conn, "ROLLBACK TO op")
                        .and_then(|()| control(conn, "RELEASE op"))
                        .inspect_err(|_| {
                            let _ = control(conn, "ROLLBACK");
                        })?;
                    out.push(Err(CommitError::of_write(&e)));
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// Commits the group's transaction (see [`finish`]); rolls it back when
/// that fails.
fn finish_group(conn: Db<'_>, faults: &Faults) -> Result<(), String> {
    finish(conn, faults).inspect_err(|e| {
        tracing::error!(error = %e, "group commit failed");
        let _ = control(conn, "ROLLBACK");
    })
}

/// The statement of one stream round on PostgreSQL (see
/// `schema::APPEND_FUNCTION_POSTGRES`).
const APPEND_ROUND: &str = "SELECT streamhost_append_v1(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, \
     ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26)";

/// Replaces a committed event's body with its redacted one, and the
/// stream's stored bytes with what it stores now.
fn redact(conn: Db<'_>, row_id: i64, r: &StoredEvent) -> Result<()> {
    let old = conn
        .query_opt(
            "SELECT body FROM events WHERE stream = ?1 AND \"offset\" = ?2",
            args![row_id, r.offset as i64],
            |row| row.text(0),
        )?
        .with_context(|| format!("redacting offset {}: no stored event there", r.offset))?;
    conn.execute(
        "UPDATE events SET body = ?3 WHERE stream = ?1 AND \"offset\" = ?2",
        args![row_id, r.offset as i64, &*r.body],
    )?;
    if super::parts::parse_ref(&old).is_some() {
        // Its parts go with what they held (zeroed, as the row's old text).
        super::parts::remove_one(conn, row_id, r.offset)?;
    }
    conn.execute(
        "UPDATE streams SET bytes = bytes - ?2 + ?3 WHERE id = ?1",
        args![
            row_id,
            super::parts::body_bytes(&old) as i64,
            r.body.len() as i64
        ],
    )?;
    Ok(())
}

/// A redaction in a PostgreSQL pipeline (after its round, in the same
/// transaction): the body replaced and the stream's bytes adjusted in one
/// statement; it answers a row only if the event was there.
const REDACT_POSTGRES: &str = "WITH old AS (
         SELECT octet_length(body) AS n FROM events WHERE stream = ?1 AND \"offset\" = ?2
     ), changed AS (
         UPDATE events SET body = ?3 WHERE stream = ?1 AND \"offset\" = ?2 RETURNING 1
     )
     UPDATE streams SET bytes = bytes - (SELECT n FROM old) + octet_length(?3::text)
     WHERE id = ?1 AND EXISTS (SELECT 1 FROM changed) RETURNING id";

/// Retention's removal on SQLite: the stream's bytes lose what the events
/// through the offset store (as [`StoredEvent::stored_bytes`] counts), then
/// the events go.
const REMOVE_SQLITE_BYTES: &str = "UPDATE streams SET bytes = bytes - (
         SELECT COALESCE(SUM(length(CAST(type AS BLOB)) + COALESCE(length(CAST(idempotency_key AS BLOB)), 0)
                + CASE WHEN body LIKE '#parts:%' THEN 0 ELSE length(CAST(body AS BLOB)) END), 0)
         FROM events WHERE stream = ?1 AND \"offset\" <= ?2) - (
         SELECT COALESCE(SUM(length(CAST(p.part AS BLOB))), 0)
         FROM event_bodies b JOIN event_parts p ON p.body = b.id
         WHERE b.stream = ?1 AND b.\"offset\" <= ?2)
     WHERE id = ?1";
const REMOVE_SQLITE: &str = "DELETE FROM events WHERE stream = ?1 AND \"offset\" <= ?2";

/// Retention's removal in a PostgreSQL pipeline (after its round, in the
/// same transaction): the events through the offset deleted and the
/// stream's bytes adjusted in one statement.
const REMOVE_POSTGRES: &str = "WITH gone AS (
         DELETE FROM events WHERE stream = ?1 AND \"offset\" <= ?2
         RETURNING octet_length(type) + COALESCE(octet_length(idempotency_key), 0)
                   + octet_length(body) AS n
     )
     UPDATE streams SET bytes = bytes - COALESCE((SELECT SUM(n) FROM gone), 0)
     WHERE id = ?1 RETURNING id";

/// A stream round's columns, as the arrays `streamhost_append_v1` takes.
struct RoundArrays<'a> {
    offsets: Vec<Option<i64>>,
    types: Vec<Option<&'a str>>,
    keys: Vec<Option<&'a str>>,
    bodies: Vec<Option<&'a str>>,
    cursor_keys: Vec<Option<&'a str>>,
    generations: Vec<Option<i64>>,
    acknowledged: Vec<Option<i64>>,
    failing_offsets: Vec<Option<i64>>,
    failing_attempts: Vec<Option<i64>>,
    skips: Vec<Option<i64>>,
    attempts: Vec<Option<i64>>,
    last_errors: Vec<Option<&'a str>>,
    removed: Vec<Option<&'a str>>,
}

impl<'a> RoundArrays<'a> {
    fn of(c: &'a StreamCommit) -> RoundArrays<'a> {
        let cursors = &c.cursors;
        RoundArrays {
            offsets: c.events.iter().map(|e| Some(e.offset as i64)).collect(),
            types: c.events.iter().map(|e| Some(&*e.event_type)).collect(),
            keys: c
                .events
                .iter()
                .map(|e| e.idempotency_key.as_deref())
                .collect(),
            bodies: c.events.iter().map(|e| Some(e.body.as_str())).collect(),
            cursor_keys: cursors.iter().map(|c| Some(&*c.subscription_key)).collect(),
            generations: cursors.iter().map(|c| Some(c.generation as i64)).collect(),
            acknowledged: cursors
                .iter()
                .map(|c| Some(c.acknowledged_offset as i64))
                .collect(),
            failing_offsets: cursors
                .iter()
                .map(|c| c.failing_offset.map(|o| o as i64))
                .collect(),
            failing_attempts: cursors
                .iter()
                .map(|c| Some(c.failing_attempts.into()))
                .collect(),
            skips: cursors.iter().map(|c| Some(c.skips.into())).collect(),
            attempts: cursors.iter().map(|c| Some(c.attempts.into())).collect(),
            last_errors: cursors.iter().map(|c| c.last_error.as_deref()).collect(),
            removed: c.removed_cursors.iter().map(|k| Some(&**k)).collect(),
        }
    }

    fn args(&'a self, c: &'a StreamCommit) -> Vec<super::sql::Arg<'a>> {
        use super::sql::Arg;
        let text = |v: &'a str| Arg::Text(v);
        let (fence_project, fence_path, owner, epoch) = match &c.fence {
            Some(f) => (
                text(&f.project),
                text(&f.path),
                text(&f.owner),
                Arg::Int(f.epoch),
            ),
            None => (Arg::Null, Arg::Null, Arg::Null, Arg::Null),
        };
        let (row, expected, project, path, stream_id, created_at) = match &c.stream {
            StreamRef::Existing {
                row_id,
                expected_head,
            } => (
                Arg::Int(*row_id),
                Arg::Int(*expected_head as i64),
                Arg::Null,
                Arg::Null,
                Arg::Null,
                Arg::Null,
            ),
            StreamRef::New(n) => (
                Arg::Null,
                Arg::Int(0),
                text(&n.project),
                text(&n.path),
                text(&n.stream_id),
                text(&n.created_at),
            ),
        };
        vec![
            fence_project,
            fence_path,
            owner,
            epoch,
            row,
            expected,
            project,
            path,
            stream_id,
            created_at,
            Arg::Int(c.head_offset as i64),
            text(&c.state_json),
            Arg::Int(c.state_offset as i64),
            Arg::Ints(&self.offsets),
            Arg::Texts(&self.types),
            Arg::Texts(&self.keys),
            Arg::Texts(&self.bodies),
            Arg::Texts(&self.cursor_keys),
            Arg::Ints(&self.generations),
            Arg::Ints(&self.acknowledged),
            Arg::Ints(&self.failing_offsets),
            Arg::Ints(&self.failing_attempts),
            Arg::Ints(&self.skips),
            Arg::Ints(&self.attempts),
            Arg::Texts(&self.last_errors),
            Arg::Texts(&self.removed),
        ]
    }
}

/// A reactor's effects insert's arguments, and its cancels' statement.
type EffectStatements<'a> = (
    Vec<super::sql::Arg<'a>>,
    Option<(&'static str, Vec<super::sql::Arg<'a>>)>,
);

/// A group on PostgreSQL: `BEGIN` and every stream round (one statement
/// each, whose refusals raise) go in one pipelined round trip; the other
/// writes follow one by one, each in a savepoint; then `COMMIT`. A round
/// that fails aborts the transaction: it is rolled back and the group runs
/// again without that round (nothing of the refused round committed).
fn commit_group_pipelined(
    pg: &PgConn,
    ops: &[WriteOp],
    faults: &Faults,
) -> Vec<Result<i64, CommitError>> {
    let conn = Db::Postgres(pg);
    let mut refused: Vec<Option<CommitError>> = vec![None; ops.len()];
    'group: loop {
        let rounds: Vec<(usize, &StreamCommit)> = ops
            .iter()
            .enumerate()
            .filter(|(i, _)| refused[*i].is_none())
            .filter_map(|(i, op)| match op {
                WriteOp::Commit(c) => Some((i, c)),
                _ => None,
            })
            .collect();
        let arrays: Vec<RoundArrays<'_>> = rounds.iter().map(|(_, c)| RoundArrays::of(c)).collect();
        let args: Vec<Vec<super::sql::Arg<'_>>> = arrays
            .iter()
            .zip(&rounds)
            .map(|(a, (_, c))| a.args(c))
            .collect();
        // Each round's effects (reactors') follow it in the pipeline, one
        // statement per reactor: (round index in `rounds`, statement).
        let effect_arrays: Vec<(usize, super::effects::PgInsert<'_>)> = rounds
            .iter()
            .enumerate()
            .flat_map(|(r, (_, c))| {
                c.effects
                    .iter()
                    .filter(|e| !e.effects.is_empty())
                    .map(move |e| {
                        (
                            r,
                            super::effects::PgInsert::of(&e.source, &e.effects, &e.created_at),
                        )
                    })
            })
            .collect();
        // A reactor's cancels follow its insert: (insert's args, cancels').
        let effect_args: Vec<EffectStatements<'_>> = effect_arrays
            .iter()
            .map(|(_, p)| (p.args(), p.cancel()))
            .collect();
        // Each round's redactions follow it too: (round index, arguments).
        let redaction_args: Vec<(usize, Vec<super::sql::Arg<'_>>)> = rounds
            .iter()
            .enumerate()
            .flat_map(|(r, (_, c))| {
                let row_id = match &c.stream {
                    StreamRef::Existing { row_id, .. } => Some(*row_id),
                    StreamRef::New(_) => None,
                };
                c.redactions.iter().filter_map(move |e| {
                    Some((
                        r,
                        vec![
                            super::sql::Arg::Int(row_id?),
                            super::sql::Arg::Int(e.offset as i64),
                            super::sql::Arg::Text(&e.body),
                        ],
                    ))
                })
            })
            .collect();
        // And each round's settlement of its append effects, one
        // statement: (round index, ids, then its arguments).
        let settled_ids: Vec<(usize, Vec<Option<i64>>, &str)> = rounds
            .iter()
            .enumerate()
            .filter_map(|(r, (_, c))| {
                let s = c.settled.as_ref()?;
                Some((r, s.pg_ids(), s.settled_at.as_str()))
            })
            .collect();
        let settled_args: Vec<(usize, Vec<super::sql::Arg<'_>>)> = settled_ids
            .iter()
            .map(|(r, ids, at)| {
                (
                    *r,
                    vec![super::sql::Arg::Ints(ids), super::sql::Arg::Text(at)],
                )
            })
            .collect();
        let settled_sql = super::effects::AppendSettled::sql(super::sql::Dialect::Postgres);
        // And each round's removal (retention): (round index, arguments).
        let removal_args: Vec<(usize, Vec<super::sql::Arg<'_>>)> = rounds
            .iter()
            .enumerate()
            .filter_map(|(r, (_, c))| {
                let row_id = match &c.stream {
                    StreamRef::Existing { row_id, .. } => *row_id,
                    StreamRef::New(_) => return None,
                };
                let through = c.removed_through?;
                Some((
                    r,
                    vec![
                        super::sql::Arg::Int(row_id),
                        super::sql::Arg::Int(through as i64),
                    ],
                ))
            })
            .collect();
        let mut statements: Vec<(&str, &[super::sql::Arg<'_>])> = vec![("BEGIN", &[])];
        let mut owners: Vec<usize> = Vec::new();
        let mut effects_of = effect_arrays.iter().zip(&effect_args).peekable();
        let mut redactions_of = redaction_args.iter().peekable();
        let mut removals_of = removal_args.iter().peekable();
        let mut settled_of = settled_args.iter().peekable();
        for (r, a) in args.iter().enumerate() {
            statements.push((APPEND_ROUND, a.as_slice()));
            owners.push(r);
            while let Some(((_, insert), (a, cancel))) = effects_of.next_if(|((er, _), _)| *er == r)
            {
                statements.push((insert.sql(), a.as_slice()));
                owners.push(r);
                if let Some((sql, a)) = cancel {
                    statements.push((sql, a.as_slice()));
                    owners.push(r);
                }
            }
            while let Some((_, a)) = redactions_of.next_if(|(rr, _)| *rr == r) {
                statements.push((REDACT_POSTGRES, a.as_slice()));
                owners.push(r);
            }
            while let Some((_, a)) = removals_of.next_if(|(rr, _)| *rr == r) {
                statements.push((REMOVE_POSTGRES, a.as_slice()));
                owners.push(r);
            }
            if let Some((_, a)) = settled_of.next_if(|(rr, _)| *rr == r) {
                statements.push((settled_sql, a.as_slice()));
                owners.push(r);
            }
        }
        let answers = match pg.pipeline(&statements) {
            Ok(answers) => answers,
            Err(e) => {
                let _ = control(conn, "ROLLBACK");
                return fail_all(ops, &format!("{e:#}"));
            }
        };
        let mut answers = answers.into_iter();
        if let Some(Err(e)) = answers.next() {
            let _ = control(conn, "ROLLBACK");
            return fail_all(ops, &e);
        }
        let mut row_ids: Vec<Option<i64>> = vec![None; ops.len()];
        let mut previous = None;
        for (r, answer) in owners.iter().zip(answers) {
            let (i, _) = rounds[*r];
            // A round's first answer is its row id; the answers after it
            // (its effects' inserts) only need to have succeeded.
            let first = previous != Some(*r);
            previous = Some(*r);
            let row_id = answer.map_err(anyhow::Error::from).and_then(|rows| {
                if !first {
                    return Ok(None);
                }
                let row = rows.first().context("the round answered no row")?;
                Ok(Some(row.try_get::<_, i64>(0)?))
            });
            match row_id {
                Ok(Some(row_id)) => row_ids[i] = Some(row_id),
                Ok(None) => {}
                Err(e) => {
                    // The first failure is the real one (every statement
                    // after it failed for the aborted transaction).
                    let _ = control(conn, "ROLLBACK");
                    let e = if super::sql::is_duplicate_key(&e) {
                        anyhow::Error::new(DuplicateKey { offset: None })
                    } else {
                        e
                    };
                    tracing::error!(error = %format!("{e:#}"), "write rolled back");
                    refused[i] = Some(CommitError::of_write(&e));
                    continue 'group;
                }
            }
        }
        let mut results: Vec<Result<i64, CommitError>> = Vec::with_capacity(ops.len());
        let mut i = 0;
        while i < ops.len() {
            if let Some(e) = &refused[i] {
                results.push(Err(e.clone()));
                i += 1;
                continue;
            }
            if let Some(row_id) = row_ids[i] {
                results.push(Ok(row_id));
                i += 1;
                continue;
            }
            // Effect settlements, one statement each: the consecutive ones
            // go in one round trip.
            let settles: Vec<(&str, Vec<super::sql::Arg<'_>>)> = ops[i..]
                .iter()
                .map_while(|op| match op {
                    WriteOp::Effect(e) => {
                        super::effects::settle_write(super::sql::Dialect::Postgres, e)
                    }
                    _ => None,
                })
                .collect();
            if !settles.is_empty() {
                match pipeline_in_savepoints(pg, &settles) {
                    Ok(settled) => results.extend(settled),
                    Err(e) => return fail_all(ops, &e),
                }
                i += settles.len();
                continue;
            }
            match apply_in_savepoint(conn, &ops[i]) {
                Ok(result) => results.push(result),
                Err(e) => return fail_all(ops, &e),
            }
            i += 1;
        }
        return match finish_group(conn, faults) {
            Ok(()) => results,
            Err(e) => fail_all(ops, &e),
        };
    }
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
            for (i, e) in c.events.iter().enumerate() {
                // A body written in parts: its row names them.
                let staged = c.staged.iter().find(|(s, _)| *s == i).map(|(_, id)| *id);
                let reference = staged.map(|id| super::parts::body_ref(id, e.body.len()));
                conn.execute(
                    "INSERT INTO events (stream, \"offset\", type, idempotency_key, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                    args![
                        row_id,
                        e.offset as i64,
                        &e.event_type,
                        &e.idempotency_key,
                        reference.as_deref().unwrap_or(&e.body)
                    ],
                )
                .map_err(|err| {
                    if super::sql::is_duplicate_key(&err) {
                        anyhow::Error::new(DuplicateKey {
                            offset: Some(e.offset),
                        })
                    } else {
                        err.context(format!("inserting the event at offset {}", e.offset))
                    }
                })?;
                if let Some(id) = staged {
                    super::parts::adopt(conn, id, row_id, e.offset)?;
                }
            }
            conn.execute(
                "UPDATE streams SET head_offset = ?2, state_json = ?3, state_offset = ?4,
                     bytes = bytes + ?5 WHERE id = ?1",
                args![
                    row_id,
                    c.head_offset as i64,
                    &c.state_json,
                    c.state_offset as i64,
                    c.events.iter().map(StoredEvent::stored_bytes).sum::<u64>() as i64
                ],
            )?;
            upsert_cursors(conn, row_id, &c.cursors)?;
            for key in &c.removed_cursors {
                conn.execute(
                    "DELETE FROM subscription_cursors WHERE stream = ?1 AND subscription_key = ?2",
                    args![row_id, key],
                )?;
            }
            for e in &c.effects {
                super::effects::insert(conn, &e.source, &e.effects, e.now_ms, &e.created_at)?;
            }
            if let Some(settled) = &c.settled {
                settled.write(conn)?;
            }
            for r in &c.redactions {
                redact(conn, row_id, r)?;
            }
            if let Some(through) = c.removed_through {
                conn.execute(REMOVE_SQLITE_BYTES, args![row_id, through as i64])?;
                super::parts::remove(conn, row_id, Some(through))?;
                conn.execute(REMOVE_SQLITE, args![row_id, through as i64])?;
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
            if d.mode.is_shadow() {
                // Not a version yet: recorded (replacing any refold or
                // shadow pending) until promoted everywhere or discarded.
                record_refold(conn, d)?;
                notify_deployed(conn, &d.project, &d.name)?;
                return Ok(1);
            }
            let current = conn.query_opt(
                "SELECT digest FROM components WHERE project = ?1 AND name = ?2",
                args![&d.project, &d.name],
                |r| r.text(0),
            )?;
            if current.as_deref() == Some(d.digest.as_str()) {
                // The same bytes again: not a new version, but a refold
                // asked for runs all the same (recorded, as for a new one).
                if d.mode.refolds() {
                    record_refold(conn, d)?;
                } else {
                    // Deploying the current version replaces a shadow.
                    conn.execute(
                        "DELETE FROM pending_refolds WHERE project = ?1 AND name = ?2 AND shadow <> 0",
                        args![&d.project, &d.name],
                    )?;
                }
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
            trim_versions(conn, d)?;
            conn.execute(
                "INSERT INTO pending_resumes (project, name, digest) VALUES (?1, ?2, ?3)
                 ON CONFLICT (project, name) DO UPDATE SET digest = excluded.digest",
                args![&d.project, &d.name, &d.digest],
            )?;
            if d.mode.refolds() {
                record_refold(conn, d)?;
            } else {
                // A version deployed without a refold supersedes one pending.
                conn.execute(
                    "DELETE FROM pending_refolds WHERE project = ?1 AND name = ?2",
                    args![&d.project, &d.name],
                )?;
            }
            notify_deployed(conn, &d.project, &d.name)?;
            Ok(1)
        }
        WriteOp::Checkpoint(c) => {
            if let Some(previous) = c.previous_offset.as_ref() {
                assert!(
                    previous.stream_id != c.stream_id || c.offset >= previous.offset,
                    "invariant processor-state-is-the-fold: a checkpoint at offset {} would \
                     replace one at offset {} of the same source lifetime",
                    c.offset,
                    previous.offset
                );
            }
            if let Some(fence) = &c.fence {
                super::lease::check(conn, fence)?;
            }
            // Compare-and-set in the statement itself: it replaces exactly
            // the row the batch started from (or creates the first), so
            // of two writers that read the same row one fails.
            let replaced = match &c.previous_offset {
                None => conn.execute(
                    "INSERT INTO processor_checkpoints (stream, component, stream_id, checkpoint_offset, state, digest, updated_at, bucket)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                     ON CONFLICT (stream, component) DO NOTHING",
                    args![
                        c.row_id,
                        &c.component,
                        &c.stream_id,
                        c.offset as i64,
                        &c.state,
                        &c.digest,
                        &c.updated_at,
                        c.bucket
                    ],
                )?,
                Some(previous) => conn.execute(
                    "UPDATE processor_checkpoints SET stream_id = ?3, checkpoint_offset = ?4,
                         state = ?5, digest = ?6, updated_at = ?7, bucket = ?11
                     WHERE stream = ?1 AND component = ?2 AND stream_id = ?8
                       AND checkpoint_offset = ?9 AND digest = ?10 AND bucket = ?12",
                    args![
                        c.row_id,
                        &c.component,
                        &c.stream_id,
                        c.offset as i64,
                        &c.state,
                        &c.digest,
                        &c.updated_at,
                        &previous.stream_id,
                        previous.offset as i64,
                        &previous.digest,
                        c.bucket,
                        previous.bucket
                    ],
                )?,
            };
            if replaced != 1 {
                return Err(Refused::error(
                    Refusal::CheckpointMoved,
                    format!(
                        "the checkpoint of processor {:?} moved (expected {:?})",
                        c.component, c.previous_offset,
                    ),
                ));
            }
            if c.adopts_scratch {
                super::keys::adopt_scratch(conn, c.bucket)?;
            }
            super::keys::apply(conn, c.bucket, &c.keys, c.drop_bucket)?;
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
        WriteOp::WebhookSecret { project, change } => Ok(match change {
            SecretChange::Rotate { secret, at } => conn.execute(
                "INSERT INTO webhook_secrets (project, current, previous, rotated_at) \
                 VALUES (?1, ?2, NULL, ?3) ON CONFLICT (project) DO UPDATE SET \
                 previous = webhook_secrets.current, current = excluded.current, \
                 rotated_at = excluded.rotated_at",
                args![project, secret, at],
            )?,
            SecretChange::RetirePrevious => conn.execute(
                "UPDATE webhook_secrets SET previous = NULL \
                 WHERE project = ?1 AND previous IS NOT NULL",
                args![project],
            )?,
        } as i64),
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
        } => {
            let done = conn.execute(
                "DELETE FROM pending_refolds WHERE project = ?1 AND name = ?2 AND digest = ?3",
                args![project, name, digest],
            )? as i64;
            // What folds of the version left unadopted goes with it.
            let left = "SELECT bucket FROM scratch_buckets
                 WHERE project = ?1 AND component = ?2 AND digest = ?3";
            conn.execute(
                &format!("DELETE FROM processor_keys WHERE bucket IN ({left})"),
                args![project, name, digest],
            )?;
            conn.execute(
                "DELETE FROM scratch_buckets WHERE project = ?1 AND component = ?2 AND digest = ?3",
                args![project, name, digest],
            )?;
            // The other hosts' wakes stop pinning the old version.
            notify_deployed(conn, project, name)?;
            Ok(done)
        }
        WriteOp::KeepBase {
            row_id,
            component,
            stream_id,
            chain,
        } => keep_base(conn, *row_id, component, stream_id, chain),
        WriteOp::Scratch(op) => super::keys::apply_scratch(conn, op),
        WriteOp::Reset { row_id, fence } => {
            if let Some(fence) = fence {
                super::lease::check(conn, fence)?;
            }
            super::parts::remove(conn, *row_id, None)?;
            for sql in [
                "DELETE FROM processor_keys WHERE bucket IN
                     (SELECT bucket FROM processor_bases WHERE stream = ?1)",
                "DELETE FROM processor_bases WHERE stream = ?1",
                "DELETE FROM events WHERE stream = ?1",
                "DELETE FROM subscription_cursors WHERE stream = ?1",
                "DELETE FROM processor_keys WHERE bucket IN
                     (SELECT bucket FROM processor_checkpoints WHERE stream = ?1)",
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

/// [`WriteOp::KeepBase`]: the instance's checkpoint (of this lifetime)
/// copied, keys and all, as its base.
fn keep_base(
    conn: Db<'_>,
    row_id: i64,
    component: &str,
    stream_id: &str,
    chain: &str,
) -> Result<i64> {
    let Some((offset, digest, state, bucket)) = conn.query_opt(
        "SELECT checkpoint_offset, digest, state, bucket FROM processor_checkpoints
         WHERE stream = ?1 AND component = ?2 AND stream_id = ?3",
        args![row_id, component, stream_id],
        |r| Ok((r.int(0)?, r.text(1)?, r.text(2)?, r.int(3)?)),
    )?
    else {
        return Ok(-1);
    };
    let base_bucket = super::keys::new_bucket_id();
    if bucket != 0 {
        conn.execute(
            "INSERT INTO processor_keys (bucket, key, value)
             SELECT ?1, key, value FROM processor_keys WHERE bucket = ?2",
            args![base_bucket, bucket],
        )?;
    }
    conn.execute(
        "DELETE FROM processor_keys WHERE bucket IN
             (SELECT bucket FROM processor_bases WHERE stream = ?1 AND component = ?2)",
        args![row_id, component],
    )?;
    conn.execute(
        "DELETE FROM processor_bases WHERE stream = ?1 AND component = ?2",
        args![row_id, component],
    )?;
    conn.execute(
        "INSERT INTO processor_bases (stream, component, stream_id, \"offset\", digest, state, bucket, chain)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        args![row_id, component, stream_id, offset, &digest, &state, base_bucket, chain],
    )?;
    Ok(offset)
}

/// Records the refold a deploy asked for (the newest wins), done when
/// every instance has switched (`RefoldDone`).
/// On PostgreSQL, tells the other hosts with the commit that component
/// `name` of `project` changed (a version, a refold's or shadow's record):
/// they forget their cached rows of it (`lease::listen`).
fn notify_deployed(conn: Db<'_>, project: &str, name: &str) -> Result<()> {
    if conn.dialect() == super::sql::Dialect::Postgres {
        conn.execute(
            "SELECT pg_notify(?1, ?2)",
            args![
                super::lease::DEPLOYED_CHANNEL,
                &super::lease::deployed_payload(project, name)
            ],
        )?;
    }
    Ok(())
}

fn record_refold(conn: Db<'_>, d: &Deployment) -> Result<()> {
    conn.execute(
        "INSERT INTO pending_refolds (project, name, digest, requested_at, replay_effects, shadow)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (project, name) DO UPDATE SET digest = excluded.digest,
             requested_at = excluded.requested_at, replay_effects = excluded.replay_effects,
             shadow = excluded.shadow",
        args![
            &d.project,
            &d.name,
            &d.digest,
            &d.deployed_at,
            i64::from(d.mode.replays_effects()),
            i64::from(d.mode.is_shadow())
        ],
    )?;
    Ok(())
}

fn upsert_cursors(conn: Db<'_>, row_id: i64, cursors: &[CursorRow]) -> Result<()> {
    for c in cursors {
        conn.execute(
            "INSERT INTO subscription_cursors (stream, subscription_key, generation, acknowledged_offset,
                                               failing_offset, failing_attempts, skips, attempts, last_error,
                                               measurements)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
             ON CONFLICT (stream, subscription_key)
             DO UPDATE SET generation = excluded.generation, acknowledged_offset = excluded.acknowledged_offset,
                 failing_offset = excluded.failing_offset, failing_attempts = excluded.failing_attempts,
                 skips = excluded.skips, attempts = excluded.attempts, last_error = excluded.last_error,
                 measurements = excluded.measurements",
            args![
                row_id,
                &c.subscription_key,
                c.generation as i64,
                c.acknowledged_offset as i64,
                c.failing_offset.map(|o| o as i64),
                c.failing_attempts,
                c.skips,
                c.attempts,
                c.last_error.as_deref(),
                c.measurements.as_deref()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CheckpointId, Storage};

    const SMALL: usize = 100;
    const LARGE: usize = LARGE_WRITE_BYTES + 1;

    /// Runs the writer's grouping over `bytes` queued at once (nothing
    /// more arriving): the groups it commits, in order, as indexes into
    /// `bytes`.
    fn groups(bytes: &[usize]) -> Vec<Vec<usize>> {
        let mut queued: Vec<(usize, usize)> = bytes.iter().copied().enumerate().collect();
        let (mut out, mut large_turn) = (Vec::new(), false);
        while !queued.is_empty() {
            let sizes: Vec<usize> = queued.iter().map(|q| q.1).collect();
            let group = next_group(&sizes, large_turn);
            large_turn = next_is_large_turn(&sizes, &group);
            out.push(group.iter().map(|&i| queued[i].0).collect());
            let mut i = 0;
            queued.retain(|_| {
                i += 1;
                !group.contains(&(i - 1))
            });
        }
        out
    }

    #[test]
    fn small_writes_commit_together_in_order() {
        assert_eq!(groups(&[SMALL; 5]), vec![vec![0, 1, 2, 3, 4]]);
    }

    #[test]
    fn a_large_write_commits_alone_after_the_small_writes_queued_beside_it() {
        assert_eq!(
            groups(&[LARGE, SMALL, SMALL, LARGE, SMALL]),
            vec![vec![1, 2, 4], vec![0], vec![3]]
        );
    }

    #[test]
    fn a_large_write_waits_for_one_group_at_most_while_small_writes_keep_coming() {
        // The large write passed once: the next group is it, whatever
        // small writes arrived meanwhile.
        assert_eq!(next_group(&[LARGE, SMALL, SMALL], true), vec![0]);
        assert!(next_is_large_turn(&[LARGE, SMALL], &[1]));
        assert!(!next_is_large_turn(&[LARGE, SMALL], &[0]));
        assert!(!next_is_large_turn(&[SMALL, SMALL], &[0, 1]));
    }

    #[test]
    fn small_writes_are_grouped_up_to_the_byte_bound_and_one_always_goes() {
        // The largest small write: 16 of them fill a group.
        let most = LARGE_WRITE_BYTES;
        assert_eq!(
            groups(&[most; 20]),
            vec![(0..16).collect::<Vec<_>>(), (16..20).collect()]
        );
        assert_eq!(next_group(&[LARGE], false), vec![0]);
        assert_eq!(next_group(&[LARGE, LARGE], false), vec![0]);
    }

    #[test]
    fn a_write_counts_its_events_state_and_component_bytes() {
        let existing = StreamRef::Existing {
            row_id: 1,
            expected_head: 0,
        };
        let mut round = round(existing, &[(1, &"x".repeat(1000))], 1);
        round.state_json = "y".repeat(10);
        let commit = WriteOp::Commit(round.clone());
        assert_eq!(op_bytes(&commit), 1010);
        // A body written in parts counts as the reference its row holds.
        round.staged = vec![(0, 7)];
        assert_eq!(
            op_bytes(&WriteOp::Commit(round)),
            "#parts:7:1000".len() + 10
        );
        assert_eq!(
            op_bytes(&checkpoint(None, 1, "d")),
            r#"{"through":1,"by":"d"}"#.len()
        );
    }

    fn checkpoint(previous: Option<CheckpointId>, offset: u64, digest: &str) -> WriteOp {
        WriteOp::Checkpoint(Checkpoint {
            row_id: 1,
            project: "p".into(),
            path: "/s".into(),
            component: "c".into(),
            stream_id: "s1".into(),
            previous_offset: previous,
            offset,
            state: format!("{{\"through\":{offset},\"by\":{digest:?}}}"),
            digest: digest.into(),
            effects: Vec::new(),
            bucket: 0,
            keys: Default::default(),
            drop_bucket: None,
            adopts_scratch: false,
            updated_at: "2026-12-01T00:00:00.000Z".into(),
            now_ms: 0,
            fence: None,
        })
    }

    /// A real SQLite storage in a temp dir (kept alive with it).
    fn sqlite() -> (tempfile::TempDir, Storage) {
        let dir = tempfile::tempdir().unwrap();
        let storage = open(dir.path());
        (dir, storage)
    }

    /// The SQLite storage of data dir `dir`.
    fn open(dir: &std::path::Path) -> Storage {
        Storage::open(
            dir,
            crate::Durability::Full,
            crate::Bounds::default(),
            std::sync::Arc::new(|_, _, _| {}),
        )
        .unwrap()
    }

    /// A statement whose `LIMIT ?` changes from call to call is not
    /// prepared again (the query planner's stability guarantee): SQLite
    /// otherwise plans it anew for each new limit.
    #[test]
    fn a_new_limit_does_not_prepare_a_statement_again() {
        let (_dir, storage) = sqlite();
        let sql = "SELECT id FROM effects WHERE status = 'pending' ORDER BY id LIMIT ?1";
        let reprepared = storage
            .with_reader(|db| {
                let crate::sql::Db::Sqlite(c) = db else {
                    unreachable!("a SQLite reader")
                };
                for limit in 1..=5 {
                    let mut stmt = c.prepare_cached(sql)?;
                    let mut rows = stmt.query([limit])?;
                    while rows.next()?.is_some() {}
                }
                Ok(c.prepare_cached(sql)?
                    .get_status(rusqlite::StatementStatus::RePrepare))
            })
            .unwrap();
        assert_eq!(reprepared, 0);
    }

    fn id(offset: u64, digest: &str) -> Option<CheckpointId> {
        Some(CheckpointId {
            stream_id: "s1".into(),
            offset,
            digest: digest.into(),
            bucket: 0,
        })
    }

    #[test]
    fn a_checkpoints_keys_commit_with_it_and_a_new_bucket_drops_the_old() {
        let (_dir, storage) = sqlite();
        let with_keys = |previous, offset, bucket: i64, keys: &[(&str, Option<&str>)], drop| {
            let WriteOp::Checkpoint(mut c) = checkpoint(previous, offset, "d") else {
                unreachable!()
            };
            c.bucket = bucket;
            c.drop_bucket = drop;
            c.keys = keys
                .iter()
                .map(|(k, v)| (k.to_string(), v.map(|v| v.as_bytes().to_vec())))
                .collect();
            storage.commit_blocking(WriteOp::Checkpoint(c))
        };
        let at = |offset, bucket| {
            Some(CheckpointId {
                bucket,
                ..id(offset, "d").unwrap()
            })
        };
        with_keys(None, 1, 7, &[("a", Some("1")), ("b", Some("2"))], None).unwrap();
        with_keys(at(1, 7), 2, 7, &[("a", Some("10")), ("b", None)], None).unwrap();
        assert_eq!(storage.key_value(7, "a").unwrap(), Some(b"10".to_vec()));
        assert_eq!(storage.key_value(7, "b").unwrap(), None);
        // A writer that started from another bucket changes nothing.
        let stale = with_keys(at(2, 8), 3, 8, &[("a", Some("stale"))], None);
        let stale = stale.unwrap_err();
        assert!(stale.message().contains("moved"), "{stale}");
        assert_eq!(stale.refusal(), Some(&super::Refusal::CheckpointMoved));
        assert_eq!(storage.key_value(8, "a").unwrap(), None);
        assert_eq!(storage.key_value(7, "a").unwrap(), Some(b"10".to_vec()));
        // A switch to a new bucket drops the old one's rows with it.
        with_keys(at(2, 7), 3, 9, &[("z", Some("new"))], Some(7)).unwrap();
        assert_eq!(storage.key_value(7, "a").unwrap(), None);
        assert_eq!(
            storage.keys_after(9, None, 10).unwrap(),
            vec!["z".to_string()]
        );
        assert_eq!(storage.checkpoint(1, "c").unwrap().unwrap().bucket, 9);
    }

    #[test]
    fn a_scratch_bucket_is_replaced_adopted_once_dropped_or_swept_and_counts_for_its_project() {
        use crate::{ScratchInstance, ScratchOp};
        let (_dir, storage) = sqlite();
        let scratch = |op: ScratchOp| storage.commit_blocking(WriteOp::Scratch(op));
        let instance = |digest: &str| ScratchInstance {
            project: "p".into(),
            path: "/s".into(),
            component: "c".into(),
            digest: digest.into(),
            purpose: "shadow".into(),
        };
        let keys = |k: &str, v: &str| {
            std::iter::once((k.to_string(), Some(v.as_bytes().to_vec())))
                .collect::<crate::KeyWrites>()
        };
        scratch(ScratchOp::Start {
            bucket: 11,
            instance: instance("d"),
            copy_from: None,
        })
        .unwrap();
        scratch(ScratchOp::Write {
            bucket: 11,
            keys: keys("a", "12345"),
        })
        .unwrap();
        assert_eq!(storage.key_value(11, "a").unwrap(), Some(b"12345".to_vec()));
        assert_eq!(storage.project_bytes().unwrap(), [("p".to_string(), 6)]);
        // A new fold of the instance replaces it: its rows go, and the old
        // fold's next spill is refused.
        scratch(ScratchOp::Start {
            bucket: 12,
            instance: instance("d"),
            copy_from: None,
        })
        .unwrap();
        assert_eq!(storage.key_value(11, "a").unwrap(), None);
        let refused = scratch(ScratchOp::Write {
            bucket: 11,
            keys: keys("b", "1"),
        })
        .unwrap_err();
        assert!(refused.message().contains("was dropped"), "{refused}");
        assert_eq!(storage.key_value(11, "b").unwrap(), None);
        // A checkpoint adopts it once, with the keys it spilled.
        scratch(ScratchOp::Write {
            bucket: 12,
            keys: keys("z", "9"),
        })
        .unwrap();
        let adopt = |previous: Option<CheckpointId>, offset| {
            let WriteOp::Checkpoint(mut c) = checkpoint(previous, offset, "d") else {
                unreachable!()
            };
            c.bucket = 12;
            c.adopts_scratch = true;
            storage.commit_blocking(WriteOp::Checkpoint(c))
        };
        adopt(None, 1).unwrap();
        assert_eq!(storage.checkpoint(1, "c").unwrap().unwrap().bucket, 12);
        assert_eq!(storage.key_value(12, "z").unwrap(), Some(b"9".to_vec()));
        let at_1 = Some(CheckpointId {
            bucket: 12,
            ..id(1, "d").unwrap()
        });
        let again = adopt(at_1, 2).unwrap_err();
        assert!(again.message().contains("was dropped"), "{again}");
        assert_eq!(
            storage
                .checkpoint(1, "c")
                .unwrap()
                .unwrap()
                .checkpoint_offset,
            1
        );
        // A dropped fold's rows go; so do those of a fold no pending
        // refold or shadow names, at the sweep.
        for (bucket, digest) in [(13, "d"), (14, "gone")] {
            let mut i = instance(digest);
            i.purpose = format!("verify/{bucket}");
            scratch(ScratchOp::Start {
                bucket,
                instance: i,
                copy_from: None,
            })
            .unwrap();
            scratch(ScratchOp::Write {
                bucket,
                keys: keys("k", "v"),
            })
            .unwrap();
        }
        assert_eq!(scratch(ScratchOp::Drop { bucket: 13 }).unwrap(), 1);
        assert_eq!(storage.key_value(13, "k").unwrap(), None);
        assert_eq!(scratch(ScratchOp::Sweep).unwrap(), 1);
        assert_eq!(storage.key_value(14, "k").unwrap(), None);
        assert_eq!(storage.project_bytes().unwrap(), []);
    }

    /// A round of stream `stream`: `events` (offset, body) after `head`.
    fn round(stream: StreamRef, events: &[(u64, &str)], head: u64) -> StreamCommit {
        StreamCommit {
            stream,
            events: events
                .iter()
                .map(|(offset, body)| StoredEvent {
                    offset: *offset,
                    event_type: "t".into(),
                    idempotency_key: None,
                    body: Arc::new(body.to_string()),
                })
                .collect(),
            head_offset: head,
            state_json: "{}".into(),
            state_offset: head,
            cursors: Vec::new(),
            removed_cursors: Vec::new(),
            fence: None,
            effects: Vec::new(),
            settled: None,
            redactions: Vec::new(),
            removed_through: None,
            staged: Vec::new(),
        }
    }

    fn new_stream(path: &str) -> StreamRef {
        StreamRef::New(NewStream {
            project: "p".into(),
            path: path.into(),
            stream_id: format!("{path}-1"),
            created_at: "t".into(),
        })
    }

    /// The WAL reaches the database file through the checkpointer, not
    /// through the writer's own checkpoint (which waits until the WAL
    /// holds `WRITER_CHECKPOINT_PAGES`): after 8 MB of commits the
    /// database file holds them soon, while the writer has not
    /// checkpointed.
    #[test]
    fn the_checkpointer_copies_the_wal_into_the_database_beside_the_writer() {
        let (dir, storage) = sqlite();
        let file = dir.path().join("streamhost.db");
        let size = || std::fs::metadata(&file).unwrap().len();
        let before = size();
        let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(200_000));
        let mut head = None;
        for offset in 1..=40u64 {
            let stream = match head {
                None => new_stream("/a"),
                Some(row_id) => StreamRef::Existing {
                    row_id,
                    expected_head: offset - 1,
                },
            };
            let row = storage
                .commit_blocking(WriteOp::Commit(round(stream, &[(offset, &body)], offset)))
                .unwrap();
            head.get_or_insert(row);
        }
        assert!(
            (40 * 200_000 / 4096) < crate::checkpointer::WRITER_CHECKPOINT_PAGES as usize,
            "the writer would checkpoint these commits itself"
        );
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while size() < before + 8_000_000 {
            assert!(
                Instant::now() < deadline,
                "the database file stayed at {} bytes after 8 MB of commits",
                size()
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_large_body_is_written_in_parts_while_small_commits_pass_and_reads_back_whole() {
        let (dir, storage) = sqlite();
        let count = |storage: &Storage, sql: &str| {
            storage
                .with_reader(|db| db.query_one(sql, args![], |r| r.int(0)))
                .unwrap()
        };
        // 8 MiB of two-byte characters: 33 parts.
        let big = format!("{{\"payload\":\"{}\"}}", "é".repeat(4 << 20));
        let (mut parts, mut from) = (0, 0);
        while from < big.len() {
            from += crate::parts::next_part(&big, from).len();
            parts += 1;
        }
        assert_eq!(parts, 33);
        let large = storage.submit(WriteOp::Commit(round(new_stream("/a"), &[(1, &big)], 1)));
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while count(&storage, "SELECT count(*) FROM event_parts") == 0 {
            assert!(
                Instant::now() < deadline,
                "no part of the large body was written"
            );
            std::thread::yield_now();
        }
        // A small commit submitted while the large body is written commits
        // before it (it waits for one part at most): its stream's row is
        // made first.
        storage
            .commit_blocking(WriteOp::Commit(round(new_stream("/b"), &[(1, "{}")], 1)))
            .unwrap();
        let a = large.blocking_recv().unwrap().unwrap();
        let b = storage.load_stream("p", "/b").unwrap().unwrap().row_id;
        assert!(
            b < a,
            "the small commit (row {b}) came after the large one (row {a})"
        );
        assert_eq!(count(&storage, "SELECT count(*) FROM event_parts"), parts);
        assert_eq!(
            count(
                &storage,
                "SELECT count(*) FROM events WHERE body LIKE '#parts:%'"
            ),
            1
        );
        // The stream counts the body's bytes, not its row's.
        let stored = |storage: &Storage| storage.project_bytes().unwrap()[0].1;
        assert_eq!(stored(&storage), (1 + big.len() + 1 + 2) as u64);
        // Read back whole, from storage (a new process: nothing cached),
        // and a body no commit took is gone at open.
        drop(storage);
        let storage = open(dir.path());
        rusqlite::Connection::open(dir.path().join("streamhost.db"))
            .unwrap()
            .execute_batch(
                "INSERT INTO event_bodies (id, committed) VALUES (5, 0);
                 INSERT INTO event_parts (body, seq, part) VALUES (5, 0, 'left');",
            )
            .unwrap();
        let read = storage.events_within(a, 0, 10, 10, usize::MAX).unwrap();
        assert_eq!(read.len(), 1);
        assert!(
            read[0].1 == big,
            "the body read back is not the one appended"
        );
        drop(storage);
        let storage = open(dir.path());
        assert_eq!(
            count(&storage, "SELECT count(*) FROM event_parts WHERE body = 5"),
            0
        );
        assert_eq!(count(&storage, "SELECT count(*) FROM event_parts"), parts);
        // A redaction rewrites it: its parts go, the bytes follow.
        let existing = |head| StreamRef::Existing {
            row_id: a,
            expected_head: head,
        };
        let mut redaction = round(existing(1), &[(2, "{}")], 2);
        redaction.redactions = round(existing(1), &[(1, "{\"redacted\":true}")], 1).events;
        storage.commit_blocking(WriteOp::Commit(redaction)).unwrap();
        assert_eq!(count(&storage, "SELECT count(*) FROM event_parts"), 0);
        assert_eq!(count(&storage, "SELECT count(*) FROM event_bodies"), 0);
        assert_eq!(stored(&storage), (1 + 17 + 1 + 2 + 1 + 2) as u64);
        // Retention removes a large event with its parts and its bytes.
        storage
            .commit_blocking(WriteOp::Commit(round(existing(2), &[(3, &big)], 3)))
            .unwrap();
        assert_eq!(count(&storage, "SELECT count(*) FROM event_parts"), parts);
        let mut removal = round(existing(3), &[(4, "{}")], 4);
        removal.removed_through = Some(3);
        storage.commit_blocking(WriteOp::Commit(removal)).unwrap();
        assert_eq!(count(&storage, "SELECT count(*) FROM event_parts"), 0);
        assert_eq!(count(&storage, "SELECT count(*) FROM event_bodies"), 0);
        assert_eq!(stored(&storage), (1 + 2 + 1 + 2) as u64);
    }

    /// Effects `keys` of consumer `c` on `/s` in project `p`, each with
    /// `target`, stored at 1,000 ms.
    fn insert_effects(keys: &[&str], target: &str) -> crate::EffectOp {
        crate::EffectOp::Insert {
            source: crate::EffectSource {
                project: "p".into(),
                path: "/s".into(),
                stream_id: "s1".into(),
                component: "c".into(),
            },
            effects: keys
                .iter()
                .map(|key| crate::NewEffect {
                    key: key.to_string(),
                    target: target.into(),
                    checkpoint_offset: 3,
                    ..crate::NewEffect::default()
                })
                .collect(),
            now_ms: 1_000,
            created_at: "2026-12-01T00:00:00.000Z".into(),
        }
    }

    /// Leases effect `id` (of project "p") as an executor that read it
    /// with `attempts` would (its lease id as stored now): answers the new
    /// lease id, or 0 when it was not leased.
    fn lease_one(storage: &Storage, id: i64, attempts: u32, now_ms: i64, until_ms: i64) -> i64 {
        let row = storage.effect("p", id).unwrap().unwrap();
        let leased = storage
            .commit_blocking(WriteOp::Effect(crate::EffectOp::Lease {
                effects: vec![crate::Leasing {
                    id,
                    attempts,
                    lease_id: row.lease_id,
                }],
                now_ms,
                lease_until_ms: until_ms,
            }))
            .unwrap();
        if leased == 1 {
            row.lease_id + 1
        } else {
            0
        }
    }

    #[test]
    fn effects_read_together_are_leased_in_one_write_each_only_as_it_was_read() {
        use crate::{EffectOp, Leasing};
        let (_dir, storage) = sqlite();
        let effect = |op: EffectOp| storage.commit_blocking(WriteOp::Effect(op)).unwrap();
        effect(insert_effects(&["a", "b", "c", "d"], "{\"webhook\": {}}"));
        let due = storage.due_effects(1_000, 10, &[], &[]).unwrap();
        let id = |key: &str| due.iter().find(|r| r.key == key).unwrap().id;
        // Since the read: c was cancelled, d leased by someone else.
        effect(EffectOp::Cancel {
            id: id("c"),
            settled_at: "2026-12-01T00:00:00.500Z".into(),
        });
        assert!(lease_one(&storage, id("d"), 0, 1_000, 5_000) > 0);
        let lease = |now_ms: i64| {
            effect(EffectOp::Lease {
                effects: due.iter().map(Leasing::of).collect(),
                now_ms,
                lease_until_ms: now_ms + 1_000,
            })
        };
        assert_eq!(lease(1_000), 2, "a and b leased, c and d moved since");
        for key in ["a", "b"] {
            let row = storage.effect("p", id(key)).unwrap().unwrap();
            let read = due.iter().find(|r| r.key == key).unwrap();
            assert_eq!(
                (
                    row.status.as_str(),
                    row.attempts,
                    row.lease_id,
                    row.due_at_ms
                ),
                ("running", 1, read.lease_id + 1, 2_000)
            );
        }
        let d = storage.effect("p", id("d")).unwrap().unwrap();
        assert_eq!(
            (d.attempts, d.due_at_ms),
            (1, 5_000),
            "d keeps its own lease"
        );
        // The same read again, after its leases ran out: nothing is as read.
        assert_eq!(lease(9_000), 0);
    }

    #[test]
    fn a_stale_executor_never_settles_a_later_lease_even_after_a_retry() {
        use crate::EffectOp;
        let (_dir, storage) = sqlite();
        let effect = |op: EffectOp| storage.commit_blocking(WriteOp::Effect(op)).unwrap();
        let inserted = effect(insert_effects(&["k"], "{\"webhook\": {}}"));
        assert_eq!(inserted, 1);
        let id = storage.due_effects(1_000, 10, &[], &[]).unwrap()[0].id;
        let lease =
            |attempts: u32, now_ms: i64| lease_one(&storage, id, attempts, now_ms, now_ms + 100);
        let settle = |lease_id: i64, status: &'static str| {
            effect(EffectOp::Settle {
                id,
                lease_id,
                now_ms: 5_000,
                status,
                due_at_ms: 5_000,
                last_error: Some("no".into()),
                result: None,
                settled_at: Some("2026-12-01T00:00:05.000Z".into()),
            })
        };
        // Executor 1 leases and hangs; its lease runs out, executor 2 runs
        // it and it fails for good; a caller retries it (attempts back to
        // 0) and executor 3 leases it: attempts 1 again, as executor 1 had.
        let first = lease(0, 1_000);
        assert!(first > 0);
        let second = lease(1, 1_200);
        assert!(second > first);
        assert_eq!(settle(second, "failed"), 1);
        assert_eq!(effect(EffectOp::Retry { id, now_ms: 3_000 }), 1);
        let third = lease(0, 3_000);
        assert!(third > second);
        // Executor 1 wakes up: its settlement names a lease long gone.
        assert_eq!(settle(first, "succeeded"), 0, "a stale lease settled");
        let row = storage.effect("p", id).unwrap().unwrap();
        assert_eq!((row.status.as_str(), row.lease_id), ("running", third));
        assert_eq!(settle(third, "succeeded"), 1);
    }

    #[test]
    fn an_append_effect_settles_in_the_round_that_stores_its_event_only_while_running() {
        use crate::{AppendSettled, EffectOp};
        let (_dir, storage) = sqlite();
        let effect = |op: EffectOp| storage.commit_blocking(WriteOp::Effect(op)).unwrap();
        let inserted = effect(insert_effects(&["running", "pending"], "{\"append\": {}}"));
        assert_eq!(inserted, 2);
        let due = storage.due_effects(1_000, 10, &[], &[]).unwrap();
        let id = |key: &str| due.iter().find(|r| r.key == key).unwrap().id;
        let (running, pending) = (id("running"), id("pending"));
        let lease = lease_one(&storage, running, 0, 1_000, 2_000);
        assert!(lease > 0);
        // A round storing both effects' events (the second is not running:
        // not this round's to settle).
        let mut commit = round(new_stream("/out"), &[(1, "{}"), (2, "{}")], 2);
        commit.settled = Some(AppendSettled {
            ids: vec![running, pending],
            now_ms: 1_500,
            settled_at: "2026-12-01T00:00:01.500Z".into(),
        });
        storage.commit_blocking(WriteOp::Commit(commit)).unwrap();
        let row = storage.effect("p", running).unwrap().unwrap();
        assert_eq!(row.status, "succeeded");
        assert_eq!(row.settled_at.as_deref(), Some("2026-12-01T00:00:01.500Z"));
        assert_eq!((row.last_error, row.result), (None, None));
        let row = storage.effect("p", pending).unwrap().unwrap();
        assert_eq!((row.status.as_str(), row.settled_at), ("pending", None));
        // Its executor's own settlement finds nothing left to settle.
        let settle = effect(EffectOp::Settle {
            id: running,
            lease_id: lease,
            now_ms: 1_600,
            status: "succeeded",
            due_at_ms: 1_600,
            last_error: None,
            result: None,
            settled_at: Some("2026-12-01T00:00:01.600Z".into()),
        });
        assert_eq!(settle, 0);
    }

    #[test]
    fn an_effect_of_a_group_is_due_only_after_every_earlier_one_of_its_group_settles() {
        use crate::{EffectOp, EffectSource, NewEffect};
        let (_dir, storage) = sqlite();
        let effect = |op: EffectOp| storage.commit_blocking(WriteOp::Effect(op)).unwrap();
        let new = |key: &str, group: Option<&str>, not_before_ms: Option<i64>| NewEffect {
            key: key.into(),
            target: "{\"webhook\": {}}".into(),
            checkpoint_offset: 3,
            not_before_ms,
            group: group.map(str::to_string),
            ..NewEffect::default()
        };
        effect(EffectOp::Insert {
            source: EffectSource {
                project: "p".into(),
                path: "/s".into(),
                stream_id: "s1".into(),
                component: "c".into(),
            },
            // The head of "g" is delayed: what follows it in "g" waits for
            // it, though due; "h" and the effect without a group do not.
            effects: vec![
                new("g1", Some("g"), Some(9_000)),
                new("g2", Some("g"), None),
                new("h1", Some("h"), None),
                new("free", None, None),
            ],
            now_ms: 1_000,
            created_at: "2026-12-01T00:00:00.000Z".into(),
        });
        let due = |now_ms: i64| -> Vec<String> {
            let rows = storage.due_effects(now_ms, 10, &[], &[]).unwrap();
            rows.into_iter().map(|r| r.key).collect()
        };
        assert_eq!(due(1_000), ["h1", "free"]);
        assert_eq!(storage.next_effect_due().unwrap(), Some(1_000));
        let row = |key: &str| storage.effect_by_key("p", "/s", "c", key).unwrap().unwrap();
        for key in ["h1", "free"] {
            effect(EffectOp::Cancel {
                id: row(key).id,
                settled_at: "2026-12-01T00:00:01.000Z".into(),
            });
        }
        // Nothing due until the head's time: not g2's.
        assert!(due(1_000).is_empty());
        assert_eq!(storage.next_effect_due().unwrap(), Some(9_000));
        assert_eq!(due(9_000), ["g1"]);
        // A failed head holds its group; a retry runs it first again.
        let g1 = row("g1").id;
        let lease = lease_one(&storage, g1, 0, 9_000, 9_100);
        effect(EffectOp::Settle {
            id: g1,
            lease_id: lease,
            now_ms: 9_000,
            status: "failed",
            due_at_ms: 9_000,
            last_error: Some("no".into()),
            result: None,
            settled_at: Some("2026-12-01T00:00:09.000Z".into()),
        });
        assert!(due(10_000).is_empty());
        assert_eq!(storage.next_effect_due().unwrap(), None);
        effect(EffectOp::Retry {
            id: g1,
            now_ms: 10_000,
        });
        assert_eq!(due(10_000), ["g1"]);
        effect(EffectOp::Cancel {
            id: g1,
            settled_at: "2026-12-01T00:00:10.000Z".into(),
        });
        assert_eq!(due(10_000), ["g2"]);
    }

    #[test]
    fn a_checkpoint_replaces_exactly_the_row_it_started_from() {
        let (_dir, storage) = sqlite();
        storage.commit_blocking(checkpoint(None, 5, "v1")).unwrap();
        // A second first checkpoint (another writer read "none" too) fails.
        let again = storage.commit_blocking(checkpoint(None, 6, "v1"));
        assert!(again.unwrap_err().message().contains("moved"));
        // Two wakes from offset 5: the first wins, the second fails.
        storage
            .commit_blocking(checkpoint(id(5, "v1"), 8, "v1"))
            .unwrap();
        let stale = storage.commit_blocking(checkpoint(id(5, "v1"), 9, "v1"));
        assert!(stale.unwrap_err().message().contains("moved"));
        // A refold's switch keeps the offset and changes the version: a
        // wake that read the row before the switch cannot overwrite it.
        storage
            .commit_blocking(checkpoint(id(8, "v1"), 8, "v2"))
            .unwrap();
        let old_version = storage.commit_blocking(checkpoint(id(8, "v1"), 10, "v1"));
        assert!(old_version.unwrap_err().message().contains("moved"));
        let row = storage.checkpoint(1, "c").unwrap().unwrap();
        assert_eq!((row.checkpoint_offset, row.digest.as_str()), (8, "v2"));
        assert!(row.state.contains("v2"), "{}", row.state);
        storage
            .commit_blocking(checkpoint(id(8, "v2"), 10, "v2"))
            .unwrap();
        assert_eq!(
            storage
                .checkpoint(1, "c")
                .unwrap()
                .unwrap()
                .checkpoint_offset,
            10
        );
    }
}
