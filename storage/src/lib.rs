//! Storage: one SQLite database per data directory (WAL). All SQL lives here.
//!
//! Writes go through one writer thread that coalesces the commits of all
//! streams into one transaction (group commit, see `writer.rs`); reads use a
//! small pool of read connections, which WAL lets run beside the writer.
//!
//! **Architecture Invariant:** a write is answered only after the transaction
//! that holds it has committed (and, with `durability = "full"`, been fsync'd).

mod backup;
mod checkpointer;
mod effects;
pub mod faults;
mod hot;
mod ingest;
mod keys;
mod lease;
#[cfg(test)]
mod lease_sim;
pub mod parts;
mod schema;
pub mod sql;
mod tls;
mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use rusqlite::{Connection, OpenFlags};
use serde::Deserialize;

use sql::{args, Db, PgConn, Row};

pub use backup::{
    backup_failed_full, check_backup, partial_path, remove_dead_partials, sync_dir_of,
    BackupSummary, BackupUnavailable,
};
pub use effects::{
    AppendSettled, DestinationRoom, EffectInsert, EffectOp, EffectQuery, EffectRow, EffectSource,
    Leasing, NewEffect,
};

/// How hard a commit is pushed to disk before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// `synchronous=FULL`: fsync before every acknowledgement.
    #[default]
    Full,
    /// `synchronous=NORMAL`: WAL is fsync'd at checkpoints only; a power loss
    /// may lose the last acknowledged commits (a process crash does not).
    Normal,
}

/// The default of `[limits] max-read-bytes` (4 MiB).
pub const READ_BYTES_MAX_DEFAULT: usize = 4 * 1024 * 1024;
/// The default of `[processors] keyed-cache-bytes` (256 MiB).
pub const KEY_CACHE_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// The default of `[processors] max-versions-per-component`.
pub const VERSIONS_KEPT_DEFAULT: usize = 50;

/// A URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// What the writer tells of each commit (the host counts it in its
/// metrics): how long it took, its writes and its events.
pub type CommitObserver = Arc<dyn Fn(std::time::Duration, usize, usize) + Send + Sync>;

/// What a host's configuration bounds in its storage (each host its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The bytes of committed key values the key cache holds
    /// (`[processors] keyed-cache-bytes`).
    pub key_cache_bytes: u64,
    /// The bytes one read of events or keys holds at most (`[limits]
    /// max-read-bytes`): a page, a replay page, a delivery or copy scan;
    /// at least one event or key is read, however large.
    pub read_bytes_max: usize,
    /// How many versions of a component a deploy keeps, the newest
    /// (`[processors] max-versions-per-component`).
    pub versions_kept: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            key_cache_bytes: KEY_CACHE_BYTES_DEFAULT,
            read_bytes_max: READ_BYTES_MAX_DEFAULT,
            versions_kept: VERSIONS_KEPT_DEFAULT,
        }
    }
}
pub use ingest::{
    share_of, DroppedEvent, FenceIdentity, IngestOp, NewParked, NewPending, ParkedRow, PendingRow,
    SharedBound, DIAGNOSTICS_KEPT,
};
pub use keys::{
    read_offline, tag as key_tag, ScratchInstance, ScratchOp, StoredBucket, Writes as KeyWrites,
};
pub use lease::{tenure_clock_ms, Fence, HostIdentity, LeaseLost, OwnedElsewhere};
pub use writer::{
    Checkpoint, CommitError, CursorRow, Deployment, NewStream, ProcessorFailure, Refusal,
    SecretChange, StoredEvent, StreamCommit, StreamRef, WriteOp,
};
pub use {ingest::FenceRow, keys::OfflineInstance, lease::ClusterHost};

fn checkpoint_in(db: Db<'_>, row_id: i64, component: &str) -> Result<Option<CheckpointRow>> {
    db.query_opt(
        "SELECT stream_id, checkpoint_offset, state, digest, updated_at, bucket
         FROM processor_checkpoints WHERE stream = ?1 AND component = ?2",
        args![row_id, component],
        |r| {
            Ok(CheckpointRow {
                stream_id: r.text(0)?,
                checkpoint_offset: r.int(1)? as u64,
                state: r.text(2)?,
                digest: r.text(3)?,
                updated_at: r.text(4)?,
                bucket: r.int(5)?,
            })
        },
    )
}

/// A deployed component.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentRow {
    pub name: String,
    pub digest: String,
    pub exports: Vec<String>,
    pub deployed_at: String,
}

/// A processor instance's checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointRow {
    pub stream_id: String,
    pub checkpoint_offset: u64,
    pub state: String,
    pub digest: String,
    pub updated_at: String,
    /// Its keyed state's bucket (`storage/keys.rs`).
    pub bucket: i64,
}

/// A processor instance's base (retention): its state and keys at
/// `offset`, kept before events it folded were removed.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseRow {
    pub stream_id: String,
    pub offset: u64,
    /// The version whose checkpoint it was.
    pub digest: String,
    pub state: String,
    /// Its keyed state's bucket, its own.
    pub bucket: i64,
    /// The stream's removal digest it was kept for.
    pub chain: String,
}

/// Which checkpoint a write replaces: the instance's source lifetime, its
/// offset and the version that wrote it (a refold's switch keeps the
/// offset and changes the version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointId {
    pub stream_id: String,
    pub offset: u64,
    pub digest: String,
    pub bucket: i64,
}

impl CheckpointRow {
    /// What a write that replaces this row names.
    pub fn id(&self) -> CheckpointId {
        CheckpointId {
            stream_id: self.stream_id.clone(),
            offset: self.checkpoint_offset,
            digest: self.digest.clone(),
            bucket: self.bucket,
        }
    }
}

