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
/// The channel on which a deploy names its component (`project/name`),
/// sent with the deploy's commit: every host forgets its cached row.
pub const DEPLOYED_CHANNEL: &str = "streamhost_component_deployed";

/// A [`DEPLOYED_CHANNEL`] payload (a project key has no `/`).
pub(super) fn deployed_payload(project: &str, name: &str) -> String {
    format!("{project}/{name}")
}

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

/// This host may not serve its streams now: it could not renew its leases
/// in time (paused, cut off from the database), so another host may be
/// about to take them over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLost {
    pub path: String,
}

impl std::fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&streamhost_core::error::lease_lost_message(&self.path))
    }
}

impl std::error::Error for LeaseLost {}

/// The part of a lease this host keeps back: it stops serving at
/// `renewal start + lease-ms - margin`, so a database clock that runs up to
/// this fraction fast still never lets another host in first.
pub const FENCE_MARGIN_DIVISOR: i64 = 5;

/// When this host may serve its streams (several hosts): until
/// `renewal start + lease-ms - margin` of its last successful renewal, on
/// a clock that keeps counting while the process is stopped or the machine
/// sleeps (`CLOCK_BOOTTIME`). Another host takes a lease only once the
/// database's clock is `lease-ms` past the owner's renewal, which was
/// written after that renewal started: so this host has stopped first.
///
/// `lapses` counts renewals that found the lease had expired in the
/// database (another host may have taken streams meanwhile): an actor that
/// took its lease under an older count loads again before serving.
#[derive(Debug)]
pub(super) struct Tenure {
    /// ms on the tenure clock; 0: not valid.
    valid_until_ms: std::sync::atomic::AtomicU64,
    lapses: std::sync::atomic::AtomicU64,
    /// The host gave its leases up (it is stopping); read without the
    /// lock a renewal holds.
    stopped: std::sync::atomic::AtomicBool,
}

