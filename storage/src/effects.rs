//! The outbox's SQL: effect rows, their leases and settlements.
//!
//! An effect row is keyed by its identity (project, source path, component,
//! key), so a second insert of the same identity is ignored. `due_at_ms` is
//! when a `pending` effect may run next, or when a `running` effect's lease
//! expires; both are picked up by [`Storage::due_effects`].
//!
//! Leases: each lease bumps the row's `lease_id` (never reset, not even by
//! `:retry`), and a settlement names the lease it settles, so a stale
//! executor never settles a later execution. On PostgreSQL (several hosts)
//! every time in this table is the database's clock: a host whose clock
//! runs ahead does not take another's running effect early.

use anyhow::Result;
use serde_json::Value;

use super::sql::{args, Arg, Db, Row};
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
    /// The lease it runs under (0: never leased).
    pub lease_id: i64,
    /// Not attempted before this time (ms since the epoch).
    pub not_before_ms: Option<i64>,
    /// A webhook's destination host name (`None`: not a webhook, or stored
    /// before destinations were kept).
    pub destination: Option<String>,
}

/// A new effect for the outbox.
#[derive(Debug, Clone, Default)]
pub struct NewEffect {
    pub key: String,
    /// The stored target, JSON.
    pub target: String,
    pub checkpoint_offset: u64,
    /// Not attempted before this time (ms since the epoch; on PostgreSQL
    /// compared with the database's clock).
    pub not_before_ms: Option<i64>,
    /// For a `cancel` target: the key of the same consumer's effect it
    /// cancels if that is pending, in the commit that stores it.
    pub cancels: Option<String>,
    /// Its ordering group: effects of one consumer and group run one at a
    /// time, in commit order.
    pub group: Option<String>,
    /// A webhook's destination host name ([`DestinationRoom`]).
    pub destination: Option<String>,
}

/// How many more effects each webhook destination may take in one look
/// for due effects: `room` for the destinations named (0: full, none is
/// read), `cap` for any other ([`Storage::due_effects`],
/// [`Storage::lease_due_effects`]).
#[derive(Debug, Clone, Default)]
pub struct DestinationRoom {
    pub cap: usize,
    pub room: Vec<(String, usize)>,
}

impl DestinationRoom {
    /// The room `destination` has.
    pub fn of(&self, destination: &str) -> usize {
        self.room
            .iter()
            .find(|(d, _)| d == destination)
            .map_or(self.cap, |(_, n)| *n)
    }

    /// Takes one place of `destination` (none: not a webhook, always
    /// room); false when it has none left.
    pub fn take(&mut self, destination: Option<&str>) -> bool {
        let Some(d) = destination else {
            return true;
        };
        match self.room.iter_mut().find(|(name, _)| name == d) {
            Some((_, 0)) => false,
            Some((_, n)) => {
                *n -= 1;
                true
            }
            None if self.cap == 0 => false,
            None => {
                self.room.push((d.to_string(), self.cap - 1));
                true
            }
        }
    }

    /// The destinations with no room left.
    pub fn full(&self) -> Vec<&str> {
        self.room
            .iter()
            .filter(|(_, n)| *n == 0)
            .map(|(d, _)| d.as_str())
            .collect()
    }
}

impl NewEffect {
    /// A checked effect of the checkpoint at `checkpoint_offset`.
    pub fn of(checked: streamhost_core::effect::Checked, checkpoint_offset: u64) -> NewEffect {
        NewEffect {
            key: checked.key,
            target: checked.stored.to_string(),
            checkpoint_offset,
            not_before_ms: checked.not_before_ms,
            cancels: checked.cancels,
            group: checked.group,
            destination: checked.destination,
        }
    }

    /// The status it is stored with: a cancel is done once stored (it
    /// applies in the same commit).
    fn status(&self) -> &'static str {
        match self.cancels {
            Some(_) => "succeeded",
            None => "pending",
        }
    }
}

/// A due effect to lease, as it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leasing {
    pub id: i64,
    pub attempts: u32,
    pub lease_id: i64,
}

impl Leasing {
    pub fn of(row: &EffectRow) -> Leasing {
        Leasing {
            id: row.id,
            attempts: row.attempts,
            lease_id: row.lease_id,
        }
    }
}

/// Where new effects come from: a processor instance's source stream.
#[derive(Debug, Clone)]
pub struct EffectSource {
    pub project: String,
    pub path: String,
    pub stream_id: String,
    pub component: String,
}

