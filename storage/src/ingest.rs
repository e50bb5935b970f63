//! Ingest's SQL: events accepted over HTTP and not yet appended, and the
//! JetStream bridge's fences with their rejection diagnostics.
//!
//! A pending row is keyed by (project, path, idempotency key): accepting the
//! same key twice keeps the first row. Rows leave only once their events are
//! committed to their stream ([`IngestOp::Appended`]), which frees capacity.

use super::sql::{args, Db};
use super::writer::{Refusal, Refused};
use super::Storage;
use anyhow::Result;

/// How an [`IngestOp::Accept`] that meets a pending key with other content
/// fails (the key follows).
pub const KEY_CONFLICT: &str = "idempotency-conflict on pending key ";

/// How an [`IngestOp::Accept`] fails when a key it would accept is already
/// in the stream (the key follows): an acceptance that raced with the
/// drain of the same key; the caller checks again and decides.
pub const KEY_IN_STREAM: &str = "idempotency key already in the stream: ";

/// How an [`IngestOp::Accept`] with a [`SharedBound`] that does not fit
/// fails (a sentence saying what is pending follows).
pub const CAPACITY_EXHAUSTED: &str = "capacity-exhausted: ";

/// Capacity counted from the pending table itself (several hosts accept and
/// drain, so no host's memory knows what is pending): an acceptance checks
/// it in its own transaction, under a lock that orders acceptances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedBound {
    pub max_events: u64,
    pub max_bytes: u64,
    /// One project's share.
    pub project_max_events: u64,
    pub project_max_bytes: u64,
}

/// Most diagnostics kept per fence (the latest).
pub const DIAGNOSTICS_KEPT: i64 = 64;

/// Registered JetStream stream identities (fences) kept at most: a
/// registration past them is refused, never one of them dropped.
pub const FENCES_MAX: i64 = 1024;

/// One event accepted over HTTP.
#[derive(Debug, Clone, PartialEq)]
pub struct NewPending {
    pub project: String,
    pub path: String,
    pub key: String,
    /// The `EventInput`, JSON.
    pub body: String,
    pub accepted_at: String,
}

/// An HTTP ingest event dropped for good, and why (by a build from before
/// parking; what is refused for good now is parked, never dropped).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DroppedEvent {
    /// Its project (empty: a global stream).
    pub project: String,
    /// Its stream's path.
    pub path: String,
    /// Its idempotency key.
    pub idempotency_key: String,
    /// Why it can never be appended.
    pub reason: String,
    /// When it was dropped (RFC 3339).
    pub dropped_at: String,
}

/// A JetStream message parked: refused for good (or not an event at all),
/// kept with its whole input until redriven or discarded.
#[derive(Debug, Clone, PartialEq)]
pub struct NewParked {
    /// Its project, if its subject names one (empty: none, an admin's).
    pub project: String,
    /// Its stream's path, if its subject names one (empty: none).
    pub path: String,
    /// Unique per stream: the message's fence and sequence.
    pub key: String,
    /// The `EventInput`, JSON (empty: the message is not an event).
    pub body: String,
    /// The message's bytes, base64.
    pub raw: String,
    pub subject: String,
    pub sequence: u64,
    pub reason: String,
    pub accepted_at: String,
}

/// An accepted event refused for good, as stored: it stays in
/// `ingest_pending` (so it counts against capacity) with `parked_at` set,
/// and the drain passes it by.
#[derive(Debug, Clone, PartialEq)]
pub struct ParkedRow {
    pub id: i64,
    pub project: String,
    pub path: String,
    /// The `EventInput`, JSON (empty: a message that is not an event).
    pub body: String,
    pub reason: String,
    pub accepted_at: String,
    pub parked_at: String,
    /// `http` or `nats`.
    pub source: String,
    pub subject: Option<String>,
    pub sequence: Option<i64>,
    /// The message's bytes, base64 (NATS).
    pub raw: Option<String>,
}

