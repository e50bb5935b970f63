//! Several hosts on one PostgreSQL database: a stream has one owner at a
//! time, named by its lease row (owner, epoch); the lease expires when its
//! owner's last renewal is older than the owner's `[cluster] lease-ms`
//! (each host registers its own, so hosts configured differently still
//! agree on when a lease expires).
//!
//! - A host takes a stream's lease when its actor loads the stream: a new
//!   lease, one of its own, or one whose owner stopped renewing (expired);
//!   each take bumps the epoch. A lease held by another live host is not
//!   taken: the request goes to that host ([`OwnedElsewhere`]).
//! - Every host renews its row in `hosts` (its URL, for forwarding) every
//!   third of `lease-ms`: one row per host renews all its leases at once
//!   (renewing each lease row would lock them all against the commits that
//!   check them).
//! - Every commit of a stream's owner carries its [`Fence`] (owner and
//!   epoch) and checks it against the lease row inside the transaction (a
//!   shared row lock: a takeover waits for the commit, or the commit sees
//!   the takeover), so a deposed owner's commit fails.
//!
//! Times are the database's clock, so hosts' clocks need not agree.
//! SQLite storage has none of this: its data dir is locked to one host.

use anyhow::{bail, Result};
use postgres::fallible_iterator::FallibleIterator;

use super::sql::{args, Db};
use super::Storage;

/// The channel (LISTEN/NOTIFY) on which a stopping host names itself.
pub const STOPPED_CHANNEL: &str = "streamhost_host_stopped";

/// The database's clock, in ms since the epoch.
const NOW_MS: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

/// The tables of several hosts (PostgreSQL only).
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS hosts (
    id           TEXT PRIMARY KEY,
    url          TEXT NOT NULL,   -- where other hosts forward requests
    heartbeat_ms BIGINT NOT NULL, -- the database's clock at its last renewal
    lease_ms     BIGINT NOT NULL  -- its leases last this long after a renewal
);
CREATE TABLE IF NOT EXISTS stream_leases (
    project     TEXT NOT NULL,
    path        TEXT NOT NULL,
    owner       TEXT NOT NULL,   -- hosts.id: valid while its heartbeat is recent
    epoch       BIGINT NOT NULL, -- bumped by every take
    taken_at_ms BIGINT NOT NULL,
    PRIMARY KEY (project, path)
);
CREATE INDEX IF NOT EXISTS stream_leases_by_owner ON stream_leases (owner);
CREATE TABLE IF NOT EXISTS cluster_secret (
    secret TEXT NOT NULL -- proves a host-to-host call comes from a host of this database
);
INSERT INTO cluster_secret (secret)
    SELECT gen_random_uuid()::text || gen_random_uuid()::text
    WHERE NOT EXISTS (SELECT 1 FROM cluster_secret);
";

/// Who this host is among the hosts of one database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    /// Unique per process start.
    pub id: String,
    /// Where the other hosts reach it (`http://10.0.0.5:7410`).
    pub url: String,
    /// How long its leases last without renewal.
    pub lease_ms: i64,
    /// The database's cluster secret: host-to-host calls carry it.
    pub secret: String,
}

impl HostIdentity {
    /// How often it renews its leases: a third of their length.
    pub fn heartbeat(&self) -> std::time::Duration {
        std::time::Duration::from_millis((self.lease_ms / 3).max(1) as u64)
    }
}

/// What a commit of a stream's owner is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub project: String,
    pub path: String,
    pub owner: String,
    pub epoch: i64,
}

/// A stream's lease is held by another live host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedElsewhere {
    pub path: String,
    pub owner: String,
    /// The owner's URL (empty if it never registered one).
    pub url: String,
}

impl std::fmt::Display for OwnedElsewhere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stream {:?} is owned by host {} at {}",
            self.path, self.owner, self.url
        )
    }
}

impl std::error::Error for OwnedElsewhere {}

/// The cluster secret of the database (made with the schema).
pub(super) fn secret(db: Db<'_>) -> Result<String> {
    db.query_one("SELECT secret FROM cluster_secret", args![], |r| r.text(0))
}

impl Storage {
    /// This host's identity when several hosts may share the database
    /// (PostgreSQL), else `None`.
    pub fn cluster(&self) -> Option<&HostIdentity> {
        self.inner.cluster.as_ref()
    }