/// Effects to insert with a stream's commit (a reactor's, over one round).
#[derive(Debug, Clone)]
pub struct EffectInsert {
    pub source: EffectSource,
    pub effects: Vec<NewEffect>,
    pub now_ms: i64,
    pub created_at: String,
}

/// The append effects whose events a stream's commit stores: settled
/// `succeeded` in that commit's own transaction (the events and their
/// effects' settlements commit together), those running, in one
/// statement. A row in any other state is left as it is: its executor
/// settles it on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendSettled {
    /// The effects' ids in the outbox (each found by its primary key: a
    /// lookup by its identity could take a stream's other effects' index
    /// on PostgreSQL, scanning them all).
    pub ids: Vec<i64>,
    pub now_ms: i64,
    pub settled_at: String,
}

impl AppendSettled {
    /// The statement in `dialect`; its arguments are the ids (SQLite: a
    /// JSON array; PostgreSQL: `BIGINT[]`), `settled_at` and (SQLite)
    /// `now_ms` (on PostgreSQL the time is the database's, as every
    /// settlement's).
    pub(super) fn sql(dialect: super::sql::Dialect) -> &'static str {
        match dialect {
            super::sql::Dialect::Sqlite => {
                "UPDATE effects SET status = 'succeeded', due_at_ms = ?3, last_error = NULL,
                     result = NULL, settled_at = ?2
                 WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'running'"
            }
            super::sql::Dialect::Postgres => {
                "UPDATE effects SET status = 'succeeded',
                     due_at_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT),
                     last_error = NULL, result = NULL, settled_at = ?2
                 WHERE id = ANY(CAST(?1 AS BIGINT[])) AND status = 'running'"
            }
        }
    }

    /// Writes it on `conn` (SQLite, or PostgreSQL outside a pipeline).
    pub(super) fn write(&self, conn: Db<'_>) -> Result<u64> {
        let dialect = conn.dialect();
        match dialect {
            super::sql::Dialect::Sqlite => {
                let ids = serde_json::to_string(&self.ids)?;
                conn.execute(
                    Self::sql(dialect),
                    &[
                        Arg::Text(&ids),
                        Arg::Text(&self.settled_at),
                        Arg::Int(self.now_ms),
                    ],
                )
            }
            super::sql::Dialect::Postgres => {
                let ids = self.pg_ids();
                conn.execute(
                    Self::sql(dialect),
                    &[Arg::Ints(&ids), Arg::Text(&self.settled_at)],
                )
            }
        }
    }

    /// The ids as PostgreSQL's array argument takes them.
    pub(super) fn pg_ids(&self) -> Vec<Option<i64>> {
        self.ids.iter().copied().map(Some).collect()
    }
}

/// PostgreSQL's one statement inserting many effects (on the database's
/// clock), as the writer's pipeline and a lone insert both send it.
pub(super) struct PgInsert<'a> {
    source: &'a EffectSource,
    created_at: &'a str,
    keys: Vec<Option<&'a str>>,
    offsets: Vec<Option<i64>>,
    targets: Vec<Option<&'a str>>,
    not_before: Vec<Option<i64>>,
    statuses: Vec<Option<&'a str>>,
    /// The keys the cancels among them cancel.
    cancelled: Vec<Option<&'a str>>,
    groups: Vec<Option<&'a str>>,
    destinations: Vec<Option<&'a str>>,
}