const PARKED_COLUMNS: &str = "id, project, path, body, reason, accepted_at, parked_at, source, \
                              nats_subject, nats_sequence, raw";

fn parked_row(r: &super::sql::Row<'_>) -> Result<ParkedRow> {
    Ok(ParkedRow {
        id: r.int(0)?,
        project: r.text(1)?,
        path: r.text(2)?,
        body: r.text(3)?,
        reason: r.opt_text(4)?.unwrap_or_default(),
        accepted_at: r.text(5)?,
        parked_at: r.opt_text(6)?.unwrap_or_default(),
        source: r.text(7)?,
        subject: r.opt_text(8)?,
        sequence: r.opt_int(9)?,
        raw: r.opt_text(10)?,
    })
}

/// A pending event as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingRow {
    pub id: i64,
    pub key: String,
    pub body: String,
    pub bytes: i64,
}

/// A JetStream stream's identity: a consumer may act on it only while it
/// matches a registered fence.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FenceIdentity {
    /// The JetStream account.
    pub account: String,
    /// The JetStream domain (empty: none).
    pub domain: String,
    /// The stream's name.
    pub stream: String,
    /// Creation time, as the broker reports it (RFC 3339).
    pub created: String,
}

/// A registered fence.
#[derive(Debug, Clone, PartialEq)]
pub struct FenceRow {
    pub id: i64,
    pub identity: FenceIdentity,
    pub registered_at: String,
}

/// A write for ingest.
#[derive(Debug, Clone)]
pub enum IngestOp {
    /// Accepts events; answers how many rows are new and their bytes (a key
    /// already pending keeps its first row), read with [`IngestOp::accepted`].
    Accept {
        rows: Vec<NewPending>,
        /// Several hosts: checked against the table, not memory.
        bound: Option<SharedBound>,
    },
    /// These pending rows' events are committed to their stream: exactly
    /// these rows go (not "every row up to the last id": with several hosts
    /// a lower id can commit after a higher one was read). Answers how many
    /// went and their bytes, read with [`IngestOp::accepted`] (rows another
    /// drain deleted first are not counted twice).
    Appended { ids: Vec<i64> },
    /// A pending row that can never be appended as it is: kept, with the
    /// reason, and passed by (the rows behind it go on). Answers 1 if it
    /// was pending.
    Park {
        id: i64,
        reason: String,
        parked_at: String,
    },
    /// A JetStream message that can never be appended as it is, parked
    /// with its whole input; answers its bytes (0: parked already).
    ParkMessage { row: NewParked, parked_at: String },
    /// A parked row of `project` redriven or discarded: it goes, which
    /// frees its capacity. Answers what went, read with
    /// [`IngestOp::accepted`].
    Settle { project: String, id: i64 },
    /// Registers a stream's identity; answers the fence id.
    Register {
        identity: FenceIdentity,
        registered_at: String,
    },
    /// A rejected message of a fence (the latest [`DIAGNOSTICS_KEPT`] are
    /// kept; the same sequence twice is recorded once).
    Diagnostic {
        fence: i64,
        sequence: u64,
        reason: String,
    },
}

/// Fails with [`CAPACITY_EXHAUSTED`] unless `rows` fit `bound` beside
/// what is pending. PostgreSQL: under a transaction-scoped advisory lock,
/// so two hosts' acceptances cannot both take the last room.
fn check_shared_capacity(conn: Db<'_>, rows: &[NewPending], bound: SharedBound) -> Result<()> {
    ingest_lock(conn)?;
    let more = (
        rows.len() as u64,
        rows.iter().map(|r| r.body.len() as u64).sum::<u64>(),
    );
    // One acceptance is for one stream: its project's share first.
    if let Some(project) = rows.first().map(|r| r.project.as_str()) {
        let pending = conn.query_one(
            "SELECT COUNT(*), CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM ingest_pending \
             WHERE project = ?1",
            args![project],
            |r| Ok((r.int(0)? as u64, r.int(1)? as u64)),
        )?;
        let max = (bound.project_max_events, bound.project_max_bytes);
        fits(pending, more, max, &share_of(project))?;
    }
    let pending = conn.query_one(
        "SELECT COUNT(*), CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM ingest_pending",
        args![],
        |r| Ok((r.int(0)? as u64, r.int(1)? as u64)),
    )?;
    fits(pending, more, (bound.max_events, bound.max_bytes), "")
}

