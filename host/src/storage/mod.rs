//! Storage: one SQLite database per data directory (WAL). All SQL lives here.
//!
//! Writes go through one writer thread that coalesces the commits of all
//! streams into one transaction (group commit, see `writer.rs`); reads use a
//! small pool of read connections, which WAL lets run beside the writer.
//!
//! **Architecture Invariant:** a write is answered only after the transaction
//! that holds it has committed (and, with `durability = "full"`, been fsync'd).

mod effects;
mod faults;
mod hot;
mod ingest;
mod schema;
mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use crate::config::Durability;
use crate::metrics::Metrics;
pub use effects::{EffectOp, EffectQuery, EffectRow, EffectSource, NewEffect};
pub use ingest::{
    FenceIdentity, FenceRow, IngestOp, NewPending, PendingRow, DIAGNOSTICS_KEPT, KEY_CONFLICT,
};
pub use writer::{
    Checkpoint, CommitError, CursorRow, Deployment, NewStream, ProcessorFailure, StoredEvent,
    StreamCommit, StreamRef, WriteOp,
};

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

/// Handle to the database: the group-commit writer and the read pool.
#[derive(Clone)]
pub struct Storage {
    inner: Arc<Inner>,
}

struct Inner {
    db_path: PathBuf,
    writer: writer::WriterHandle,
    readers: Mutex<Vec<Connection>>,
    /// Newest events, checkpoints and component rows, kept true by the
    /// writer (`hot.rs`).
    hot: Arc<hot::Hot>,
    /// `<data-dir>/streamhost.lock`, locked exclusively while this storage
    /// lives: one host per data dir (released by the OS when the process dies).
    _lock: std::fs::File,
}

/// Read connections kept for reuse.
const READERS_KEPT_MAX: usize = 16;
/// Prepared statements kept per connection: more than storage has, so none
/// is parsed again (rusqlite keeps 16 by default; the writer alone uses ~50).
const STATEMENTS_CACHED: usize = 128;