/// A stream's row as loaded at startup of its actor.
#[derive(Debug, Clone)]
pub struct StreamRow {
    pub row_id: i64,
    pub path: String,
    pub stream_id: String,
    pub created_at: String,
    pub head_offset: u64,
    pub state_json: String,
    pub state_offset: u64,
    /// The highest committed offset in the log.
    pub log_head: u64,
}

/// What [`Storage::needing_attention`] found.
#[derive(Debug, Clone, Default)]
pub struct NeedingAttention {
    /// `(project, path, state_json)` of streams with a halted subscription.
    pub halted: Vec<(String, String, String)>,
    /// Failing runs.
    pub failing: Vec<FailingRun>,
}

/// A delivery run that has failed and is retrying (its cursor row).
#[derive(Debug, Clone)]
pub struct FailingRun {
    pub project: String,
    pub path: String,
    pub subscription_key: String,
    pub attempts: u64,
    pub last_error: Option<String>,
}

/// Handle to the database: the group-commit writer and the read pool.
#[derive(Clone)]
pub struct Storage {
    inner: Arc<Inner>,
}

struct Inner {
    writer: writer::WriterHandle,
    readers: Readers,
    /// This host among several on one database (PostgreSQL only).
    cluster: Option<HostIdentity>,
    /// Set once this host gave its leases up (it is stopping); held while
    /// a renewal runs, so none lands after the release.
    stopping: Mutex<bool>,
    /// Until when this host may serve its streams (several hosts).
    tenure: lease::Tenure,
    /// Which host owns streams this one does not (several hosts).
    owners: lease::Owners,
    /// Newest events, checkpoints and component rows, kept true by the
    /// writer (`hot.rs`).
    hot: Arc<hot::Hot>,
    /// What this host's configuration bounds.
    bounds: Bounds,
    /// `<data-dir>/streamhost.lock`, locked exclusively while this storage
    /// lives: one host per data dir (released by the OS when the process dies).
    _lock: std::fs::File,
}

/// Where reads go: a pool of read connections of the engine.
enum Readers {
    Sqlite {
        db_path: PathBuf,
        pool: Mutex<Vec<Connection>>,
    },
    Postgres {
        target: sql::PgTarget,
        pool: Mutex<Vec<PgConn>>,
    },
}

/// Read connections kept for reuse.
const READERS_KEPT_MAX: usize = 16;

/// A read connection of either engine.
enum ReadConn {
    Sqlite(Connection),
    Postgres(Box<PgConn>),
}

impl ReadConn {
    fn db(&self) -> Db<'_> {
        match self {
            ReadConn::Sqlite(c) => Db::Sqlite(c),
            ReadConn::Postgres(c) => Db::Postgres(c),
        }
    }
}

/// A read transaction ([`Storage::read_transaction`]); ends when dropped.
pub struct ReadTransaction {
    storage: Storage,
    conn: Option<ReadConn>,
}

impl ReadTransaction {
    /// Runs `f` inside the transaction.
    pub fn with<T>(&self, f: impl FnOnce(Db<'_>) -> Result<T>) -> Result<T> {
        f(self.conn.as_ref().expect("held until dropped").db())
    }
}

impl Drop for ReadTransaction {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // A connection whose transaction does not end is not reused.
            if conn.db().batch("COMMIT").is_ok() {
                self.storage.put_reader(conn);
            }
        }
    }
}
/// Prepared statements kept per connection: more than storage has, so none
/// is parsed again (rusqlite keeps 16 by default; the writer alone uses ~50).
const STATEMENTS_CACHED: usize = 128;

/// Has `conn` keep its prepared statements ([`STATEMENTS_CACHED`]) and plan
/// them without looking at their bound values (the query planner's
/// stability guarantee): otherwise SQLite prepares a statement again
/// whenever a parameter it planned with changes, which a `LIMIT ?` does on
/// nearly every call (a page of events, the outbox's due effects). No
/// plan here depends on a bound value (no `LIKE ?`).
fn keep_statements(conn: &Connection) -> Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENTS_CACHED);
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .context("enabling the query planner's stability guarantee")?;
    Ok(())
}

