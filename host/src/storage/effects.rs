//! The outbox's SQL: effect rows, their leases and settlements.
//!
//! An effect row is keyed by its identity (project, source path, component,
//! key), so a second insert of the same identity is ignored. `due_at_ms` is
//! when a `pending` effect may run next, or when a `running` effect's lease
//! expires; both are picked up by [`Storage::due_effects`].

use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::Storage;

/// One effect as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectRow {
    pub id: i64,
    pub project: String,
    pub path: String,
    pub stream_id: String,
    pub component: String,
    pub key: String,
    pub checkpoint_offset: u64,
    /// `{"append": {...}}`, `{"webhook": {...}}` or `{"itx": {...}}`.
    pub target: Value,
    pub status: String,
    pub attempts: u32,
    pub due_at_ms: i64,
    pub last_error: Option<String>,
    pub result: Option<Value>,
    pub retries: u32,
    pub created_at: String,
    pub settled_at: Option<String>,
}

/// A new effect for the outbox.
#[derive(Debug, Clone)]
pub struct NewEffect {
    pub key: String,
    /// The stored target, JSON.
    pub target: String,
    pub checkpoint_offset: u64,
}

/// Where new effects come from: a processor instance's source stream.
#[derive(Debug, Clone)]
pub struct EffectSource {
    pub project: String,
    pub path: String,
    pub stream_id: String,
    pub component: String,
}

/// A write to the outbox (besides the effects a checkpoint commits).
#[derive(Debug, Clone)]
pub enum EffectOp {
    /// Backfilled effects; answers how many were new.
    Insert {
        source: EffectSource,
        effects: Vec<NewEffect>,
        now_ms: i64,
        created_at: String,
    },
    /// Leases a due effect for one execution (its `attempts` goes to
    /// `attempts + 1`); answers 1 if leased, 0 if someone else moved it.
    Lease {
        id: i64,
        attempts: u32,
        now_ms: i64,
        lease_until_ms: i64,
    },
    /// Settles the execution `attempts` of a leased effect; answers 0 if
    /// the lease was lost (the row moved on).
    Settle {
        id: i64,
        attempts: u32,
        status: &'static str,
        due_at_ms: i64,
        last_error: Option<String>,
        result: Option<String>,
        settled_at: Option<String>,
    },
    /// `failed` or `cancelled` back to `pending`, attempts reset.
    Retry { id: i64, now_ms: i64 },
    /// `pending` or `failed` to `cancelled`.
    Cancel { id: i64, settled_at: String },
    /// At start: every `running` effect was leased by a process that is
    /// gone (the data dir is locked to one host), so it may run now.
    ReclaimAll { now_ms: i64 },
}

const COLUMNS: &str = "id, project, path, stream_id, component, effect_key, checkpoint_offset, \
     target, status, attempts, due_at_ms, last_error, result, retries, created_at, settled_at";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<EffectRow> {
    let json = |s: Option<String>| s.and_then(|s| serde_json::from_str(&s).ok());
    Ok(EffectRow {
        id: r.get(0)?,
        project: r.get(1)?,
        path: r.get(2)?,
        stream_id: r.get(3)?,
        component: r.get(4)?,
        key: r.get(5)?,
        checkpoint_offset: r.get::<_, i64>(6)? as u64,
        target: json(r.get(7)?).unwrap_or(Value::Null),
        status: r.get(8)?,
        attempts: r.get::<_, i64>(9)? as u32,
        due_at_ms: r.get(10)?,
        last_error: r.get(11)?,
        result: json(r.get(12)?),
        retries: r.get::<_, i64>(13)? as u32,
        created_at: r.get(14)?,
        settled_at: r.get(15)?,
    })
}

/// Filters of the effect list.
#[derive(Debug, Clone, Default)]
pub struct EffectQuery {
    pub project: String,
    pub path: Option<String>,
    pub component: Option<String>,
    pub status: Option<String>,
    pub after_id: i64,
    pub limit: usize,
}