    /// Takes the lease of stream `path` of `project` for this host (see the
    /// module); answers the fence its commits carry, or `None` on SQLite.
    /// A lease of another live host is an [`OwnedElsewhere`] error.
    pub fn acquire_lease(&self, project: &str, path: &str) -> Result<Option<Fence>> {
        let Some(me) = self.cluster() else {
            return Ok(None);
        };
        let stopping = *self.stopping();
        self.with_reader(|db| {
            // A stopping host takes no stream: it names the current owner
            // (the host that took over) or none yet.
            let take = |db: Db<'_>| {
                if stopping {
                    return Ok(None);
                }
                db.query_opt(
                    &format!(
                        "INSERT INTO stream_leases (project, path, owner, epoch, taken_at_ms)
                     VALUES (?1, ?2, ?3, 1, {NOW_MS})
                     ON CONFLICT (project, path) DO UPDATE SET owner = excluded.owner,
                         epoch = stream_leases.epoch + 1, taken_at_ms = excluded.taken_at_ms
                     WHERE stream_leases.owner = excluded.owner
                        OR COALESCE((SELECT h.heartbeat_ms + h.lease_ms FROM hosts h
                                     WHERE h.id = stream_leases.owner), 0) < {NOW_MS}
                     RETURNING epoch"
                    ),
                    args![project, path, &me.id],
                    |r| r.int(0),
                )
            };
            if let Some(epoch) = take(db)? {
                // Other hosts may have written the stream since this one
                // last owned it: nothing cached of it is trusted.
                let row = db.query_opt(
                    "SELECT id FROM streams WHERE project = ?1 AND path = ?2",
                    args![project, path],
                    |r| r.int(0),
                )?;
                if let Some(row_id) = row {
                    self.inner.hot.forget_stream(row_id);
                }
                return Ok(Some(Fence {
                    project: project.to_string(),
                    path: path.to_string(),
                    owner: me.id.clone(),
                    epoch,
                }));
            }
            let (owner, url) = db
                .query_opt(
                    "SELECT l.owner, COALESCE(h.url, '') FROM stream_leases l
                     LEFT JOIN hosts h ON h.id = l.owner
                     WHERE l.project = ?1 AND l.path = ?2",
                    args![project, path],
                    |r| Ok((r.text(0)?, r.text(1)?)),
                )?
                .unwrap_or_default();
            let url = if owner == me.id { String::new() } else { url };
            Err(OwnedElsewhere {
                path: path.to_string(),
                owner,
                url,
            }
            .into())
        })
    }

    /// Renews this host's row, and with it all its leases.
    pub fn heartbeat(&self) -> Result<()> {
        let Some(me) = self.cluster() else {
            return Ok(());
        };
        let stopping = self.stopping();
        if *stopping {
            return Ok(());
        }
        self.with_reader(|db| {
            db.execute(
                &format!(
                    "INSERT INTO hosts (id, url, heartbeat_ms, lease_ms) VALUES (?1, ?2, {NOW_MS}, ?3)
                     ON CONFLICT (id) DO UPDATE SET url = excluded.url,
                         heartbeat_ms = excluded.heartbeat_ms, lease_ms = excluded.lease_ms"
                ),
                args![&me.id, &me.url, me.lease_ms],
            )?;
            Ok(())
        })
    }

    /// Gives this host's leases up (it is stopping): its last renewal
    /// reads as never, so any host may take its streams at once, and the
    /// others hear of it on [`STOPPED_CHANNEL`] instead of waiting for the
    /// leases to run out. It renews and takes nothing after.
    pub fn release_leases(&self) -> Result<()> {
        let Some(me) = self.cluster() else {
            return Ok(());
        };
        let mut stopping = self.stopping();
        *stopping = true;
        self.with_reader(|db| {
            db.execute(
                "UPDATE hosts SET heartbeat_ms = 0 WHERE id = ?1",
                args![&me.id],
            )?;
            // After the update has committed: a host that hears it finds
            // the leases free.
            db.execute("SELECT pg_notify(?1, ?2)", args![STOPPED_CHANNEL, &me.id])?;
            Ok(())
        })
    }

    /// Listens for other hosts that stop (on a connection of its own, on
    /// its own thread) and sends each one's id to `stopped`, until
    /// `stopped` closes. A lost connection is opened again; a notification
    /// missed meanwhile is made up for by the lease running out.
    pub fn listen_for_stopped_hosts(&self, stopped: tokio::sync::mpsc::UnboundedSender<String>) {
        let (Some(url), Some(me)) = (self.postgres_url(), self.cluster()) else {
            return;
        };
        let (url, me) = (url.to_string(), me.id.clone());
        let listen = move || -> Result<()> {
            let mut client = postgres::Client::connect(&url, postgres::NoTls)?;
            client.batch_execute(&format!("LISTEN {STOPPED_CHANNEL}"))?;
            loop {
                {
                    let mut notifications = client.notifications();
                    let mut heard = notifications.timeout_iter(std::time::Duration::from_secs(1));
                    while let Some(n) = FallibleIterator::next(&mut heard)? {
                        if n.payload() != me && stopped.send(n.payload().to_string()).is_err() {
                            return Ok(());
                        }
                    }
                }
                if stopped.is_closed() {
                    return Ok(());
                }
                if client.is_closed() {
                    bail!("the connection closed");
                }
            }
        };
        let spawned = std::thread::Builder::new()
            .name("streamhost-listen".into())
            .spawn(move || loop {
                match listen() {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "listening for stopping hosts failed; listening again in 1 s");
                        std::thread::sleep(std::time::Duration::from_secs(1));
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "starting the listener for stopping hosts failed");
        }
    }

    /// Streams whose lease expired (their owner stopped renewing): (project
    /// key, path), for a live host to take over.
    pub fn expired_leases(&self) -> Result<Vec<(String, String)>> {
        if self.cluster().is_none() {
            return Ok(Vec::new());
        }
        self.with_reader(|db| {
            db.query_all(
                &format!(
                    "SELECT l.project, l.path FROM stream_leases l
                     LEFT JOIN hosts h ON h.id = l.owner
                     WHERE COALESCE(h.heartbeat_ms + h.lease_ms, 0) < {NOW_MS}
                     ORDER BY l.project, l.path LIMIT 1000"
                ),
                args![],
                |r| Ok((r.text(0)?, r.text(1)?)),
            )
        })
    }
}