impl Storage {
    /// Opens (creating if needed) `streamhost.db` in `data_dir` and starts the
    /// writer thread.
    pub fn open(data_dir: &Path, durability: Durability, metrics: Metrics) -> Result<Storage> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating data dir {}", data_dir.display()))?;
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
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.set_prepared_statement_cache_capacity(STATEMENTS_CACHED);
        schema::migrate(&conn)
            .with_context(|| format!("migrating the schema of {}", db_path.display()))?;
        let hot = Arc::new(hot::Hot::default());
        let writer = writer::WriterHandle::start(conn, metrics, hot.clone())?;
        Ok(Storage {
            inner: Arc::new(Inner {
                db_path,
                writer,
                readers: Mutex::new(Vec::new()),
                hot,
                _lock: lock,
            }),
        })
    }

    /// Queues a write for the next group commit; the answer arrives after the
    /// transaction that holds it has committed.
    pub fn submit(&self, op: WriteOp) -> tokio::sync::oneshot::Receiver<Result<i64, CommitError>> {
        self.inner.writer.submit(op)
    }

    /// Commits a write from a blocking thread (never an async worker): on
    /// this thread when the writer is idle, else in the writer's next group;
    /// answers after the commit, like [`Storage::submit`].
    pub fn commit_blocking(&self, op: WriteOp) -> Result<i64, CommitError> {
        self.inner.writer.commit_blocking(op)
    }

    fn with_reader<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.inner.readers.lock().expect("reader pool").pop();
        let conn = match conn {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    &self.inner.db_path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .with_context(|| format!("opening reader on {}", self.inner.db_path.display()))?;
                c.busy_timeout(std::time::Duration::from_secs(10))?;
                c.set_prepared_statement_cache_capacity(STATEMENTS_CACHED);
                c
            }
        };
        let out = f(&conn);
        let mut pool = self.inner.readers.lock().expect("reader pool");
        if pool.len() < READERS_KEPT_MAX {
            pool.push(conn);
        }
        out
    }

    /// Loads a stream's row, or `None` when the stream does not exist.
    pub fn load_stream(&self, project: &str, path: &str) -> Result<Option<StreamRow>> {
        self.with_reader(|c| {
            let row = c
                .prepare_cached(
                    "SELECT id, stream_id, created_at, head_offset, state_json, state_offset
                     FROM streams WHERE project = ?1 AND path = ?2",
                )?
                .query_row(params![project, path], |r| {
                    Ok(StreamRow {
                        row_id: r.get(0)?,
                        path: path.to_string(),
                        stream_id: r.get(1)?,
                        created_at: r.get(2)?,
                        head_offset: r.get::<_, i64>(3)? as u64,
                        state_json: r.get(4)?,
                        state_offset: r.get::<_, i64>(5)? as u64,
                        log_head: 0,
                    })
                })
                .optional()
                .with_context(|| format!("loading stream {path:?} of {project:?}"))?;
            let Some(mut row) = row else { return Ok(None) };
            row.log_head = c
                .prepare_cached("SELECT COALESCE(MAX(offset), 0) FROM events WHERE stream = ?1")?
                .query_row([row.row_id], |r| r.get::<_, i64>(0))? as u64;
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
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, path, stream_id, created_at, head_offset, state_json, state_offset
                 FROM streams
                 WHERE project = ?1 AND substr(path, 1, length(?2)) = ?2 AND path > ?3
                 ORDER BY path LIMIT ?4",
            )?;
            let rows = stmt
                .query_map(
                    params![project, prefix, after_path.unwrap_or(""), limit as i64],
                    |r| {
                        Ok(StreamRow {
                            row_id: r.get(0)?,
                            path: r.get(1)?,
                            stream_id: r.get(2)?,
                            created_at: r.get(3)?,
                            head_offset: r.get::<_, i64>(4)? as u64,
                            state_json: r.get(5)?,
                            state_offset: r.get::<_, i64>(6)? as u64,
                            log_head: 0,
                        })
                    },
                )?
                .collect::<rusqlite::Result<Vec<_>>>()
                .context("listing streams")?;
            Ok(rows)
        })
    }

    /// Committed event bodies with offsets in `(after_offset, up_to_offset]`,
    /// at most `limit`, in order.
    pub fn events_after(
        &self,
        row_id: i64,
        after_offset: u64,
        limit: usize,
        up_to_offset: u64,
    ) -> Result<Vec<(u64, String)>> {
        if let Some(events) = self
            .inner
            .hot
            .events_after(row_id, after_offset, limit, up_to_offset)
        {
            return Ok(events);
        }
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT offset, body FROM events WHERE stream = ?1 AND offset > ?2 AND offset <= ?4
                 ORDER BY offset LIMIT ?3",
            )?;
            let rows = stmt
                .query_map(
                    params![
                        row_id,
                        after_offset as i64,
                        limit as i64,
                        up_to_offset.min(i64::MAX as u64) as i64
                    ],
                    |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?)),
                )?
                .collect::<rusqlite::Result<Vec<_>>>()
                .context("reading events")?;
            Ok(rows)
        })
    }

    /// The cursor rows of a stream.
    pub fn load_cursors(&self, row_id: i64) -> Result<Vec<CursorRow>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT subscription_key, generation, acknowledged_offset, failing_offset,
                        failing_attempts, skips
                 FROM subscription_cursors WHERE stream = ?1",
            )?;
            let rows = stmt
                .query_map([row_id], |r| {
                    Ok(CursorRow {
                        subscription_key: r.get(0)?,
                        generation: r.get::<_, i64>(1)? as u64,
                        acknowledged_offset: r.get::<_, i64>(2)? as u64,
                        failing_offset: r.get::<_, Option<i64>>(3)?.map(|o| o as u64),
                        failing_attempts: r.get::<_, i64>(4)? as u32,
                        skips: r.get::<_, i64>(5)? as u32,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
                .context("reading cursor rows")?;
            Ok(rows)
        })
    }

    /// Streams (project key, path) that have subscription cursors: their
    /// actors are woken at startup so deliveries resume.
    pub fn streams_with_cursors(&self) -> Result<Vec<(String, String)>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT DISTINCT s.project, s.path FROM subscription_cursors c
                 JOIN streams s ON s.id = c.stream",
            )?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
                .context("listing streams with subscriptions")?;
            Ok(rows)
        })
    }

    /// The deployed component `name` of `project`.
    pub fn component(&self, project: &str, name: &str) -> Result<Option<ComponentRow>> {
        let miss = match self.inner.hot.component(project, name) {
            Ok(row) => return Ok(row),
            Err(miss) => miss,
        };
        let row = self.with_reader(|c| {
            let row = c
                .prepare_cached(
                    "SELECT name, digest, exports, deployed_at FROM components WHERE project = ?1 AND name = ?2",
                )?
                .query_row(params![project, name], component_row)
                .optional()?;
            Ok(row)
        })?;
        self.inner.hot.fill_component(miss, project, name, &row);
        Ok(row)
    }

    /// Every deployed component of `project`, by name.
    pub fn components(&self, project: &str) -> Result<Vec<ComponentRow>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT name, digest, exports, deployed_at FROM components WHERE project = ?1 ORDER BY name",
            )?;
            let rows = stmt
                .query_map([project], component_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// The bytes of a component by digest.
    pub fn component_bytes(&self, digest: &str) -> Result<Vec<u8>> {
        self.with_reader(|c| {
            c.prepare_cached("SELECT bytes FROM component_blobs WHERE digest = ?1")?
                .query_row([digest], |r| r.get(0))
                .with_context(|| format!("loading component {digest}"))
        })
    }

    /// A processor instance's checkpoint.
    pub fn checkpoint(&self, row_id: i64, component: &str) -> Result<Option<CheckpointRow>> {
        let miss = match self.inner.hot.checkpoint(row_id, component) {
            Ok(row) => return Ok(Some(row)),
            Err(miss) => miss,
        };
        let row = self.with_reader(|c| {
            let row = c
                .prepare_cached(
                    "SELECT stream_id, checkpoint_offset, state, digest, updated_at
                     FROM processor_checkpoints WHERE stream = ?1 AND component = ?2",
                )?
                .query_row(params![row_id, component], |r| {
                    Ok(CheckpointRow {
                        stream_id: r.get(0)?,
                        checkpoint_offset: r.get::<_, i64>(1)? as u64,
                        state: r.get(2)?,
                        digest: r.get(3)?,
                        updated_at: r.get(4)?,
                    })
                })
                .optional()?;
            Ok(row)
        })?;
        if let Some(row) = &row {
            self.inner.hot.fill_checkpoint(miss, row_id, component, row);
        }
        Ok(row)
    }

    /// A component's versions, newest first: (digest, deployed at).
    pub fn component_versions(&self, project: &str, name: &str) -> Result<Vec<(String, String)>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT digest, deployed_at FROM component_versions
                 WHERE project = ?1 AND name = ?2 ORDER BY rowid DESC",
            )?;
            let rows = stmt
                .query_map(params![project, name], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// New versions whose halted subscriptions are not yet resumed:
    /// (project, name, digest).
    pub fn pending_resumes(&self) -> Result<Vec<(String, String, String)>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT project, name, digest FROM pending_resumes ORDER BY project, name",
            )?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// Refolds asked for and not yet done: (project, name, digest).
    pub fn pending_refolds(&self) -> Result<Vec<(String, String, String)>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT project, name, digest FROM pending_refolds ORDER BY project, name",
            )?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// The source paths of a component's processor instances in a project.
    pub fn processor_instances(&self, project: &str, component: &str) -> Result<Vec<String>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT s.path FROM processor_checkpoints p JOIN streams s ON s.id = p.stream
                 WHERE s.project = ?1 AND p.component = ?2 ORDER BY s.path",
            )?;
            let rows = stmt
                .query_map(params![project, component], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// Paths of a project's streams whose cached state has a halted
    /// subscription and mentions `text` (a candidate list: the caller checks
    /// each stream's state).
    pub fn streams_halted_mentioning(&self, project: &str, text: &str) -> Result<Vec<String>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT path FROM streams WHERE project = ?1
                   AND instr(state_json, '\"deliveryHalted\"') > 0 AND instr(state_json, ?2) > 0
                 ORDER BY path",
            )?;
            let rows = stmt
                .query_map(params![project, text], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// The last failure of a processor instance.
    pub fn processor_failure(
        &self,
        row_id: i64,
        component: &str,
    ) -> Result<Option<ProcessorFailure>> {
        self.with_reader(|c| {
            let row = c
                .prepare_cached(
                    "SELECT stream_id, failed_at, offset, message, repro
                     FROM processor_failures WHERE stream = ?1 AND component = ?2",
                )?
                .query_row(params![row_id, component], |r| {
                    Ok(ProcessorFailure {
                        row_id,
                        component: component.to_string(),
                        stream_id: r.get(0)?,
                        failed_at: r.get(1)?,
                        offset: r.get::<_, Option<i64>>(2)?.map(|o| o as u64),
                        message: r.get(3)?,
                        repro: r.get(4)?,
                    })
                })
                .optional()?;
            Ok(row)
        })
    }

    /// Committed event bodies holding the given idempotency keys, by key.
    pub fn events_by_keys(&self, row_id: i64, keys: &[&str]) -> Result<HashMap<String, String>> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT body FROM events WHERE stream = ?1 AND idempotency_key = ?2",
            )?;
            let mut found = HashMap::new();
            for key in keys {
                if let Some(body) = stmt
                    .query_row(params![row_id, key], |r| r.get::<_, String>(0))
                    .optional()?
                {
                    found.insert(key.to_string(), body);
                }
            }
            Ok(found)
        })
    }
}

/// Locks the data dir for this process, or names the reason it cannot.
fn lock_data_dir(data_dir: &Path) -> Result<std::fs::File> {
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

fn component_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ComponentRow> {
    let exports: String = r.get(2)?;
    Ok(ComponentRow {
        name: r.get(0)?,
        digest: r.get(1)?,
        exports: serde_json::from_str(&exports).unwrap_or_default(),
        deployed_at: r.get(3)?,
    })
}