impl<'a> PgInsert<'a> {
    pub(super) fn of(
        source: &'a EffectSource,
        effects: &'a [NewEffect],
        created_at: &'a str,
    ) -> PgInsert<'a> {
        PgInsert {
            source,
            created_at,
            keys: effects.iter().map(|e| Some(e.key.as_str())).collect(),
            offsets: effects
                .iter()
                .map(|e| Some(e.checkpoint_offset as i64))
                .collect(),
            targets: effects.iter().map(|e| Some(e.target.as_str())).collect(),
            not_before: effects.iter().map(|e| e.not_before_ms).collect(),
            statuses: effects.iter().map(|e| Some(e.status())).collect(),
            groups: effects.iter().map(|e| e.group.as_deref()).collect(),
            destinations: effects.iter().map(|e| e.destination.as_deref()).collect(),
            cancelled: effects
                .iter()
                .filter_map(|e| e.cancels.as_deref())
                .map(Some)
                .collect(),
        }
    }

    /// The insert: a delayed effect is due at its `not-before` or now,
    /// whichever is later (the database's clock); a cancel is stored done
    /// and settled.
    pub(super) fn sql(&self) -> &'static str {
        const SQL: &str = "INSERT INTO effects (project, path, stream_id, component, effect_key,
                 checkpoint_offset, target, status, due_at_ms, created_at, not_before_ms, settled_at,
                 group_key, destination)
             SELECT ?1, ?2, ?3, ?4, k, o, t, s,
                    GREATEST(CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT), nb), ?8,
                    nb, CASE WHEN s = 'pending' THEN NULL ELSE ?8 END, g, d
             FROM UNNEST(CAST(?5 AS TEXT[]), CAST(?6 AS BIGINT[]), CAST(?7 AS TEXT[]),
                         CAST(?9 AS BIGINT[]), CAST(?10 AS TEXT[]), CAST(?11 AS TEXT[]),
                         CAST(?12 AS TEXT[]))
                  AS u(k, o, t, nb, s, g, d)
             ON CONFLICT DO NOTHING";
        SQL
    }

    /// The cancels' statement, after the insert in the same transaction;
    /// `None` when there are none.
    pub(super) fn cancel(&'a self) -> Option<(&'static str, Vec<Arg<'a>>)> {
        if self.cancelled.is_empty() {
            return None;
        }
        let source = self.source;
        Some((
            CANCEL_PENDING_POSTGRES,
            vec![
                Arg::Text(&source.project),
                Arg::Text(&source.path),
                Arg::Text(&source.component),
                Arg::Texts(&self.cancelled),
                Arg::Text(self.created_at),
            ],
        ))
    }

    pub(super) fn args(&'a self) -> Vec<Arg<'a>> {
        let source = self.source;
        vec![
            Arg::Text(&source.project),
            Arg::Text(&source.path),
            Arg::Text(&source.stream_id),
            Arg::Text(&source.component),
            Arg::Texts(&self.keys),
            Arg::Ints(&self.offsets),
            Arg::Texts(&self.targets),
            Arg::Text(self.created_at),
            Arg::Ints(&self.not_before),
            Arg::Texts(&self.statuses),
            Arg::Texts(&self.groups),
            Arg::Texts(&self.destinations),
        ]
    }
}

/// Cancels the pending effects of one consumer on one stream whose keys
/// are in `?4` (PostgreSQL).
const CANCEL_PENDING_POSTGRES: &str = "UPDATE effects SET status = 'cancelled', settled_at = ?5
     WHERE project = ?1 AND path = ?2 AND component = ?3 AND status = 'pending'
       AND effect_key = ANY(CAST(?4 AS TEXT[]))";

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
    /// Leases due effects, each for one execution, in one statement: an
    /// effect is leased only while it is as it was read (due, neither
    /// settled nor leased since: the same attempts and lease id), its
    /// `attempts` and `lease_id` then one more. Answers how many were
    /// leased.
    Lease {
        effects: Vec<Leasing>,
        now_ms: i64,
        lease_until_ms: i64,
    },
    /// Settles the execution under lease `lease_id`; answers 0 if the
    /// lease was lost (the row moved on). `due_at_ms` is on the host's
    /// clock as of `now_ms` (PostgreSQL: moved to the database's).
    Settle {
        id: i64,
        lease_id: i64,
        now_ms: i64,
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
    ReclaimAll {
        now_ms: i64,
        /// With several hosts: only the effects of streams this host (its
        /// id kept in the data dir across restarts) owns.
        owner: Option<String>,
    },
}

const COLUMNS: &str = "id, project, path, stream_id, component, effect_key, checkpoint_offset, \
     target, status, attempts, due_at_ms, last_error, result, retries, created_at, settled_at, \
     lease_id, not_before_ms, destination";

fn row(r: &Row<'_>) -> Result<EffectRow> {
    let json = |s: Option<String>| s.and_then(|s| serde_json::from_str(&s).ok());
    Ok(EffectRow {
        id: r.int(0)?,
        project: r.text(1)?,
        path: r.text(2)?,
        stream_id: r.text(3)?,
        component: r.text(4)?,
        key: r.text(5)?,
        checkpoint_offset: r.int(6)? as u64,
        target: json(r.opt_text(7)?).unwrap_or(Value::Null),
        status: r.text(8)?,
        attempts: r.int(9)? as u32,
        due_at_ms: r.int(10)?,
        last_error: r.opt_text(11)?,
        result: json(r.opt_text(12)?),
        retries: r.int(13)? as u32,
        created_at: r.text(14)?,
        settled_at: r.opt_text(15)?,
        lease_id: r.int(16)?,
        not_before_ms: r.opt_int(17)?,
        destination: r.opt_text(18)?,
    })
}