impl Default for Tenure {
    fn default() -> Self {
        Tenure {
            valid_until_ms: std::sync::atomic::AtomicU64::new(0),
            lapses: std::sync::atomic::AtomicU64::new(0),
            stopped: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// The tenure clock in ms: `CLOCK_BOOTTIME` (monotonic, and counting while
/// the process is stopped or the machine is suspended).
pub fn tenure_clock_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        // Not expected on Linux; a clock that fails reads as "expired".
        return u64::MAX;
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Streams another host owned at the last look: requests for them go
/// there without a database round trip (and without locking the lease row
/// the owner's commits check). An entry lasts a lease; a forward that
/// finds its owner gone or moved forgets that owner's entries.
#[derive(Debug, Default)]
pub(super) struct Owners {
    by_stream: std::sync::Mutex<std::collections::HashMap<(String, String), CachedOwner>>,
}

#[derive(Debug, Clone)]
struct CachedOwner {
    owner: String,
    url: String,
    /// On [`tenure_clock_ms`].
    until_ms: u64,
}

/// Most streams whose owner is remembered (a full cache starts over).
const OWNERS_CACHED_MAX: usize = 100_000;

impl Owners {
    fn get(&self, project: &str, path: &str) -> Option<CachedOwner> {
        let by_stream = self.by_stream.lock().unwrap_or_else(|e| e.into_inner());
        by_stream
            .get(&(project.to_string(), path.to_string()))
            .filter(|c| tenure_clock_ms() < c.until_ms)
            .cloned()
    }

    fn put(&self, project: &str, path: &str, owner: CachedOwner) {
        let mut by_stream = self.by_stream.lock().unwrap_or_else(|e| e.into_inner());
        if by_stream.len() >= OWNERS_CACHED_MAX {
            by_stream.clear();
        }
        by_stream.insert((project.to_string(), path.to_string()), owner);
    }

    fn forget(&self, project: &str, path: &str) {
        let mut by_stream = self.by_stream.lock().unwrap_or_else(|e| e.into_inner());
        by_stream.remove(&(project.to_string(), path.to_string()));
    }

    fn forget_url(&self, url: &str) {
        let mut by_stream = self.by_stream.lock().unwrap_or_else(|e| e.into_inner());
        by_stream.retain(|_, c| c.url != url);
    }
}

/// The protocol's one rule on the database's clock: a host's leases are
/// live while its last renewal (`heartbeat_ms`) is within its own
/// `lease_ms` of `now_ms`. A renewal that finds it false has lapsed; a
/// takeover needs it false.
pub(super) fn lease_live(heartbeat_ms: i64, lease_ms: i64, now_ms: i64) -> bool {
    heartbeat_ms.saturating_add(lease_ms) >= now_ms
}

impl Tenure {
    fn valid(&self) -> bool {
        self.valid_at(tenure_clock_ms())
    }

    /// Whether the host may serve at `now_ms` (on the tenure clock).
    pub(super) fn valid_at(&self, now_ms: u64) -> bool {
        now_ms
            < self
                .valid_until_ms
                .load(std::sync::atomic::Ordering::Acquire)
    }

    pub(super) fn lapses(&self) -> u64 {
        self.lapses.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A renewal that started at `started_ms` succeeded; `continuous`: the
    /// database had not let the lease expire before it.
    pub(super) fn renewed(&self, started_ms: u64, lease_ms: i64, continuous: bool) {
        use std::sync::atomic::Ordering;
        if self.stopped.load(Ordering::Acquire) {
            // A renewal that raced the release serves nothing more.
            return;
        }
        if !continuous {
            // Before the new validity is visible: whoever sees it sees the lapse.
            self.lapses.fetch_add(1, Ordering::AcqRel);
        }
        let keep = (lease_ms - lease_ms / FENCE_MARGIN_DIVISOR).max(0) as u64;
        self.valid_until_ms
            .fetch_max(started_ms.saturating_add(keep), Ordering::AcqRel);
    }

    fn lost(&self) {
        self.valid_until_ms
            .store(0, std::sync::atomic::Ordering::Release);
    }
}

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

    /// Whether this host may serve its streams now (always on SQLite):
    /// its last renewal is recent enough that no other host can have taken
    /// them (see `Tenure`).
    pub fn lease_valid(&self) -> bool {
        self.cluster().is_none() || self.inner.tenure.valid()
    }

    /// How many renewals found this host's leases expired in the database
    /// (an actor that took its lease under an older count loads again).
    pub fn lease_lapses(&self) -> u64 {
        self.inner.tenure.lapses()
    }

    /// Until when (on [`tenure_clock_ms`]) this host may serve its
    /// streams; 0 when it may not.
    pub fn lease_valid_until_ms(&self) -> u64 {
        self.inner
            .tenure
            .valid_until_ms
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Takes the lease of stream `path` of `project` for this host (see the
    /// module); answers the fence its commits carry, or `None` on SQLite.
    /// A lease of another live host is an [`OwnedElsewhere`] error; a host
    /// whose own renewals are overdue takes nothing ([`LeaseLost`]).
    pub fn acquire_lease(&self, project: &str, path: &str) -> Result<Option<Fence>> {
        let Some(me) = self.cluster() else {
            return Ok(None);
        };
        // Not the lock a renewal holds (a renewal may hang on the database).
        let stopping = self.is_stopping();
        if !stopping && !self.lease_valid() {
            return Err(LeaseLost {
                path: path.to_string(),
            }
            .into());
        }
        if let Some(known) = self.inner.owners.get(project, path) {
            return Err(OwnedElsewhere {
                path: path.to_string(),
                owner: known.owner,
                url: known.url,
            }
            .into());
        }
        self.with_reader(|db| {
            let taken = in_transaction(db, |db| take(db, project, path, &me.id, stopping))?;
            match taken {
                Taken::Mine(epoch) => {
                    self.inner.owners.forget(project, path);
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
                    Ok(Some(Fence {
                        project: project.to_string(),
                        path: path.to_string(),
                        owner: me.id.clone(),
                        epoch,
                    }))
                }
                Taken::Elsewhere { owner, url } => {
                    let url = if owner == me.id { String::new() } else { url };
                    if !url.is_empty() {
                        self.inner.owners.put(
                            project,
                            path,
                            CachedOwner {
                                owner: owner.clone(),
                                url: url.clone(),
                                until_ms: tenure_clock_ms().saturating_add(me.lease_ms as u64),
                            },
                        );
                    }
                    Err(OwnedElsewhere {
                        path: path.to_string(),
                        owner,
                        url,
                    }
                    .into())
                }
            }
        })
    }

    /// The URL of the live host this host last found owning stream `path`
    /// of `project`, while that is fresh (within the owner's lease); `None`
    /// when it is not known, or on SQLite.
    pub fn known_owner(&self, project: &str, path: &str) -> Option<String> {
        self.cluster()?;
        self.inner
            .owners
            .get(project, path)
            .map(|known| known.url)
            .filter(|url| !url.is_empty())
    }

    /// Whether this host gave its leases up (it is stopping).
    pub fn is_stopping(&self) -> bool {
        self.inner
            .tenure
            .stopped
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Forgets which streams the host at `url` owns: a request forwarded
    /// there found it gone, or found the stream moved on.
    pub fn forget_owner(&self, url: &str) {
        self.inner.owners.forget_url(url);
    }

    /// Renews this host's row, and with it all its leases; records when
    /// the renewal started (this host serves until `start + lease-ms -
    /// margin`) and whether the database had let the leases expire before.
    pub fn heartbeat(&self) -> Result<()> {
        let Some(me) = self.cluster() else {
            return Ok(());
        };
        let stopping = self.stopping();
        if *stopping {
            return Ok(());
        }
        self.with_reader(|db| {
            // Before the statement reaches the database: the row's time is
            // later than this instant.
            let started = tenure_clock_ms();
            let continuous = in_transaction(db, |db| {
                // The row lock orders this renewal with takeovers, which
                // read the row FOR SHARE: a takeover either saw the lease
                // expired before this (then this sees it expired too) or
                // waits and sees it renewed.
                let live = db
                    .query_opt(
                        &format!(
                            "SELECT heartbeat_ms, lease_ms, {NOW_MS} FROM hosts WHERE id = ?1 FOR UPDATE"
                        ),
                        args![&me.id],
                        |r| Ok(lease_live(r.int(0)?, r.int(1)?, r.int(2)?)),
                    )?
                    .unwrap_or(false);
                db.execute(
                    &format!(
                        "INSERT INTO hosts (id, url, heartbeat_ms, lease_ms) VALUES (?1, ?2, {NOW_MS}, ?3)
                         ON CONFLICT (id) DO UPDATE SET url = excluded.url,
                             heartbeat_ms = excluded.heartbeat_ms, lease_ms = excluded.lease_ms"
                    ),
                    args![&me.id, &me.url, me.lease_ms],
                )?;
                Ok(live)
            })?;
            self.inner.tenure.renewed(started, me.lease_ms, continuous);
            Ok(())
        })
    }

    /// Gives this host's leases up (it is stopping): its last renewal
    /// reads as never, so any host may take its streams at once, and the
    /// others hear of it on `STOPPED_CHANNEL` instead of waiting for the
    /// leases to run out. It renews and takes nothing after.
    pub fn release_leases(&self) -> Result<()> {
        let Some(me) = self.cluster() else {
            return Ok(());
        };
        // It serves none of its streams from now on (said before the lock,
        // which a hung renewal may hold).
        self.inner
            .tenure
            .stopped
            .store(true, std::sync::atomic::Ordering::Release);
        self.inner.tenure.lost();
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

    /// Listens (on a connection of its own, on its own thread) for other
    /// hosts that stop, sending each one's id to `stopped`, and for deploys
    /// through other hosts, forgetting the cached row of their component;
    /// until `stopped` closes. A lost connection is opened again: a stopped
    /// host missed meanwhile is made up for by its lease running out, and
    /// every cached component row is forgotten (a deploy may have gone
    /// unheard).
    pub fn listen_for_stopped_hosts(&self, stopped: tokio::sync::mpsc::UnboundedSender<String>) {
        let (Some(target), Some(me)) = (self.postgres_target(), self.cluster()) else {
            return;
        };
        let (target, me, hot) = (target.clone(), me.id.clone(), self.inner.hot.clone());
        let listen = move || -> Result<()> {
            let mut client = target.client()?;
            client.batch_execute(&format!(
                "LISTEN {STOPPED_CHANNEL}; LISTEN {DEPLOYED_CHANNEL}"
            ))?;
            hot.forget_components();
            loop {
                {
                    let mut notifications = client.notifications();
                    let mut heard = notifications.timeout_iter(std::time::Duration::from_secs(1));
                    while let Some(n) = FallibleIterator::next(&mut heard)? {
                        if n.channel() == DEPLOYED_CHANNEL {
                            if let Some((project, name)) = n.payload().split_once('/') {
                                hot.forget_component(project, name);
                            }
                            continue;
                        }
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
    /// key, path), for a live host to take over (the owner it remembered
    /// for each is forgotten, so the takeover asks the database). Leases of the host's own
    /// work (their project key starts with `!`, as the JetStream bridge's)
    /// are not streams and are left to that work.
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
                       AND l.project NOT LIKE '!%'
                     ORDER BY l.project, l.path LIMIT 1000"
                ),
                args![],
                |r| Ok((r.text(0)?, r.text(1)?)),
            )
        })
        .inspect(|expired| {
            for (project, path) in expired {
                self.inner.owners.forget(project, path);
            }
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
                            (SELECT COUNT(*) FROM stream_leases l
                             WHERE l.owner = h.id AND l.project NOT LIKE '!%'),
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

/// Runs `f` in a transaction on `db` (a reader connection): committed
/// when it answers `Ok`, rolled back otherwise.
fn in_transaction<T>(db: Db<'_>, f: impl FnOnce(Db<'_>) -> Result<T>) -> Result<T> {
    db.control("BEGIN")?;
    match f(db) {
        Ok(v) => {
            db.control("COMMIT")?;
            Ok(v)
        }
        Err(e) => {
            let _ = db.control("ROLLBACK");
            Err(e)
        }
    }
}

/// What [`take`] found.
enum Taken {
    /// This host holds the lease now, under this epoch.
    Mine(i64),
    /// Another host holds it (or this one is stopping and holds nothing).
    Elsewhere { owner: String, url: String },
}

/// Inside a transaction: takes the lease of a stream for host `me` when it
/// is new, its own, or its owner's renewals are older than the owner's
/// `lease_ms`. The lease row is locked first, then its owner's row in
/// `hosts` FOR SHARE, so a renewal of that owner either lands before (and
/// the lease is live) or waits until the takeover committed (and reads the
/// lease as lapsed).
fn take(db: Db<'_>, project: &str, path: &str, me: &str, stopping: bool) -> Result<Taken> {
    let current = db.query_opt(
        "SELECT owner FROM stream_leases WHERE project = ?1 AND path = ?2 FOR UPDATE",
        args![project, path],
        |r| r.text(0),
    )?;
    let owner_row = |db: Db<'_>, owner: &str| {
        db.query_opt(
            &format!(
                "SELECT url, heartbeat_ms, lease_ms, {NOW_MS} FROM hosts WHERE id = ?1 FOR SHARE"
            ),
            args![owner],
            |r| Ok((r.text(0)?, lease_live(r.int(1)?, r.int(2)?, r.int(3)?))),
        )
    };
    let elsewhere = |owner: String, url: String| Ok(Taken::Elsewhere { owner, url });
    match current {
        None if stopping => elsewhere(String::new(), String::new()),
        None => {
            let epoch = db.query_opt(
                &format!(
                    "INSERT INTO stream_leases (project, path, owner, epoch, taken_at_ms)
                     VALUES (?1, ?2, ?3, 1, {NOW_MS})
                     ON CONFLICT (project, path) DO NOTHING RETURNING epoch"
                ),
                args![project, path, me],
                |r| r.int(0),
            )?;
            match epoch {
                Some(epoch) => Ok(Taken::Mine(epoch)),
                // Another host inserted it meanwhile: its lease is fresh.
                None => {
                    let owner = db.query_one(
                        "SELECT owner FROM stream_leases WHERE project = ?1 AND path = ?2",
                        args![project, path],
                        |r| r.text(0),
                    )?;
                    let url = owner_row(db, &owner)?.map(|(u, _)| u).unwrap_or_default();
                    elsewhere(owner, url)
                }
            }
        }
        Some(owner) => {
            let (url, live) = owner_row(db, &owner)?.unwrap_or_default();
            if stopping || (owner != me && live) {
                return elsewhere(owner, url);
            }
            let epoch = db.query_one(
                &format!(
                    "UPDATE stream_leases SET owner = ?3, epoch = epoch + 1, taken_at_ms = {NOW_MS}
                     WHERE project = ?1 AND path = ?2 RETURNING epoch"
                ),
                args![project, path, me],
                |r| r.int(0),
            )?;
            Ok(Taken::Mine(epoch))
        }
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