/// Fails with [`CAPACITY_EXHAUSTED`] (`whose` names a project's share) unless
/// `more` (events, bytes) fit beside `pending` within `max`.
fn fits(pending: (u64, u64), more: (u64, u64), max: (u64, u64), whose: &str) -> Result<()> {
    for (what, pending, more, max) in [
        ("events", pending.0, more.0, max.0),
        ("bytes", pending.1, more.1, max.1),
    ] {
        if pending + more > max {
            let bound =
                format!("{whose}: {pending} of {max} {what} pending, {more} more do not fit");
            return Err(Refused::error(
                Refusal::CapacityExhausted(bound.clone()),
                format!("{CAPACITY_EXHAUSTED}{bound}"),
            ));
        }
    }
    Ok(())
}

/// PostgreSQL: the transaction-scoped lock every write to `ingest_pending`
/// takes before it touches a row (acceptances, and the drains' deletes,
/// which several hosts may run on the same rows): one order of locks, so
/// two hosts' group commits never wait on each other in a cycle (an
/// acceptance holding it while a delete waited on its rows deadlocked).
fn ingest_lock(conn: Db<'_>) -> Result<()> {
    if conn.dialect() == super::sql::Dialect::Postgres {
        conn.execute("SELECT pg_advisory_xact_lock(7428190312)", args![])?;
    }
    Ok(())
}

/// The first of `rows`' keys (one stream's) that the stream holds already.
fn key_in_stream(conn: Db<'_>, rows: &[NewPending]) -> Result<Option<String>> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let Some(stream) = conn.query_opt(
        "SELECT id FROM streams WHERE project = ?1 AND path = ?2",
        args![&first.project, &first.path],
        |r| r.int(0),
    )?
    else {
        return Ok(None);
    };
    // As many placeholders as keys (an acceptance is mostly one event): a
    // list padded to a hundred made SQLite build and probe a hundred-entry
    // list on the writer's thread for every acceptance.
    for chunk in rows.chunks(DELETE_CHUNK) {
        let sql = format!(
            "SELECT idempotency_key FROM events WHERE stream = ?1 AND idempotency_key IN ({}) LIMIT 1",
            super::sql::placeholders(2, chunk.len())
        );
        let mut params: Vec<super::sql::Arg<'_>> = vec![super::sql::Arg::from(stream)];
        params.extend(chunk.iter().map(|r| super::sql::Arg::from(r.key.as_str())));
        if let Some(key) = conn.query_opt(&sql, &params, |r| r.text(0))? {
            return Ok(Some(key));
        }
    }
    Ok(None)
}

/// Ids deleted by one statement of [`IngestOp::Appended`].
const DELETE_CHUNK: usize = 100;

fn delete_chunk_sql() -> String {
    format!(
        "DELETE FROM ingest_pending WHERE id IN ({}) RETURNING bytes",
        super::sql::placeholders(1, DELETE_CHUNK)
    )
}

impl IngestOp {
    /// What an [`IngestOp::Accept`] answered: rows stored and their bytes.
    pub fn accepted(answer: i64) -> (u64, u64) {
        ((answer >> 32) as u64, (answer & 0xffff_ffff) as u64)
    }
}