/// Filters of the effect list.
#[derive(Debug, Clone, Default)]
pub struct EffectQuery {
    pub project: String,
    pub path: Option<String>,
    pub component: Option<String>,
    pub status: Option<String>,
    /// Only effects that will run by this time: pending ones due at or
    /// before it (ms since the epoch).
    pub due_before_ms: Option<i64>,
    pub after_id: i64,
    pub limit: usize,
}

impl Storage {
    /// One effect of a project.
    pub fn effect(&self, project: &str, id: i64) -> Result<Option<EffectRow>> {
        self.with_reader(|db| {
            db.query_opt(
                &format!("SELECT {COLUMNS} FROM effects WHERE id = ?1 AND project = ?2"),
                args![id, project],
                row,
            )
        })
    }

    /// The effect of a consumer with `key` on the stream at `path`.
    pub fn effect_by_key(
        &self,
        project: &str,
        path: &str,
        component: &str,
        key: &str,
    ) -> Result<Option<EffectRow>> {
        self.with_reader(|db| {
            db.query_opt(
                &format!(
                    "SELECT {COLUMNS} FROM effects
                     WHERE project = ?1 AND path = ?2 AND component = ?3 AND effect_key = ?4"
                ),
                args![project, path, component, key],
                row,
            )
        })
    }