impl Storage {
    /// One effect of a project.
    pub fn effect(&self, project: &str, id: i64) -> Result<Option<EffectRow>> {
        self.with_reader(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM effects WHERE id = ?1 AND project = ?2"
            ))?
            .query_row(params![id, project], row)
            .optional()?)
        })
    }

    /// A page of a project's effects in id order.
    pub fn list_effects(&self, q: &EffectQuery) -> Result<Vec<EffectRow>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM effects
                 WHERE project = ?1 AND id > ?2
                   AND (?3 IS NULL OR path = ?3) AND (?4 IS NULL OR component = ?4)
                   AND (?5 IS NULL OR status = ?5)
                 ORDER BY id LIMIT ?6"
            ))?;
            let rows = stmt
                .query_map(
                    params![
                        q.project,
                        q.after_id,
                        q.path,
                        q.component,
                        q.status,
                        q.limit as i64
                    ],
                    row,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// Effects that may run now: `pending` ones that are due and `running`
    /// ones whose lease expired, soonest first.
    pub fn due_effects(&self, now_ms: i64, limit: usize) -> Result<Vec<EffectRow>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM effects
                 WHERE status IN ('pending', 'running') AND due_at_ms <= ?1
                 ORDER BY due_at_ms, id LIMIT ?2"
            ))?;
            let rows = stmt
                .query_map(params![now_ms, limit as i64], row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// When the next effect falls due (a retry or an expiring lease).
    pub fn next_effect_due(&self) -> Result<Option<i64>> {
        self.with_reader(|c| {
            Ok(c.prepare_cached(
                "SELECT MIN(due_at_ms) FROM effects WHERE status IN ('pending', 'running')",
            )?
            .query_row([], |r| r.get::<_, Option<i64>>(0))?)
        })
    }
}

/// Inserts effects, ignoring identities already stored; answers how many
/// were new.
pub(super) fn insert(
    conn: &Connection,
    source: &EffectSource,
    effects: &[NewEffect],
    now_ms: i64,
    created_at: &str,
) -> Result<i64> {
    let mut stmt = conn.prepare_cached(
        "INSERT OR IGNORE INTO effects (project, path, stream_id, component, effect_key,
             checkpoint_offset, target, status, due_at_ms, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8, ?9)",
    )?;
    let mut created = 0;
    for e in effects {
        created += stmt.execute(params![
            source.project,
            source.path,
            source.stream_id,
            source.component,
            e.key,
            e.checkpoint_offset as i64,
            e.target,
            now_ms,
            created_at
        ])? as i64;
    }
    Ok(created)
}

pub(super) fn apply(conn: &Connection, op: &EffectOp) -> Result<i64> {
    let changed = match op {
        EffectOp::Insert {
            source,
            effects,
            now_ms,
            created_at,
        } => return insert(conn, source, effects, *now_ms, created_at),
        EffectOp::Lease {
            id,
            attempts,
            now_ms,
            lease_until_ms,
        } => conn
            .prepare_cached(
                "UPDATE effects SET status = 'running', attempts = attempts + 1, due_at_ms = ?4
                 WHERE id = ?1 AND attempts = ?2 AND status IN ('pending', 'running')
                   AND due_at_ms <= ?3",
            )?
            .execute(params![id, attempts, now_ms, lease_until_ms])?,
        EffectOp::Settle {
            id,
            attempts,
            status,
            due_at_ms,
            last_error,
            result,
            settled_at,
        } => conn
            .prepare_cached(
                "UPDATE effects SET status = ?3, due_at_ms = ?4, last_error = ?5, result = ?6,
                     settled_at = ?7
                 WHERE id = ?1 AND attempts = ?2 AND status = 'running'",
            )?
            .execute(params![
                id, attempts, status, due_at_ms, last_error, result, settled_at
            ])?,
        EffectOp::Retry { id, now_ms } => conn
            .prepare_cached(
                "UPDATE effects SET status = 'pending', attempts = 0, due_at_ms = ?2,
                     retries = retries + 1, settled_at = NULL
                 WHERE id = ?1 AND status IN ('failed', 'cancelled')",
            )?
            .execute(params![id, now_ms])?,
        EffectOp::ReclaimAll { now_ms } => conn
            .prepare_cached(
                "UPDATE effects SET status = 'pending', due_at_ms = ?1 WHERE status = 'running'",
            )?
            .execute(params![now_ms])?,
        EffectOp::Cancel { id, settled_at } => conn
            .prepare_cached(
                "UPDATE effects SET status = 'cancelled', settled_at = ?2
                 WHERE id = ?1 AND status IN ('pending', 'failed')",
            )?
            .execute(params![id, settled_at])?,
    };
    Ok(changed as i64)
}
