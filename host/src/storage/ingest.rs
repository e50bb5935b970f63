//! Ingest's SQL: events accepted over HTTP and not yet appended, and the
//! JetStream bridge's fences with their rejection diagnostics.
//!
//! A pending row is keyed by (project, path, idempotency key): accepting the
//! same key twice keeps the first row. Rows leave only once their events are
//! committed to their stream ([`IngestOp::Appended`]), which frees capacity.

use super::sql::{args, Db};
use super::Storage;
use anyhow::Result;

/// How an [`IngestOp::Accept`] that meets a pending key with other content
/// fails (the key follows).
pub const KEY_CONFLICT: &str = "idempotency-conflict on pending key ";

/// Most diagnostics kept per fence (the latest).
pub const DIAGNOSTICS_KEPT: i64 = 64;

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
    pub account: String,
    pub domain: String,
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
    Accept(Vec<NewPending>),
    /// The pending events of one stream up to `through_id` are committed to
    /// it: their rows go; answers how many.
    Appended {
        project: String,
        path: String,
        through_id: i64,
    },
    /// Pending rows that can never be appended; answers how many went.
    Drop { ids: Vec<i64> },
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

impl IngestOp {
    /// What an [`IngestOp::Accept`] answered: rows stored and their bytes.
    pub fn accepted(answer: i64) -> (u64, u64) {
        ((answer >> 32) as u64, (answer & 0xffff_ffff) as u64)
    }
}

pub(super) fn apply(conn: Db<'_>, op: &IngestOp) -> Result<i64> {
    Ok(match op {
        IngestOp::Accept(rows) => {
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
                    anyhow::bail!("{KEY_CONFLICT}{}", r.key);
                }
            }
            // One request is at most 1000 events of at most a body's bytes
            // (far below 4 GiB): both fit one answer (see `accepted`).
            (new << 32) | (bytes & 0xffff_ffff)
        }
        IngestOp::Appended {
            project,
            path,
            through_id,
        } => conn.execute(
            "DELETE FROM ingest_pending WHERE project = ?1 AND path = ?2 AND id <= ?3",
            args![project, path, through_id],
        )? as i64,
        IngestOp::Drop { ids } => {
            let mut gone = 0;
            for id in ids {
                gone += conn.execute("DELETE FROM ingest_pending WHERE id = ?1", args![id])? as i64;
            }
            gone
        }
        IngestOp::Register {
            identity: i,
            registered_at,
        } => {
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

    /// The streams with pending events, oldest first.
    pub fn ingest_pending_streams(&self) -> Result<Vec<(String, String)>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT project, path, MIN(id) AS first FROM ingest_pending
                 GROUP BY project, path ORDER BY first",
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
                 WHERE project = ?1 AND path = ?2 ORDER BY id LIMIT ?3",
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

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{params, Connection};

    fn apply(conn: &Connection, op: &IngestOp) -> Result<i64> {
        super::apply(Db::Sqlite(conn), op)
    }

    fn db() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&conn).unwrap();
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
            &IngestOp::Accept(vec![row("k1", "abc"), row("k2", "de")]),
        );
        assert_eq!(IngestOp::accepted(first.unwrap()), (2, 5));
        let again = apply(
            &conn,
            &IngestOp::Accept(vec![row("k2", "de"), row("k3", "fghi")]),
        );
        assert_eq!(IngestOp::accepted(again.unwrap()), (1, 4));
        let other = apply(
            &conn,
            &IngestOp::Accept(vec![row("k4", "x"), row("k1", "zzz")]),
        );
        let e = other.unwrap_err().to_string();
        assert!(e.starts_with(KEY_CONFLICT) && e.ends_with("k1"), "{e}");
        let gone = IngestOp::Appended {
            project: "acme".into(),
            path: "/a".into(),
            through_id: 2,
        };
        assert_eq!(apply(&conn, &gone).unwrap(), 2);
    }
}