    /// At most `limit` effects of the stream at `path` (lifetime
    /// `stream_id`) committed with a checkpoint at or after `offset`, in
    /// id order: those an event at `offset` may have caused.
    pub fn effects_from_checkpoint(
        &self,
        project: &str,
        path: &str,
        stream_id: &str,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<EffectRow>> {
        self.with_reader(|db| {
            db.query_all(
                &format!(
                    "SELECT {COLUMNS} FROM effects
                     WHERE project = ?1 AND path = ?2 AND stream_id = ?3 AND checkpoint_offset >= ?4
                     ORDER BY id LIMIT ?5"
                ),
                args![project, path, stream_id, offset as i64, limit as i64],
                row,
            )
        })
    }

    /// A page of a project's effects in id order.
    pub fn list_effects(&self, q: &EffectQuery) -> Result<Vec<EffectRow>> {
        self.with_reader(|db| {
            db.query_all(
                &format!(
                    "SELECT {COLUMNS} FROM effects
                     WHERE project = ?1 AND id > ?2
                       AND (CAST(?3 AS TEXT) IS NULL OR path = ?3)
                       AND (CAST(?4 AS TEXT) IS NULL OR component = ?4)
                       AND (CAST(?5 AS TEXT) IS NULL OR status = ?5)
                       AND (CAST(?7 AS BIGINT) IS NULL OR (status = 'pending' AND due_at_ms <= ?7))
                     ORDER BY id LIMIT ?6"
                ),
                args![
                    &q.project,
                    q.after_id,
                    &q.path,
                    &q.component,
                    &q.status,
                    q.limit as i64,
                    q.due_before_ms
                ],
                row,
            )
        })
    }

    /// Effects that may run now: `pending` ones that are due and `running`
    /// ones whose lease expired, soonest first, none of the projects
    /// `passed_projects` or to the destinations `full`. With several hosts,
    /// only those of streams this host owns (effects run on the owner; a
    /// dead owner's run where its streams are taken over).
    pub fn due_effects(
        &self,
        now_ms: i64,
        limit: usize,
        passed_projects: &[String],
        full: &[&str],
    ) -> Result<Vec<EffectRow>> {
        let owner = self.cluster().map(|me| me.id.clone());
        let passed = serde_json::to_string(passed_projects)?;
        let full = serde_json::to_string(full)?;
        self.with_reader(|db| {
            let now_ms = db_now(db, now_ms)?;
            let not_passed = not_in(db, "project", 3);
            let not_full = not_in(db, "destination", 4);
            let owned = owned_if(owner.is_some(), 5);
            // The oldest of each status, each read in its index's order
            // (`effects_due`: status, due time, id), then merged: one read
            // of both statuses at once would sort every due row before its
            // limit, a look costing as much as the whole backlog.
            let oldest = |status: &str| {
                format!(
                    "SELECT {COLUMNS} FROM effects
                     WHERE status = '{status}' AND due_at_ms <= ?1 {not_passed} {owned}
                       {not_full} {GROUP_HEAD}
                     ORDER BY due_at_ms, id LIMIT ?2"
                )
            };
            let sql = format!(
                "SELECT {COLUMNS} FROM ({}) AS pending_due
                 UNION ALL SELECT {COLUMNS} FROM ({}) AS lapsed_due
                 ORDER BY due_at_ms, id LIMIT ?2",
                oldest("pending"),
                oldest("running")
            );
            match &owner {
                None => db.query_all(
                    &sql,
                    args![now_ms, limit as i64, passed.as_str(), full.as_str()],
                    row,
                ),
                Some(owner) => db.query_all(
                    &sql,
                    args![now_ms, limit as i64, passed.as_str(), full.as_str(), owner],
                    row,
                ),
            }
        })
    }

    /// Several hosts (PostgreSQL): leases up to `limit` due effects of the
    /// streams this host owns in one statement, each for one execution
    /// (`attempts + 1`, a new `lease_id`, due again `lease_ms` from now on
    /// the database's clock), and answers them. `FOR UPDATE SKIP LOCKED`:
    /// a row another transaction holds is left to it, not waited for.
    /// `running_here` are the effects this host is still executing (a lease
    /// that expired under a slow execution is not taken twice); each
    /// destination takes no more than its `room`. `None` on SQLite, whose
    /// one writer leases through [`EffectOp::Lease`].
    pub fn lease_due_effects(
        &self,
        lease_ms: i64,
        limit: usize,
        running_here: &[i64],
        passed_projects: &[String],
        room: &DestinationRoom,
    ) -> Result<Option<Vec<EffectRow>>> {
        let Some(me) = self.cluster() else {
            return Ok(None);
        };
        let running: Vec<Option<i64>> = running_here.iter().map(|id| Some(*id)).collect();
        let passed: Vec<Option<&str>> = passed_projects.iter().map(|p| Some(p.as_str())).collect();
        let full: Vec<Option<&str>> = room.full().into_iter().map(Some).collect();
        let named: Vec<Option<&str>> = room.room.iter().map(|(d, _)| Some(d.as_str())).collect();
        let rooms: Vec<Option<i64>> = room.room.iter().map(|(_, n)| Some(*n as i64)).collect();
        // The oldest due rows of each status are locked as candidates,
        // each status read in its index's order (`effects_due`: one read of
        // both statuses at once sorts every due row before its limit, a
        // lease costing as much as the whole backlog); of the oldest of
        // both, each destination's first `room` (by due time) are leased,
        // the others let go at the commit.
        let oldest = |status: &str| {
            format!(
                "SELECT id, due_at_ms, destination FROM effects
                 WHERE status = '{status}' AND due_at_ms <= (SELECT ms FROM now)
                   AND NOT (id = ANY(?4)) AND NOT (project = ANY(?5)) {}
                   AND (destination IS NULL OR NOT (destination = ANY(?6)))
                   {GROUP_HEAD}
                 ORDER BY due_at_ms, id LIMIT ?2
                 FOR UPDATE OF effects SKIP LOCKED",
                owned_by(3)
            )
        };
        let sql = format!(
            "WITH now AS (
                 SELECT {PG_NOW_MS} AS ms
             ), pending_due AS (
                 {}
             ), lapsed_due AS (
                 {}
             ), candidates AS (
                 SELECT * FROM pending_due UNION ALL SELECT * FROM lapsed_due
                 ORDER BY due_at_ms, id LIMIT ?2
             ), due AS (
                 SELECT id FROM (
                     SELECT id, destination,
                            ROW_NUMBER() OVER (PARTITION BY destination ORDER BY due_at_ms, id) AS n
                     FROM candidates
                 ) c
                 WHERE c.destination IS NULL OR c.n <= COALESCE(
                     (SELECT r.room FROM UNNEST(CAST(?7 AS TEXT[]), CAST(?8 AS BIGINT[])) AS r(d, room)
                      WHERE r.d = c.destination), ?9)
             )
             UPDATE effects SET status = 'running', attempts = attempts + 1,
                 due_at_ms = (SELECT ms FROM now) + ?1, lease_id = lease_id + 1
             FROM due WHERE effects.id = due.id
             RETURNING {}",
            oldest("pending"),
            oldest("running"),
            COLUMNS
                .split(", ")
                .map(|c| format!("effects.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let args = [
            Arg::Int(lease_ms),
            Arg::Int(limit as i64),
            Arg::Text(&me.id),
            Arg::Ints(&running),
            Arg::Texts(&passed),
            Arg::Texts(&full),
            Arg::Texts(&named),
            Arg::Ints(&rooms),
            Arg::Int(room.cap as i64),
        ];
        self.with_reader(|db| {
            let Db::Postgres(pg) = db else {
                anyhow::bail!("several hosts run on PostgreSQL");
            };
            // Its own transaction, whose commit waits for no fsync: a lease
            // lost in a crash of the database only lets the effect run
            // again (at least once), which its target's idempotency covers.
            // Each status is read in its index's order, never sorted whole:
            // the planner, unsure how many due rows pass the filters, would
            // sort the whole backlog for its first rows (20 ms and more a
            // lease over 20,000 due effects, where the index's order takes
            // 1–2 ms), and compile it with JIT at that cost.
            let answers = pg.pipeline(&[
                ("BEGIN", &[]),
                ("SET LOCAL synchronous_commit TO off", &[]),
                ("SET LOCAL enable_sort TO off", &[]),
                ("SET LOCAL jit TO off", &[]),
                (&sql, &args),
                ("COMMIT", &[]),
            ])?;
            let mut leased = Vec::new();
            for (n, answer) in answers.into_iter().enumerate() {
                match answer {
                    Ok(rows) if n == 4 => {
                        for r in &rows {
                            leased.push(row(&Row::Postgres(r))?);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = db.control("ROLLBACK");
                        return Err(anyhow::Error::from(e).context("leasing due effects"));
                    }
                }
            }
            // RETURNING follows no order: the oldest first.
            leased.sort_by_key(|r| r.id);
            Ok(Some(leased))
        })
    }

    /// How many effects are pending, running and failed (the statuses not
    /// done; succeeded and cancelled rows are history), and `waiting`: the
    /// pending ones not due yet at `now_ms` (a `not-before`, a backoff).
    pub fn effect_counts(&self, now_ms: i64) -> Result<Vec<(String, i64)>> {
        self.with_reader(|db| {
            let now_ms = db_now(db, now_ms)?;
            let mut counts = db.query_all(
                "SELECT status, COUNT(*) FROM effects
                 WHERE status IN ('pending', 'running', 'failed') GROUP BY status",
                args![],
                |r| Ok((r.text(0)?, r.int(1)?)),
            )?;
            counts.push(db.query_one(
                "SELECT 'waiting', COUNT(*) FROM effects WHERE status = 'pending' AND due_at_ms > ?1",
                args![now_ms],
                |r| Ok((r.text(0)?, r.int(1)?)),
            )?);
            Ok(counts)
        })
    }

    /// When the next effect falls due (a retry or an expiring lease; an
    /// effect behind an earlier one of its group is not due before it);
    /// with several hosts, of the streams this host owns.
    pub fn next_effect_due(&self) -> Result<Option<i64>> {
        let owner = self.cluster().map(|me| me.id.clone());
        let owned = owned_if(owner.is_some(), 1);
        // The first of each status in its index's order (a `MIN` over
        // both statuses at once reads every row not done).
        let first = |status: &str| {
            format!(
                "(SELECT due_at_ms FROM effects WHERE status = '{status}' {owned} {GROUP_HEAD}
                  ORDER BY due_at_ms LIMIT 1)"
            )
        };
        let sql = format!(
            "SELECT MIN(due) FROM (SELECT {} AS due UNION ALL SELECT {}) AS firsts",
            first("pending"),
            first("running")
        );
        self.with_reader(|db| match &owner {
            None => db.query_one(&sql, args![], |r| r.opt_int(0)),
            Some(owner) => db.query_one(&sql, args![owner], |r| r.opt_int(0)),
        })
    }
}

/// `AND` the row's `column` (NULL passes) is none of the JSON array of
/// names bound at `?n`.
fn not_in(db: Db<'_>, column: &str, n: usize) -> String {
    let names = match db.dialect() {
        super::sql::Dialect::Sqlite => format!("SELECT value FROM json_each(?{n})"),
        super::sql::Dialect::Postgres => {
            format!("SELECT jsonb_array_elements_text(CAST(CAST(?{n} AS TEXT) AS jsonb))")
        }
    };
    format!("AND ({column} IS NULL OR {column} NOT IN ({names}))")
}

/// Effects of one consumer (its source stream and component) with the same
/// `group` run one at a time, in commit order: one is due only when no
/// earlier effect of its group is unsettled (`pending`, `running`, or
/// `failed` until `:retry` or `:cancel` settles it). Effects without a
/// group run independently. A condition on a row of `effects` (the index
/// `effects_group_open`, of the groups' effects not done, finds the
/// earlier ones).
pub const GROUP_HEAD: &str = "AND (effects.group_key IS NULL OR NOT EXISTS (
         SELECT 1 FROM effects earlier
         WHERE earlier.project = effects.project AND earlier.path = effects.path
           AND earlier.component = effects.component AND earlier.group_key = effects.group_key
           AND earlier.id < effects.id AND earlier.status IN ('pending', 'running', 'failed')))";