pub(super) fn apply(conn: Db<'_>, op: &IngestOp) -> Result<i64> {
    Ok(match op {
        IngestOp::Accept { rows, bound } => {
            ingest_lock(conn)?;
            if let Some(bound) = bound {
                check_shared_capacity(conn, rows, *bound)?;
            }
            // Under the lock no drain deletes a pending row now, and a row
            // leaves only after its event is in the stream: a key not pending
            // here is new or already in the stream, which this sees.
            if let Some(key) = key_in_stream(conn, rows)? {
                return Err(Refused::error(
                    Refusal::KeyInStream,
                    format!("{KEY_IN_STREAM}{key}"),
                ));
            }
            let (mut new, mut bytes) = (0i64, 0i64);
            for r in rows {
                let body_bytes = r.body.len() as i64;
                if conn.execute(
                    "INSERT INTO ingest_pending
                         (project, path, idempotency_key, body, bytes, accepted_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
                    args![
                        &r.project,
                        &r.path,
                        &r.key,
                        &r.body,
                        body_bytes,
                        &r.accepted_at
                    ],
                )? == 1
                {
                    new += 1;
                    bytes += body_bytes;
                    continue;
                }
                // The key is pending already: an acceptance that raced with
                // this one. Other content is a conflict, and none of this
                // write commits.
                let held = conn.query_one(
                    "SELECT body FROM ingest_pending
                     WHERE project = ?1 AND path = ?2 AND idempotency_key = ?3",
                    args![&r.project, &r.path, &r.key],
                    |row| row.text(0),
                )?;
                if held != r.body {
                    return Err(Refused::error(
                        Refusal::KeyConflict(r.key.clone()),
                        format!("{KEY_CONFLICT}{}", r.key),
                    ));
                }
            }
            // One request is at most 1000 events of at most a body's bytes
            // (far below 4 GiB): both fit one answer (see `accepted`).
            (new << 32) | (bytes & 0xffff_ffff)
        }
        IngestOp::Appended { ids } => {
            ingest_lock(conn)?;
            let (mut gone, mut bytes) = (0i64, 0i64);
            // One statement shape for every chunk (padded with its last id),
            // so it is prepared once.
            for chunk in ids.chunks(DELETE_CHUNK) {
                let mut padded = [0i64; DELETE_CHUNK];
                for (i, slot) in padded.iter_mut().enumerate() {
                    *slot = chunk[i.min(chunk.len() - 1)];
                }
                let params: Vec<super::sql::Arg<'_>> =
                    padded.iter().map(|id| super::sql::Arg::from(*id)).collect();
                for b in conn.query_all(&delete_chunk_sql(), &params, |r| r.int(0))? {
                    gone += 1;
                    bytes += b;
                }
            }
            // At most 1000 rows of at most 4 MiB in all: both fit.
            (gone << 32) | (bytes & 0xffff_ffff)
        }
        IngestOp::Park {
            id,
            reason,
            parked_at,
        } => {
            ingest_lock(conn)?;
            conn.execute(
                "UPDATE ingest_pending SET parked_at = ?1, reason = ?2
                 WHERE id = ?3 AND parked_at IS NULL",
                args![parked_at, reason, id],
            )? as i64
        }
        IngestOp::ParkMessage { row: r, parked_at } => {
            ingest_lock(conn)?;
            let bytes = (r.body.len() + r.raw.len()) as i64;
            let new = conn.execute(
                "INSERT INTO ingest_pending
                     (project, path, idempotency_key, body, bytes, accepted_at, source,
                      parked_at, reason, nats_subject, nats_sequence, raw)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'nats', ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT DO NOTHING",
                args![
                    &r.project,
                    &r.path,
                    &r.key,
                    &r.body,
                    bytes,
                    &r.accepted_at,
                    parked_at,
                    &r.reason,
                    &r.subject,
                    r.sequence as i64,
                    &r.raw
                ],
            )?;
            if new == 1 {
                bytes
            } else {
                0
            }
        }
        IngestOp::Settle { project, id } => {
            ingest_lock(conn)?;
            let gone = conn.query_all(
                "DELETE FROM ingest_pending
                 WHERE id = ?1 AND project = ?2 AND parked_at IS NOT NULL RETURNING bytes",
                args![id, project],
                |r| r.int(0),
            )?;
            ((gone.len() as i64) << 32) | (gone.iter().sum::<i64>() & 0xffff_ffff)
        }
        IngestOp::Register {
            identity: i,
            registered_at,
        } => {
            let known = conn.query_opt(
                "SELECT id FROM ingest_fences
                 WHERE account = ?1 AND domain = ?2 AND stream = ?3 AND created = ?4",
                args![&i.account, &i.domain, &i.stream, &i.created],
                |r| r.int(0),
            )?;
            if let Some(id) = known {
                return Ok(id);
            }
            let fences =
                conn.query_one("SELECT COUNT(*) FROM ingest_fences", args![], |r| r.int(0))?;
            if fences >= FENCES_MAX {
                anyhow::bail!(
                    "{fences} JetStream stream identities are registered already, the most kept \
                     ({FENCES_MAX}): stream {:?} created {} is not registered",
                    i.stream,
                    i.created
                );
            }
            conn.execute(
                "INSERT INTO ingest_fences (account, domain, stream, created, registered_at)
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                args![&i.account, &i.domain, &i.stream, &i.created, registered_at],
            )?;
            conn.query_one(
                "SELECT id FROM ingest_fences
                 WHERE account = ?1 AND domain = ?2 AND stream = ?3 AND created = ?4",
                args![&i.account, &i.domain, &i.stream, &i.created],
                |r| r.int(0),
            )?
        }
        IngestOp::Diagnostic {
            fence,
            sequence,
            reason,
        } => {
            let new = conn.execute(
                "INSERT INTO ingest_diagnostics (fence, sequence, reason)
                 VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                args![fence, *sequence as i64, reason],
            )?;
            conn.execute(
                "DELETE FROM ingest_diagnostics WHERE fence = ?1 AND id NOT IN
                     (SELECT id FROM ingest_diagnostics WHERE fence = ?1 ORDER BY id DESC LIMIT ?2)",
                args![fence, DIAGNOSTICS_KEPT],
            )?;
            new as i64
        }
    })
}

impl Storage {
    /// How many events each project has pending and their bytes.
    pub fn ingest_pending_by_project(&self) -> Result<Vec<(String, u64, u64)>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT project, COUNT(*), CAST(COALESCE(SUM(bytes), 0) AS BIGINT) \
                 FROM ingest_pending GROUP BY project",
                args![],
                |r| Ok((r.text(0)?, r.int(1)? as u64, r.int(2)? as u64)),
            )
        })
    }

    /// How many events are pending and their bytes.
    pub fn ingest_pending_totals(&self) -> Result<(u64, u64)> {
        self.with_reader(|db| {
            db.query_one(
                "SELECT COUNT(*), CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM ingest_pending",
                args![],
                |r| Ok((r.int(0)? as u64, r.int(1)? as u64)),
            )
        })
    }

    /// The HTTP ingest events dropped for good by a build from before
    /// parking, oldest first (the latest 64).
    pub fn ingest_drops(&self) -> Result<Vec<DroppedEvent>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT project, path, idempotency_key, reason, dropped_at FROM ingest_drops
                 ORDER BY id",
                args![],
                |r| {
                    Ok(DroppedEvent {
                        project: r.text(0)?,
                        path: r.text(1)?,
                        idempotency_key: r.text(2)?,
                        reason: r.text(3)?,
                        dropped_at: r.text(4)?,
                    })
                },
            )
        })
    }

    /// The streams with pending events, oldest first.
    pub fn ingest_pending_streams(&self) -> Result<Vec<(String, String)>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT project, path, MIN(id) AS first FROM ingest_pending
                 WHERE parked_at IS NULL GROUP BY project, path ORDER BY first",
                args![],
                |r| Ok((r.text(0)?, r.text(1)?)),
            )
        })
    }

    /// A stream's oldest pending events: at most `limit` of them, and no more
    /// than `max_bytes` (but always one).
    pub fn ingest_pending_rows(
        &self,
        project: &str,
        path: &str,
        limit: usize,
        max_bytes: i64,
    ) -> Result<Vec<PendingRow>> {
        self.with_reader(|db| {
            let mut bytes = 0;
            let mut first = true;
            db.query_while(
                "SELECT id, idempotency_key, body, bytes FROM ingest_pending
                 WHERE project = ?1 AND path = ?2 AND parked_at IS NULL ORDER BY id LIMIT ?3",
                args![project, path, limit as i64],
                |r| {
                    let row = PendingRow {
                        id: r.int(0)?,
                        key: r.text(1)?,
                        body: r.text(2)?,
                        bytes: r.int(3)?,
                    };
                    if !first && bytes + row.bytes > max_bytes {
                        return Ok(None);
                    }
                    first = false;
                    bytes += row.bytes;
                    Ok(Some(row))
                },
            )
        })
    }

    /// The body of a pending event holding `key`, if one is pending.
    pub fn ingest_pending_body(
        &self,
        project: &str,
        path: &str,
        key: &str,
    ) -> Result<Option<String>> {
        self.with_reader(|db| {
            db.query_opt(
                "SELECT body FROM ingest_pending
                 WHERE project = ?1 AND path = ?2 AND idempotency_key = ?3",
                args![project, path, key],
                |r| r.text(0),
            )
        })
    }

    /// `project`'s parked events after id `after_id` (of stream `path`
    /// if given), oldest first, at most `limit`.
    pub fn ingest_parked(
        &self,
        project: &str,
        path: Option<&str>,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<ParkedRow>> {
        let limit = limit as i64;
        self.with_reader(|db| match path {
            Some(path) => db.query_all(
                &format!(
                    "SELECT {PARKED_COLUMNS} FROM ingest_pending
                     WHERE project = ?1 AND parked_at IS NOT NULL AND id > ?2 AND path = ?3
                     ORDER BY id LIMIT ?4"
                ),
                args![project, after_id, path, limit],
                parked_row,
            ),
            None => db.query_all(
                &format!(
                    "SELECT {PARKED_COLUMNS} FROM ingest_pending
                     WHERE project = ?1 AND parked_at IS NOT NULL AND id > ?2
                     ORDER BY id LIMIT ?3"
                ),
                args![project, after_id, limit],
                parked_row,
            ),
        })
    }

    /// One parked event of `project`.
    pub fn ingest_parked_one(&self, project: &str, id: i64) -> Result<Option<ParkedRow>> {
        self.with_reader(|db| {
            db.query_opt(
                &format!(
                    "SELECT {PARKED_COLUMNS} FROM ingest_pending
                     WHERE project = ?1 AND id = ?2 AND parked_at IS NOT NULL"
                ),
                args![project, id],
                parked_row,
            )
        })
    }

    /// How many events are parked, per project.
    pub fn ingest_parked_by_project(&self) -> Result<Vec<(String, u64)>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT project, COUNT(*) FROM ingest_pending WHERE parked_at IS NOT NULL
                 GROUP BY project",
                args![],
                |r| Ok((r.text(0)?, r.int(1)? as u64)),
            )
        })
    }

    /// Every fence registered for the stream `name`, newest first.
    pub fn ingest_fences(&self, name: &str) -> Result<Vec<FenceRow>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT id, account, domain, stream, created, registered_at FROM ingest_fences
                 WHERE stream = ?1 ORDER BY id DESC",
                args![name],
                |r| {
                    Ok(FenceRow {
                        id: r.int(0)?,
                        identity: FenceIdentity {
                            account: r.text(1)?,
                            domain: r.text(2)?,
                            stream: r.text(3)?,
                            created: r.text(4)?,
                        },
                        registered_at: r.text(5)?,
                    })
                },
            )
        })
    }

    /// A fence's diagnostics, oldest first: (sequence, reason).
    pub fn ingest_diagnostics(&self, fence: i64) -> Result<Vec<(u64, String)>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT sequence, reason FROM ingest_diagnostics WHERE fence = ?1 ORDER BY id",
                args![fence],
                |r| Ok((r.int(0)? as u64, r.text(1)?)),
            )
        })
    }
}