impl Storage {
    /// Opens (creating if needed) `streamhost.db` in `data_dir` and starts the
    /// writer thread.
    pub fn open(
        data_dir: &Path,
        durability: Durability,
        bounds: Bounds,
        observe: CommitObserver,
    ) -> Result<Storage> {
        let lock = lock_data_dir(data_dir)?;
        let db_path = data_dir.join("streamhost.db");
        let conn = Connection::open(&db_path)
            .with_context(|| format!("opening database {}", db_path.display()))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .context("enabling WAL")?;
        let sync = match durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)
            .context("setting synchronous")?;
        // The checkpointer copies the WAL beside the writer; the writer's
        // own checkpoint is its backstop, and a WAL a burst grew is cut
        // back when it starts over.
        conn.pragma_update(
            None,
            "wal_autocheckpoint",
            checkpointer::WRITER_CHECKPOINT_PAGES,
        )
        .context("setting wal_autocheckpoint")?;
        conn.pragma_update(None, "journal_size_limit", checkpointer::WAL_KEPT_BYTES)
            .context("setting journal_size_limit")?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        keep_statements(&conn)?;
        schema::migrate(&conn)
            .with_context(|| format!("migrating the schema of {}", db_path.display()))?;
        // (The data dir is locked: no other process writes parts.)
        parts::drop_all_uncommitted(&conn)?;
        Self::start(
            writer::WriteConn::Sqlite(conn),
            Readers::Sqlite {
                db_path,
                pool: Mutex::new(Vec::new()),
            },
            lock,
            bounds,
            observe,
        )
    }

    /// Writes a consistent copy of the database to `to` (which must not
    /// exist) while writes go on, and answers what it holds; a failed
    /// backup leaves nothing at `to`. On PostgreSQL: [`BackupUnavailable`].
    pub fn backup_into(&self, to: &Path) -> Result<BackupSummary> {
        match &self.inner.readers {
            Readers::Sqlite { db_path, .. } => backup::vacuum_into(db_path, to),
            Readers::Postgres { .. } => Err(BackupUnavailable.into()),
        }
    }

    /// Opens the PostgreSQL database at `url` (creating the schema in an
    /// empty one) and starts the writer thread; `data_dir` keeps the
    /// compiled components. Every commit is durable as PostgreSQL makes it
    /// (its `synchronous_commit`).
    ///
    /// Several hosts may share the database: `advertise_url` is where the
    /// others reach this one, and the data dir keeps its host id (so a
    /// restarted host takes its streams back at once). Every database call
    /// is bounded by `db_timeout_ms` ([`sql::PgTarget`]).
    pub fn open_postgres(
        url: &str,
        data_dir: &Path,
        advertise_url: &str,
        lease_ms: u64,
        db_timeout_ms: u64,
        bounds: Bounds,
        observe: CommitObserver,
    ) -> Result<Storage> {
        let lock = lock_data_dir(data_dir)?;
        let target = sql::PgTarget::new(url, db_timeout_ms)?;
        let conn = PgConn::connect(&target)?;
        schema::migrate_postgres(Db::Postgres(&conn))
            .with_context(|| format!("migrating the schema of {}", sql::redact(url)))?;
        let identity = HostIdentity {
            id: host_id(data_dir)?,
            url: advertise_url.to_string(),
            lease_ms: lease_ms as i64,
            secret: lease::secret(Db::Postgres(&conn)).context("reading the cluster secret")?,
        };
        let mut storage = Self::start(
            writer::WriteConn::Postgres(Box::new(conn), target.clone()),
            Readers::Postgres {
                target,
                pool: Mutex::new(Vec::new()),
            },
            lock,
            bounds,
            observe,
        )?;
        Arc::get_mut(&mut storage.inner)
            .expect("a new storage has one handle")
            .cluster = Some(identity);
        storage.heartbeat().context("registering this host")?;
        Ok(storage)
    }

    /// Where PostgreSQL connections go, when storage is PostgreSQL.
    fn postgres_target(&self) -> Option<&sql::PgTarget> {
        match &self.inner.readers {
            Readers::Postgres { target, .. } => Some(target),
            Readers::Sqlite { .. } => None,
        }
    }

    /// Whether this host gave its leases up (held while renewing).
    fn stopping(&self) -> std::sync::MutexGuard<'_, bool> {
        self.inner
            .stopping
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn start(
        conn: writer::WriteConn,
        readers: Readers,
        lock: std::fs::File,
        bounds: Bounds,
        observe: CommitObserver,
    ) -> Result<Storage> {
        let bounds = Bounds {
            read_bytes_max: bounds.read_bytes_max.max(1),
            versions_kept: bounds.versions_kept.max(1),
            ..bounds
        };
        let hot = Arc::new(hot::Hot::new(bounds.key_cache_bytes));
        let writer = writer::WriterHandle::start(conn, observe, hot.clone())?;
        Ok(Storage {
            inner: Arc::new(Inner {
                writer,
                readers,
                cluster: None,
                stopping: Mutex::new(false),
                tenure: lease::Tenure::default(),
                owners: lease::Owners::default(),
                hot,
                bounds,
                _lock: lock,
            }),
        })
    }

    /// What this host's configuration bounds in its storage.
    pub fn bounds(&self) -> &Bounds {
        &self.inner.bounds
    }

    /// Queues a write for the next group commit; the answer arrives after the
    /// transaction that holds it has committed.
    pub fn submit(&self, op: WriteOp) -> tokio::sync::oneshot::Receiver<Result<i64, CommitError>> {
        self.inner.writer.submit(op)
    }

    /// Why this host cannot write now: its writer thread stopped, or its
    /// last transaction failed as a whole (`None`: it can write).
    pub fn unable_to_write(&self) -> Option<String> {
        self.inner.writer.unable_to_write()
    }

    /// Commits a write from a blocking thread (never an async worker): on
    /// this thread when the writer is idle, else in the writer's next group;
    /// answers after the commit, like [`Storage::submit`].
    pub fn commit_blocking(&self, op: WriteOp) -> Result<i64, CommitError> {
        self.inner.writer.commit_blocking(op)
    }

    /// Bytes of heap SQLite holds in this process, over all connections.
    pub fn memory_used() -> i64 {
        // SAFETY: sqlite3_memory_used only reads SQLite's global counter.
        unsafe { rusqlite::ffi::sqlite3_memory_used() }
    }

    fn with_reader<T>(&self, f: impl FnOnce(Db<'_>) -> Result<T>) -> Result<T> {
        let conn = self.take_reader()?;
        let out = f(conn.db());
        self.put_reader(conn);
        out
    }

    /// A read connection from the pool (or a new one).
    fn take_reader(&self) -> Result<ReadConn> {
        match &self.inner.readers {
            Readers::Sqlite { db_path, pool } => {
                let conn = pool.lock().expect("reader pool").pop();
                Ok(ReadConn::Sqlite(match conn {
                    Some(c) => c,
                    None => {
                        let c = Connection::open_with_flags(
                            db_path,
                            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                        )
                        .with_context(|| format!("opening reader on {}", db_path.display()))?;
                        c.busy_timeout(std::time::Duration::from_secs(10))?;
                        keep_statements(&c)?;
                        c
                    }
                }))
            }
            Readers::Postgres { target, pool } => {
                let conn = pool.lock().expect("reader pool").pop();
                Ok(ReadConn::Postgres(Box::new(match conn {
                    Some(c) => c,
                    None => PgConn::connect(target)?,
                })))
            }
        }
    }

    /// Gives a read connection back to the pool.
    fn put_reader(&self, conn: ReadConn) {
        match (&self.inner.readers, conn) {
            (Readers::Sqlite { pool, .. }, ReadConn::Sqlite(c)) => {
                let mut pool = pool.lock().expect("reader pool");
                if pool.len() < READERS_KEPT_MAX {
                    pool.push(c);
                }
            }
            (Readers::Postgres { pool, .. }, ReadConn::Postgres(c)) => {
                let mut pool = pool.lock().expect("reader pool");
                // A connection the server closed is not kept.
                if pool.len() < READERS_KEPT_MAX && !c.is_closed() {
                    pool.push(*c);
                }
            }
            _ => {}
        }
    }

    /// A read transaction held until the answer is dropped: reads through
    /// it see one snapshot and pay for their locks once (a wake's reads of
    /// its keyed state).
    pub fn read_transaction(&self) -> Result<ReadTransaction> {
        let conn = self.take_reader()?;
        conn.db().batch(match &conn {
            ReadConn::Sqlite(_) => "BEGIN",
            ReadConn::Postgres(_) => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
        })?;
        Ok(ReadTransaction {
            storage: self.clone(),
            conn: Some(conn),
        })
    }

    /// Loads a stream's row, or `None` when the stream does not exist.
    pub fn load_stream(&self, project: &str, path: &str) -> Result<Option<StreamRow>> {
        self.with_reader(|db| {
            let row = db
                .query_opt(
                    &format!(
                        "SELECT {STREAM_COLUMNS} FROM streams WHERE project = ?1 AND path = ?2"
                    ),
                    args![project, path],
                    stream_row,
                )
                .with_context(|| format!("loading stream {path:?} of {project:?}"))?;
            let Some(mut row) = row else { return Ok(None) };
            row.log_head = db.query_one(
                "SELECT COALESCE(MAX(\"offset\"), 0) FROM events WHERE stream = ?1",
                args![row.row_id],
                |r| r.int(0),
            )? as u64;
            Ok(Some(row))
        })
    }

    /// Streams of a namespace (`project` key) whose path starts with
    /// `prefix`, after `after_path`, in path order, at most `limit`.
    pub fn list_streams(
        &self,
        project: &str,
        prefix: &str,
        after_path: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StreamRow>> {
        self.with_reader(|db| {
            db.query_all(
                &format!(
                    "SELECT {STREAM_COLUMNS} FROM streams
                     WHERE project = ?1 AND substr(path, 1, length(CAST(?2 AS TEXT))) = ?2 AND path > ?3
                     ORDER BY path LIMIT ?4"
                ),
                args![project, prefix, after_path.unwrap_or(""), limit as i64],
                stream_row,
            )
            .context("listing streams")
        })
    }

    /// Committed event bodies with offsets in `(after_offset, up_to_offset]`,
    /// at most `limit`, in order, and no more bytes of them than
    /// [`Bounds::read_bytes_max`] (at least one event: a page that reaches the
    /// bound ends with the event that reached it; the next page continues
    /// after it).
    pub fn events_after(
        &self,
        row_id: i64,
        after_offset: u64,
        limit: usize,
        up_to_offset: u64,
    ) -> Result<Vec<(u64, String)>> {
        self.events_within(
            row_id,
            after_offset,
            limit,
            up_to_offset,
            self.bounds().read_bytes_max,
        )
    }

    /// The offsets of a stream's events that are redacted, through
    /// `up_to_offset`, from its `event-redacted` lines (ascending).
    pub fn redacted_offsets(&self, row_id: i64, up_to_offset: u64) -> Result<Vec<u64>> {
        let bodies = self.with_reader(|db| {
            db.query_all(
                "SELECT body FROM events WHERE stream = ?1 AND type = ?2",
                sql::args![row_id, "events.iterate.com/stream/event-redacted"],
                |r| r.text(0),
            )
        })?;
        let mut offsets: Vec<u64> = bodies
            .iter()
            .filter_map(|b| serde_json::from_str::<serde_json::Value>(b).ok())
            .filter_map(|v| v.pointer("/payload/offset")?.as_u64())
            .filter(|o| *o <= up_to_offset)
            .collect();
        offsets.sort_unstable();
        offsets.dedup();
        Ok(offsets)
    }

    /// [`Storage::events_after`] with a byte bound of its own
    /// (`usize::MAX`: every event of the range).
    pub fn events_within(
        &self,
        row_id: i64,
        after_offset: u64,
        limit: usize,
        up_to_offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<(u64, String)>> {
        if let Some(events) =
            self.inner
                .hot
                .events_after(row_id, after_offset, limit, up_to_offset, max_bytes)
        {
            return Ok(events);
        }
        let (after, limit) = (after_offset as i64, limit as i64);
        let up_to = up_to_offset.min(i64::MAX as u64) as i64;
        let bound = max_bytes.min(i64::MAX as usize) as i64;
        self.with_reader(|db| match db.dialect() {
            // Rows are read one by one: stop at the bound.
            // (A body written in parts counts its parts' bytes, and is
            // put together in the same read transaction.)
            sql::Dialect::Sqlite => {
                let mut bytes = 0usize;
                let mut parted = false;
                db.batch("BEGIN")?;
                let read = db
                    .query_while(
                        "SELECT \"offset\", body FROM events
                         WHERE stream = ?1 AND \"offset\" > ?2 AND \"offset\" <= ?4
                         ORDER BY \"offset\" LIMIT ?3",
                        args![row_id, after, limit, up_to],
                        |r| {
                            if bytes >= max_bytes {
                                return Ok(None);
                            }
                            let body = r.text(1)?;
                            bytes += parts::body_bytes(&body);
                            parted |= body.starts_with('#');
                            Ok(Some((r.int(0)? as u64, body)))
                        },
                    )
                    .and_then(|rows| {
                        if !parted {
                            return Ok(rows);
                        }
                        rows.into_iter()
                            .map(|(o, body)| Ok((o, parts::expand(db, body)?)))
                            .collect()
                    });
                db.batch("COMMIT")?;
                read.context("reading events")
            }
            // The client takes the whole answer: the database cuts it.
            sql::Dialect::Postgres => db
                .query_all(
                    "SELECT \"offset\", body FROM (
                         SELECT \"offset\", body,
                                SUM(octet_length(body)) OVER (ORDER BY \"offset\")
                                    - octet_length(body) AS before
                         FROM events
                         WHERE stream = ?1 AND \"offset\" > ?2 AND \"offset\" <= ?4
                         ORDER BY \"offset\" LIMIT ?3
                     ) page
                     WHERE before < ?5
                     ORDER BY \"offset\"",
                    args![row_id, after, limit, up_to, bound],
                    |r| Ok((r.int(0)? as u64, r.text(1)?)),
                )
                .context("reading events"),
        })
    }

    /// The cursor rows of a stream.
    pub fn load_cursors(&self, row_id: i64) -> Result<Vec<CursorRow>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT subscription_key, generation, acknowledged_offset, failing_offset,
                        failing_attempts, skips, attempts, last_error, measurements
                 FROM subscription_cursors WHERE stream = ?1",
                args![row_id],
                |r| {
                    Ok(CursorRow {
                        subscription_key: r.text(0)?,
                        generation: r.int(1)? as u64,
                        acknowledged_offset: r.int(2)? as u64,
                        failing_offset: r.opt_int(3)?.map(|o| o as u64),
                        failing_attempts: r.int(4)? as u32,
                        skips: r.int(5)? as u32,
                        attempts: r.int(6)? as u32,
                        last_error: r.opt_text(7)?,
                        measurements: r.opt_text(8)?,
                    })
                },
            )
            .context("reading cursor rows")
        })
    }

    /// Streams (project key, path) that have subscription cursors: their
    /// actors are woken at startup so deliveries resume.
    ///
    /// With several hosts, only those this host owned (its id outlives the
    /// process) or nobody holds: the others' streams stay with their live
    /// owners, and a dead owner's are taken over by every host's renewal
    /// task, so no host loads every subscribed stream of the database.
    pub fn streams_with_cursors(&self) -> Result<Vec<(String, String)>> {
        let owner = self.cluster().map(|me| me.id.clone());
        self.with_reader(|db| {
            match &owner {
                None => db.query_all(
                    "SELECT DISTINCT s.project, s.path FROM subscription_cursors c
                     JOIN streams s ON s.id = c.stream",
                    args![],
                    |r| Ok((r.text(0)?, r.text(1)?)),
                ),
                Some(me) => db.query_all(
                    "SELECT DISTINCT s.project, s.path FROM subscription_cursors c
                     JOIN streams s ON s.id = c.stream
                     WHERE COALESCE((SELECT l.owner FROM stream_leases l
                                     WHERE l.project = s.project AND l.path = s.path), ?1) = ?1",
                    args![me],
                    |r| Ok((r.text(0)?, r.text(1)?)),
                ),
            }
            .context("listing streams with subscriptions")
        })
    }

    /// The streams of this host (every stream with one host) whose state
    /// sets retention bounds.
    pub fn streams_with_retention(&self) -> Result<Vec<(String, String)>> {
        let owner = self.cluster().map(|me| me.id.clone());
        self.with_reader(|db| {
            match &owner {
                None => db.query_all(
                    "SELECT project, path FROM streams WHERE state_json LIKE '%\"retention\":{%'",
                    args![],
                    |r| Ok((r.text(0)?, r.text(1)?)),
                ),
                Some(me) => db.query_all(
                    "SELECT s.project, s.path FROM streams s
                     WHERE s.state_json LIKE '%\"retention\":{%'
                       AND COALESCE((SELECT l.owner FROM stream_leases l
                                     WHERE l.project = s.project AND l.path = s.path), ?1) = ?1",
                    args![me],
                    |r| Ok((r.text(0)?, r.text(1)?)),
                ),
            }
            .context("listing streams with retention")
        })
    }

    /// A processor instance's base, if retention kept one.
    pub fn processor_base(&self, row_id: i64, component: &str) -> Result<Option<BaseRow>> {
        self.with_reader(|db| {
            db.query_opt(
                "SELECT stream_id, \"offset\", digest, state, bucket, chain FROM processor_bases
                 WHERE stream = ?1 AND component = ?2",
                args![row_id, component],
                |r| {
                    Ok(BaseRow {
                        stream_id: r.text(0)?,
                        offset: r.int(1)? as u64,
                        digest: r.text(2)?,
                        state: r.text(3)?,
                        bucket: r.int(4)?,
                        chain: r.text(5)?,
                    })
                },
            )
        })
    }

    /// The deployed component `name` of `project`.
    pub fn component(&self, project: &str, name: &str) -> Result<Option<ComponentRow>> {
        // With several hosts a deploy through another host reaches this
        // cache as a notification (`lease::listen`), which forgets the row.
        let miss = match self.inner.hot.component(project, name) {
            Ok(row) => return Ok(row),
            Err(miss) => miss,
        };
        let row = self.with_reader(|db| {
            db.query_opt(
                "SELECT name, digest, exports, deployed_at FROM components WHERE project = ?1 AND name = ?2",
                args![project, name],
                component_row,
            )
        })?;
        self.inner.hot.fill_component(miss, project, name, &row);
        Ok(row)
    }

    /// Every deployed component of `project`, by name.
    pub fn components(&self, project: &str) -> Result<Vec<ComponentRow>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT name, digest, exports, deployed_at FROM components WHERE project = ?1 ORDER BY name",
                args![project],
                component_row,
            )
        })
    }

    /// The bytes of a component by digest.
    pub fn component_bytes(&self, digest: &str) -> Result<Vec<u8>> {
        self.with_reader(|db| {
            db.query_one(
                "SELECT bytes FROM component_blobs WHERE digest = ?1",
                args![digest],
                |r| r.bytes(0),
            )
            .with_context(|| format!("loading component {digest}"))
        })
    }

    /// A processor instance's checkpoint.
    pub fn checkpoint(&self, row_id: i64, component: &str) -> Result<Option<CheckpointRow>> {
        let miss = match self.inner.hot.checkpoint(row_id, component) {
            Ok(row) => return Ok(Some(row)),
            Err(miss) => miss,
        };
        let row = self.with_reader(|db| checkpoint_in(db, row_id, component))?;
        if let Some(row) = &row {
            self.inner.hot.fill_checkpoint(miss, row_id, component, row);
        }
        Ok(row)
    }

    /// A processor instance's checkpoint and its keyed state as they were
    /// together, read in one read transaction (held by the bucket while it
    /// lives; its reads bypass the key cache): a fold that starts from the
    /// checkpoint (`/at/{offset}`) while wakes go on.
    pub fn checkpoint_snapshot(
        &self,
        row_id: i64,
        component: &str,
    ) -> Result<Option<(CheckpointRow, StoredBucket)>> {
        let reads = self.read_transaction()?;
        let Some(row) = reads.with(|db| checkpoint_in(db, row_id, component))? else {
            return Ok(None);
        };
        let bucket = self.snapshot_bucket(row.bucket, reads);
        Ok(Some((row, bucket)))
    }

    /// A component's versions, newest first: (digest, deployed at).
    pub fn component_versions(&self, project: &str, name: &str) -> Result<Vec<(String, String)>> {
        self.with_reader(|db| {
            db.query_all(
                db.pick(
                    "SELECT digest, deployed_at FROM component_versions
                     WHERE project = ?1 AND name = ?2 ORDER BY rowid DESC",
                    "SELECT digest, deployed_at FROM component_versions
                     WHERE project = ?1 AND name = ?2 ORDER BY id DESC",
                ),
                args![project, name],
                |r| Ok((r.text(0)?, r.text(1)?)),
            )
        })
    }

    /// The secrets that sign `project`'s webhooks: the current one and,
    /// during a rotation, the previous (`None`: the project has none, and
    /// its webhooks go unsigned).
    pub fn webhook_secrets(&self, project: &str) -> Result<Option<(String, Option<String>)>> {
        self.with_reader(|db| {
            db.query_opt(
                "SELECT current, previous FROM webhook_secrets WHERE project = ?1",
                args![project],
                |r| Ok((r.text(0)?, r.opt_text(1)?)),
            )
        })
    }

    /// New versions whose halted subscriptions are not yet resumed:
    /// (project, name, digest).
    pub fn pending_resumes(&self) -> Result<Vec<(String, String, String)>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT project, name, digest FROM pending_resumes ORDER BY project, name",
                args![],
                |r| Ok((r.text(0)?, r.text(1)?, r.text(2)?)),
            )
        })
    }

    /// Whether a refold of component `name` of `project` is under way (its
    /// record is in the database from the deploy until every instance is
    /// done): its instances' wakes run their checkpoint's version, on
    /// whichever host they run.
    /// Kept in the hot cache (changed by this host's writer, and by other
    /// hosts' deploys and finished refolds through their notifications).
    pub fn refold_pending(&self, project: &str, name: &str) -> Result<bool> {
        let miss = match self.inner.hot.refold_pending(project, name) {
            Ok(pending) => return Ok(pending),
            Err(miss) => miss,
        };
        let pending = self.with_reader(|db| {
            Ok(db
                .query_opt(
                    "SELECT 1 FROM pending_refolds WHERE project = ?1 AND name = ?2",
                    args![project, name],
                    |r| r.int(0),
                )?
                .is_some())
        })?;
        self.inner.hot.fill_refold(miss, project, name, pending);
        Ok(pending)
    }

    /// Whether the refold of `name` with `digest` stores history's effects
    /// (`replayEffects`); false once it is done.
    pub fn refold_replays_effects(&self, project: &str, name: &str, digest: &str) -> Result<bool> {
        self.with_reader(|db| {
            Ok(db
                .query_opt(
                    "SELECT replay_effects FROM pending_refolds
                     WHERE project = ?1 AND name = ?2 AND digest = ?3",
                    args![project, name, digest],
                    |r| r.int(0),
                )?
                .is_some_and(|v| v != 0))
        })
    }

    /// Refolds asked for and not yet done: (project, name, digest).
    /// Shadows are not among them ([`Storage::pending_shadows`]).
    pub fn pending_refolds(&self) -> Result<Vec<(String, String, String)>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT project, name, digest FROM pending_refolds WHERE shadow = 0
                 ORDER BY project, name",
                args![],
                |r| Ok((r.text(0)?, r.text(1)?, r.text(2)?)),
            )
        })
    }

    /// Shadow versions folding beside the live ones: (project, name,
    /// digest).
    pub fn pending_shadows(&self) -> Result<Vec<(String, String, String)>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT project, name, digest FROM pending_refolds WHERE shadow <> 0
                 ORDER BY project, name",
                args![],
                |r| Ok((r.text(0)?, r.text(1)?, r.text(2)?)),
            )
        })
    }

    /// The version component `name` of `project` is shadowed by, if any.
    pub fn shadow_of(&self, project: &str, name: &str) -> Result<Option<String>> {
        self.with_reader(|db| {
            db.query_opt(
                "SELECT digest FROM pending_refolds
                 WHERE project = ?1 AND name = ?2 AND shadow <> 0",
                args![project, name],
                |r| r.text(0),
            )
        })
    }

    /// The source paths of a component's processor instances in a project.
    pub fn processor_instances(&self, project: &str, component: &str) -> Result<Vec<String>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT s.path FROM processor_checkpoints p JOIN streams s ON s.id = p.stream
                 WHERE s.project = ?1 AND p.component = ?2 ORDER BY s.path",
                args![project, component],
                |r| r.text(0),
            )
        })
    }

    /// Paths of a project's streams whose cached state has a halted
    /// subscription and mentions `text` (a candidate list: the caller checks
    /// each stream's state).
    pub fn streams_halted_mentioning(&self, project: &str, text: &str) -> Result<Vec<String>> {
        self.with_reader(|db| {
            db.query_all(
                db.pick(
                    "SELECT path FROM streams WHERE project = ?1
                       AND instr(state_json, '\"deliveryHalted\"') > 0 AND instr(state_json, ?2) > 0
                     ORDER BY path",
                    "SELECT path FROM streams WHERE project = ?1
                       AND strpos(state_json, '\"deliveryHalted\"') > 0
                       AND strpos(state_json, CAST(?2 AS TEXT)) > 0
                     ORDER BY path",
                ),
                args![project, text],
                |r| r.text(0),
            )
        })
    }

    /// Paths of a project's streams with a failing delivery run (a cursor
    /// row that counts failed attempts).
    pub fn streams_failing(&self, project: &str) -> Result<Vec<String>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT DISTINCT s.path FROM subscription_cursors c JOIN streams s ON s.id = c.stream
                 WHERE s.project = ?1 AND c.attempts > 0 ORDER BY s.path",
                args![project],
                |r| r.text(0),
            )
        })
    }

    /// The bytes each project stores, for `[limits] max-project-bytes`:
    /// its events (`streams.bytes` summed), its processors' keyed state
    /// (each key and value of the buckets their checkpoints name) and its
    /// components (each version it keeps, once per digest), by project.
    pub fn project_bytes(&self) -> Result<Vec<(String, u64)>> {
        let parts = self.with_reader(|db| {
            let row = |r: &Row<'_>| Ok((r.text(0)?, r.int(1)?.max(0) as u64));
            let mut all = db.query_all(
                "SELECT project, CAST(SUM(bytes) AS BIGINT) FROM streams GROUP BY project",
                args![],
                row,
            )?;
            // (A key is text: its bytes, not its characters.)
            all.extend(db.query_all(
                db.pick(
                    "SELECT s.project, CAST(SUM(length(CAST(k.key AS BLOB)) + length(k.value)) AS BIGINT)
                     FROM processor_checkpoints c
                     JOIN streams s ON s.id = c.stream
                     JOIN processor_keys k ON k.bucket = c.bucket
                     WHERE c.bucket <> 0 GROUP BY s.project",
                    "SELECT s.project, CAST(SUM(octet_length(k.key) + octet_length(k.value)) AS BIGINT)
                     FROM processor_checkpoints c
                     JOIN streams s ON s.id = c.stream
                     JOIN processor_keys k ON k.bucket = c.bucket
                     WHERE c.bucket <> 0 GROUP BY s.project",
                ),
                args![],
                row,
            )?);
            // A shadow's, a refold's or a verification's keyed state while
            // it folds.
            all.extend(db.query_all(
                db.pick(
                    "SELECT s.project, CAST(SUM(length(CAST(k.key AS BLOB)) + length(k.value)) AS BIGINT)
                     FROM scratch_buckets s JOIN processor_keys k ON k.bucket = s.bucket
                     GROUP BY s.project",
                    "SELECT s.project, CAST(SUM(octet_length(k.key) + octet_length(k.value)) AS BIGINT)
                     FROM scratch_buckets s JOIN processor_keys k ON k.bucket = s.bucket
                     GROUP BY s.project",
                ),
                args![],
                row,
            )?);
            all.extend(db.query_all(
                db.pick(
                    "SELECT v.project, CAST(SUM(length(b.bytes)) AS BIGINT)
                     FROM (SELECT project, digest FROM component_versions
                           UNION SELECT project, digest FROM components) v
                     JOIN component_blobs b ON b.digest = v.digest GROUP BY v.project",
                    "SELECT v.project, CAST(SUM(octet_length(b.bytes)) AS BIGINT)
                     FROM (SELECT project, digest FROM component_versions
                           UNION SELECT project, digest FROM components) v
                     JOIN component_blobs b ON b.digest = v.digest GROUP BY v.project",
                ),
                args![],
                row,
            )?);
            Ok(all)
        })?;
        let mut by_project = std::collections::BTreeMap::<String, u64>::new();
        for (project, bytes) in parts {
            *by_project.entry(project).or_default() += bytes;
        }
        Ok(by_project.into_iter().collect())
    }

    /// Where someone is needed, in `project` (`None`: every project):
    /// streams whose cached state has a halted subscription (with that
    /// state, for the caller to name which), and failing runs (a cursor row
    /// counting failed attempts), at most `limit` of each, by project and
    /// path.
    pub fn needing_attention(
        &self,
        project: Option<&str>,
        limit: usize,
    ) -> Result<NeedingAttention> {
        let limit = limit as i64;
        // ("*" is no project's name: every project.)
        let project = project.unwrap_or("*").to_string();
        self.with_reader(|db| {
            let halted = db.query_all(
                db.pick(
                    "SELECT project, path, state_json FROM streams
                     WHERE instr(state_json, '\"deliveryHalted\"') > 0
                       AND (?2 = '*' OR project = ?2)
                     ORDER BY project, path LIMIT ?1",
                    "SELECT project, path, state_json FROM streams
                     WHERE strpos(state_json, '\"deliveryHalted\"') > 0
                       AND (?2 = '*' OR project = ?2)
                     ORDER BY project, path LIMIT ?1",
                ),
                args![limit, project.as_str()],
                |r| Ok((r.text(0)?, r.text(1)?, r.text(2)?)),
            )?;
            let failing = db.query_all(
                "SELECT s.project, s.path, c.subscription_key, c.attempts, c.last_error
                 FROM subscription_cursors c JOIN streams s ON s.id = c.stream
                 WHERE c.attempts > 0 AND (?2 = '*' OR s.project = ?2)
                 ORDER BY s.project, s.path, c.subscription_key LIMIT ?1",
                args![limit, project.as_str()],
                |r| {
                    Ok(FailingRun {
                        project: r.text(0)?,
                        path: r.text(1)?,
                        subscription_key: r.text(2)?,
                        attempts: r.int(3)? as u64,
                        last_error: r.opt_text(4)?,
                    })
                },
            )?;
            Ok(NeedingAttention { halted, failing })
        })
    }

    /// The last failure of a processor instance.
    pub fn processor_failure(
        &self,
        row_id: i64,
        component: &str,
    ) -> Result<Option<ProcessorFailure>> {
        self.with_reader(|db| {
            db.query_opt(
                "SELECT stream_id, failed_at, \"offset\", message, repro
                 FROM processor_failures WHERE stream = ?1 AND component = ?2",
                args![row_id, component],
                |r| {
                    Ok(ProcessorFailure {
                        row_id,
                        component: component.to_string(),
                        stream_id: r.text(0)?,
                        failed_at: r.text(1)?,
                        offset: r.opt_int(2)?.map(|o| o as u64),
                        message: r.text(3)?,
                        repro: r.opt_text(4)?,
                    })
                },
            )
        })
    }

    /// Committed event bodies holding the given idempotency keys, by key.
    pub fn events_by_keys(&self, row_id: i64, keys: &[&str]) -> Result<HashMap<String, String>> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        self.with_reader(|db| {
            let mut found = HashMap::new();
            // One statement for up to KEYS_LOOKED_UP_AT_ONCE keys (a batch of
            // keyed events is looked up in one probe of the index per key,
            // not a statement each: on PostgreSQL a round trip each), with
            // as many placeholders as keys.
            for chunk in keys.chunks(KEYS_LOOKED_UP_AT_ONCE) {
                let sql = format!(
                    "SELECT idempotency_key, body FROM events WHERE stream = ?1 AND idempotency_key IN ({})",
                    sql::placeholders(2, chunk.len())
                );
                let mut params: Vec<sql::Arg<'_>> = vec![sql::Arg::from(row_id)];
                params.extend(chunk.iter().map(|k| sql::Arg::from(*k)));
                for (key, body) in db.query_all(&sql, &params, |r| Ok((r.text(0)?, r.text(1)?)))? {
                    found.insert(key, parts::expand(db, body)?);
                }
            }
            Ok(found)
        })
    }
}