/// With several hosts (PostgreSQL; parameter `?n` is this host's id): the
/// effect's source stream is owned by this host, or by none yet.
/// (`NOT EXISTS`, not a comparison with the owner a subquery finds: the
/// planner takes that for a rare match and sorts every due row for the
/// first few.)
fn owned_by(n: usize) -> String {
    format!(
        "AND NOT EXISTS (SELECT 1 FROM stream_leases l
             WHERE l.project = effects.project AND l.path = effects.path AND l.owner <> ?{n})"
    )
}

/// [`owned_by`] with several hosts, nothing on one.
fn owned_if(several_hosts: bool, n: usize) -> String {
    if several_hosts {
        owned_by(n)
    } else {
        String::new()
    }
}

/// PostgreSQL's clock in milliseconds since the epoch, as SQL.
const PG_NOW_MS: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

/// The time to use in this table: `host_now_ms` on SQLite (one host, its
/// injected clock), the database's clock on PostgreSQL (several hosts).
pub(super) fn db_now(conn: Db<'_>, host_now_ms: i64) -> Result<i64> {
    match conn.dialect() {
        super::sql::Dialect::Sqlite => Ok(host_now_ms),
        super::sql::Dialect::Postgres => conn.query_one(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
            args![],
            |r| r.int(0),
        ),
    }
}