/// A host of the cluster as the database sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterHost {
    pub url: String,
    /// The database's clock at its last renewal, ms since the epoch.
    pub heartbeat_ms: i64,
    /// Streams whose lease it holds (expired with it when it is not live).
    pub streams: u64,
    /// Whether its renewals are within a lease's length.
    pub live: bool,
}

impl Storage {
    /// Every host that ever registered on the database, by URL.
    pub fn cluster_hosts(&self) -> Result<Vec<ClusterHost>> {
        if self.cluster().is_none() {
            return Ok(Vec::new());
        }
        self.with_reader(|db| {
            db.query_all(
                &format!(
                    "SELECT h.url, h.heartbeat_ms,
                            (SELECT COUNT(*) FROM stream_leases l WHERE l.owner = h.id),
                            CASE WHEN h.heartbeat_ms + h.lease_ms >= {NOW_MS} THEN 1 ELSE 0 END
                     FROM hosts h ORDER BY h.url"
                ),
                args![],
                |r| {
                    Ok(ClusterHost {
                        url: r.text(0)?,
                        heartbeat_ms: r.int(1)?,
                        streams: r.int(2)? as u64,
                        live: r.int(3)? == 1,
                    })
                },
            )
        })
    }
}

/// Inside a commit: fails unless `fence` still names the lease's owner and
/// epoch (and holds the row until the commit ends).
pub(super) fn check(conn: Db<'_>, fence: &Fence) -> Result<()> {
    let current = conn.query_opt(
        "SELECT owner, epoch FROM stream_leases WHERE project = ?1 AND path = ?2 FOR SHARE",
        args![&fence.project, &fence.path],
        |r| Ok((r.text(0)?, r.int(1)?)),
    )?;
    match current {
        Some((owner, epoch)) if owner == fence.owner && epoch == fence.epoch => Ok(()),
        Some((owner, epoch)) => bail!(
            "stream {:?} was taken over by host {owner} (lease epoch {epoch}; this host held epoch {}): \
             a deposed owner's write is refused",
            fence.path,
            fence.epoch
        ),
        None => bail!(
            "stream {:?} has no lease (this host held epoch {}): the write is refused",
            fence.path,
            fence.epoch
        ),
    }
}