/// How a project's share is named in a refusal.
pub fn share_of(project: &str) -> String {
    format!(" for project {project:?} (its share, [ingest] max-pending-*-per-project)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{params, Connection};

    fn apply(conn: &Connection, op: &IngestOp) -> Result<i64> {
        super::apply(Db::Sqlite(conn), op)
    }

    fn db() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        crate::schema::migrate(&conn).unwrap();
        conn
    }

    fn fence(conn: &Connection, created: &str) -> i64 {
        apply(
            conn,
            &IngestOp::Register {
                identity: FenceIdentity {
                    account: "$G".into(),
                    domain: String::new(),
                    stream: "STREAMHOST_INGEST".into(),
                    created: created.into(),
                },
                registered_at: "2026-11-30T00:00:00.000Z".into(),
            },
        )
        .unwrap()
    }

    fn diagnostics(conn: &Connection, fence: i64) -> Vec<i64> {
        let mut stmt = conn
            .prepare("SELECT sequence FROM ingest_diagnostics WHERE fence = ?1 ORDER BY id")
            .unwrap();
        stmt.query_map(params![fence], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    #[test]
    fn each_fence_keeps_its_latest_64_diagnostics_once_each() {
        let conn = db();
        let (a, b) = (fence(&conn, "t1"), fence(&conn, "t2"));
        assert_eq!(
            fence(&conn, "t1"),
            a,
            "registering again finds the same fence"
        );
        for seq in 1..=70u64 {
            let op = IngestOp::Diagnostic {
                fence: a,
                sequence: seq,
                reason: format!("bad {seq}"),
            };
            assert_eq!(apply(&conn, &op).unwrap(), 1);
        }
        // Retrying a terminal rejection records nothing new.
        let again = IngestOp::Diagnostic {
            fence: a,
            sequence: 70,
            reason: "bad 70".into(),
        };
        assert_eq!(apply(&conn, &again).unwrap(), 0);
        let b_op = IngestOp::Diagnostic {
            fence: b,
            sequence: 1,
            reason: "other".into(),
        };
        apply(&conn, &b_op).unwrap();
        let kept = diagnostics(&conn, a);
        assert_eq!(kept, (7..=70).collect::<Vec<i64>>());
        assert_eq!(diagnostics(&conn, b), vec![1]);
    }

    #[test]
    fn accepting_a_pending_key_again_stores_nothing_and_says_so() {
        let conn = db();
        let row = |key: &str, body: &str| NewPending {
            project: "acme".into(),
            path: "/a".into(),
            key: key.into(),
            body: body.into(),
            accepted_at: "2026-11-30T00:00:00.000Z".into(),
        };
        let first = apply(
            &conn,
            &IngestOp::Accept {
                rows: vec![row("k1", "abc"), row("k2", "de")],
                bound: None,
            },
        );
        assert_eq!(IngestOp::accepted(first.unwrap()), (2, 5));
        let again = apply(
            &conn,
            &IngestOp::Accept {
                rows: vec![row("k2", "de"), row("k3", "fghi")],
                bound: None,
            },
        );
        assert_eq!(IngestOp::accepted(again.unwrap()), (1, 4));
        let other = apply(
            &conn,
            &IngestOp::Accept {
                rows: vec![row("k4", "x"), row("k1", "zzz")],
                bound: None,
            },
        );
        let e = other.unwrap_err().to_string();
        assert!(e.starts_with(KEY_CONFLICT) && e.ends_with("k1"), "{e}");
        let gone = IngestOp::Appended { ids: vec![1, 2] };
        assert_eq!(IngestOp::accepted(apply(&conn, &gone).unwrap()), (2, 5));
    }

    fn pending(key: &str, body: &str) -> NewPending {
        NewPending {
            project: "acme".into(),
            path: "/a".into(),
            key: key.into(),
            body: body.into(),
            accepted_at: "2026-11-30T00:00:00.000Z".into(),
        }
    }

    fn ids(conn: &Connection) -> Vec<i64> {
        let mut stmt = conn
            .prepare("SELECT id FROM ingest_pending ORDER BY id")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn appended_deletes_exactly_its_rows_never_a_lower_id_it_did_not_append() {
        let conn = db();
        let rows: Vec<NewPending> = (0..250).map(|i| pending(&format!("k{i}"), "xy")).collect();
        apply(&conn, &IngestOp::Accept { rows, bound: None }).unwrap();
        let all = ids(&conn);
        assert_eq!(all.len(), 250);
        // A drain read every row but one in the middle (on PostgreSQL a
        // lower id can commit after higher ones were read): that row stays.
        let appended: Vec<i64> = all.iter().copied().filter(|id| *id != all[120]).collect();
        let answer = apply(
            &conn,
            &IngestOp::Appended {
                ids: appended.clone(),
            },
        )
        .unwrap();
        assert_eq!(IngestOp::accepted(answer), (249, 498));
        assert_eq!(ids(&conn), vec![all[120]]);
        // Deleted again (another host's drain): nothing counted twice.
        let answer = apply(&conn, &IngestOp::Appended { ids: appended }).unwrap();
        assert_eq!(IngestOp::accepted(answer), (0, 0));
    }

    #[test]
    fn a_shared_bound_counts_what_the_table_holds() {
        let conn = db();
        let bound = Some(SharedBound {
            max_events: 3,
            max_bytes: 100,
            project_max_events: 3,
            project_max_bytes: 100,
        });
        let first = apply(
            &conn,
            &IngestOp::Accept {
                rows: vec![pending("a", "1"), pending("b", "2")],
                bound,
            },
        );
        assert_eq!(IngestOp::accepted(first.unwrap()), (2, 2));
        let over = apply(
            &conn,
            &IngestOp::Accept {
                rows: vec![pending("c", "3"), pending("d", "4")],
                bound,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            over.starts_with(CAPACITY_EXHAUSTED) && over.contains("2 of 3 events pending"),
            "{over}"
        );
        let big = apply(
            &conn,
            &IngestOp::Accept {
                rows: vec![pending("e", &"x".repeat(99))],
                bound,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            over.starts_with(CAPACITY_EXHAUSTED) && big.contains("2 of 100 bytes"),
            "{big}"
        );
        let fits = apply(
            &conn,
            &IngestOp::Accept {
                rows: vec![pending("f", "6")],
                bound,
            },
        );
        assert_eq!(IngestOp::accepted(fits.unwrap()), (1, 1));
    }

    #[test]
    fn a_shared_bound_keeps_a_projects_share_apart() {
        let conn = db();
        let bound = Some(SharedBound {
            max_events: 10,
            max_bytes: 1000,
            project_max_events: 2,
            project_max_bytes: 1000,
        });
        let accept = |rows| apply(&conn, &IngestOp::Accept { rows, bound });
        accept(vec![pending("a", "1"), pending("b", "2")]).unwrap();
        let over = accept(vec![pending("c", "3")]).unwrap_err().to_string();
        assert!(
            over.contains("project \"acme\"") && over.contains("2 of 2 events pending"),
            "{over}"
        );
        let other = NewPending {
            project: "other".into(),
            ..pending("c", "3")
        };
        assert_eq!(IngestOp::accepted(accept(vec![other]).unwrap()), (1, 1));
    }
}