/// Inserts effects, ignoring identities already stored; answers how many
/// were new.
pub(super) fn insert(
    conn: Db<'_>,
    source: &EffectSource,
    effects: &[NewEffect],
    now_ms: i64,
    created_at: &str,
) -> Result<i64> {
    if effects.is_empty() {
        return Ok(0);
    }
    if conn.dialect() == super::sql::Dialect::Postgres {
        // One statement for all of them, on the database's clock.
        let pg = PgInsert::of(source, effects, created_at);
        let created = conn.execute(pg.sql(), &pg.args())? as i64;
        if let Some((sql, args)) = pg.cancel() {
            conn.execute(sql, &args)?;
        }
        return Ok(created);
    }
    let mut created = 0;
    for e in effects {
        let status = e.status();
        created += conn.execute(
            "INSERT INTO effects (project, path, stream_id, component, effect_key,
                 checkpoint_offset, target, status, due_at_ms, created_at, not_before_ms, settled_at,
                 group_key, destination)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
             ON CONFLICT DO NOTHING",
            args![
                &source.project,
                &source.path,
                &source.stream_id,
                &source.component,
                &e.key,
                e.checkpoint_offset as i64,
                &e.target,
                status,
                e.not_before_ms.map_or(now_ms, |nb| nb.max(now_ms)),
                created_at,
                e.not_before_ms,
                (status != "pending").then_some(created_at),
                &e.group,
                &e.destination
            ],
        )? as i64;
    }
    // A cancel applies after every effect of its commit is stored.
    for cancelled in effects.iter().filter_map(|e| e.cancels.as_deref()) {
        conn.execute(
            "UPDATE effects SET status = 'cancelled', settled_at = ?5
             WHERE project = ?1 AND path = ?2 AND component = ?3 AND status = 'pending'
               AND effect_key = ?4",
            args![
                &source.project,
                &source.path,
                &source.component,
                cancelled,
                created_at
            ],
        )?;
    }
    Ok(created)
}

/// A settlement's one statement and its `?4`: on PostgreSQL the due time
/// moves to the database's clock inside the statement (no round trip to
/// read it first).
pub(super) fn settle_statement(
    dialect: super::sql::Dialect,
    now_ms: i64,
    due_at_ms: i64,
) -> (&'static str, i64) {
    match dialect {
        super::sql::Dialect::Sqlite => (
            "UPDATE effects SET status = ?3, due_at_ms = ?4, last_error = ?5, result = ?6,
                 settled_at = ?7
             WHERE id = ?1 AND lease_id = ?2 AND status = 'running'",
            due_at_ms,
        ),
        super::sql::Dialect::Postgres => (
            "UPDATE effects SET status = ?3,
                 due_at_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + ?4,
                 last_error = ?5, result = ?6, settled_at = ?7
             WHERE id = ?1 AND lease_id = ?2 AND status = 'running' RETURNING id",
            due_at_ms - now_ms,
        ),
    }
}