/// Idempotency keys [`Storage::events_by_keys`] looks up in one statement.
const KEYS_LOOKED_UP_AT_ONCE: usize = 100;

/// This data dir's host id (`<data-dir>/host-id`, made on first use).
fn host_id(data_dir: &Path) -> Result<String> {
    let path = data_dir.join("host-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        _ => {
            let id = uuid::Uuid::new_v4().to_string();
            std::fs::write(&path, &id).with_context(|| format!("writing {}", path.display()))?;
            Ok(id)
        }
    }
}

/// Locks the data dir for this process, or names the reason it cannot.
fn lock_data_dir(data_dir: &Path) -> Result<std::fs::File> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating data dir {}", data_dir.display()))?;
    let path = data_dir.join("streamhost.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "data dir {} is in use by another streamhost (it holds {}): \
             stop it, or give this one another --data-dir",
            data_dir.display(),
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// The columns [`stream_row`] reads.
const STREAM_COLUMNS: &str =
    "id, path, stream_id, created_at, head_offset, state_json, state_offset";

fn stream_row(r: &Row<'_>) -> Result<StreamRow> {
    Ok(StreamRow {
        row_id: r.int(0)?,
        path: r.text(1)?,
        stream_id: r.text(2)?,
        created_at: r.text(3)?,
        head_offset: r.int(4)? as u64,
        state_json: r.text(5)?,
        state_offset: r.int(6)? as u64,
        log_head: 0,
    })
}

fn component_row(r: &Row<'_>) -> Result<ComponentRow> {
    let exports = r.text(2)?;
    Ok(ComponentRow {
        name: r.text(0)?,
        digest: r.text(1)?,
        exports: serde_json::from_str(&exports).unwrap_or_default(),
        deployed_at: r.text(3)?,
    })
}