/// A settlement as its one statement and arguments in `dialect` (on
/// PostgreSQL each row it answers is a row it changed); `None` for any
/// other write. The writer pipelines PostgreSQL's.
pub(super) fn settle_write(
    dialect: super::sql::Dialect,
    op: &EffectOp,
) -> Option<(&'static str, Vec<Arg<'_>>)> {
    let EffectOp::Settle {
        id,
        lease_id,
        now_ms,
        status,
        due_at_ms,
        last_error,
        result,
        settled_at,
    } = op
    else {
        return None;
    };
    let (sql, due) = settle_statement(dialect, *now_ms, *due_at_ms);
    Some((
        sql,
        vec![
            Arg::Int(*id),
            Arg::Int(*lease_id),
            Arg::Text(status),
            Arg::Int(due),
            Arg::from(last_error),
            Arg::from(result),
            Arg::from(settled_at),
        ],
    ))
}

pub(super) fn apply(conn: Db<'_>, op: &EffectOp) -> Result<i64> {
    let changed = match op {
        EffectOp::Insert {
            source,
            effects,
            now_ms,
            created_at,
        } => return insert(conn, source, effects, *now_ms, created_at),
        EffectOp::Lease {
            effects,
            now_ms,
            lease_until_ms,
        } => {
            let now = db_now(conn, *now_ms)?;
            let until = now + (lease_until_ms - now_ms);
            let named: Vec<[i64; 3]> = effects
                .iter()
                .map(|e| [e.id, i64::from(e.attempts), e.lease_id])
                .collect();
            let named = serde_json::to_string(&named)?;
            // Each named row found by its id (SQLite: `+` keeps the due
            // index out, which would read every due row).
            let (leasing, due) = match conn.dialect() {
                super::sql::Dialect::Sqlite => (
                    "SELECT value ->> 0 AS id, value ->> 1 AS attempts, value ->> 2 AS lease_id
                     FROM json_each(?1)",
                    "+effects.status IN ('pending', 'running') AND +effects.due_at_ms <= ?2",
                ),
                super::sql::Dialect::Postgres => (
                    "SELECT CAST(e ->> 0 AS BIGINT) AS id, CAST(e ->> 1 AS BIGINT) AS attempts,
                            CAST(e ->> 2 AS BIGINT) AS lease_id
                     FROM jsonb_array_elements(CAST(CAST(?1 AS TEXT) AS jsonb)) AS e",
                    "effects.status IN ('pending', 'running') AND effects.due_at_ms <= ?2",
                ),
            };
            conn.execute(
                &format!(
                    "UPDATE effects SET status = 'running', attempts = effects.attempts + 1,
                         due_at_ms = ?3, lease_id = effects.lease_id + 1
                     FROM ({leasing}) AS l
                     WHERE effects.id = l.id AND effects.attempts = l.attempts
                       AND effects.lease_id = l.lease_id AND {due}"
                ),
                args![named.as_str(), now, until],
            )?
        }
        EffectOp::Settle { .. } => {
            let (sql, args) = settle_write(conn.dialect(), op).expect("a settlement");
            conn.execute(sql, &args)?
        }
        EffectOp::Retry { id, now_ms } => conn.execute(
            "UPDATE effects SET status = 'pending', attempts = 0,
                 due_at_ms = CASE WHEN not_before_ms > ?2 THEN not_before_ms ELSE ?2 END,
                 retries = retries + 1, settled_at = NULL
             WHERE id = ?1 AND status IN ('failed', 'cancelled')",
            args![id, db_now(conn, *now_ms)?],
        )?,
        EffectOp::ReclaimAll {
            now_ms,
            owner: None,
        } => conn.execute(
            "UPDATE effects SET status = 'pending', due_at_ms = ?1 WHERE status = 'running'",
            args![db_now(conn, *now_ms)?],
        )?,
        EffectOp::ReclaimAll {
            now_ms,
            owner: Some(owner),
        } => conn.execute(
            &format!(
                "UPDATE effects SET status = 'pending', due_at_ms = ?1 WHERE status = 'running' {}",
                owned_by(2)
            ),
            args![db_now(conn, *now_ms)?, owner],
        )?,
        EffectOp::Cancel { id, settled_at } => conn.execute(
            "UPDATE effects SET status = 'cancelled', settled_at = ?2
             WHERE id = ?1 AND status IN ('pending', 'failed')",
            args![id, settled_at],
        )?,
    };
    Ok(changed as i64)
}
