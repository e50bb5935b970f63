//! A seeded simulation of the several-hosts protocol, in the style of the
//! delivery schedule's: an in-memory database (its clock, host rows, one
//! stream's lease and log, the ingest table, a JetStream stream and the
//! bridge's lease), three hosts as actors with clocks of their own, and
//! injected pauses (SIGSTOP), cuts from the database, slow and reordered
//! messages and commits. The hosts run the protocol's own code for what
//! is decided on a host ([`Tenure`]: when it may serve, what a renewal
//! tells it) and on the database ([`lease_live`]: when a lease may be taken,
//! whether a renewal lapsed); each database step is atomic, as the row
//! locks make it (`lease::take`, `heartbeat`).
//!
//! It checks, at every step: no two owners commit under one epoch; no read
//! that began after an append was acknowledged misses it; no ingest row is
//! deleted before its event was appended; no JetStream message is purged
//! before its event was appended. [`Protocol`] can switch off each of the
//! three remedies (the owner's own fence, deleting exactly the rows a drain
//! appended, the bridge's lease), and the simulation must then find the
//! defect each one fixes.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::lease::{lease_live, Tenure};
use streamhost_core::seeded::Rng;

const LEASE_MS: i64 = 1_000;
const HOSTS: usize = 3;
const STEPS: usize = 4_000;

/// Which remedies the hosts run.
#[derive(Debug, Clone, Copy)]
struct Protocol {
    /// An owner serves only within its tenure, and loads again after its
    /// leases lapsed.
    self_fence: bool,
    /// A drain deletes exactly the rows it appended (else: every visible
    /// row up to the last id it read).
    exact_ingest_delete: bool,
    /// One host at a time bridges, holding the bridge's lease and checking
    /// its tenure before every purge (else: every host consumes the one
    /// shared consumer and purges below its own lowest queued message).
    bridge_lease: bool,
}

const CURRENT: Protocol = Protocol {
    self_fence: true,
    exact_ingest_delete: true,
    bridge_lease: true,
};

/// An ingest row: its id is taken at insert, it is visible once its
/// transaction commits (ids are not assigned in commit order).
struct Pending {
    key: u64,
    visible_at: i64,
}

#[derive(Default)]
struct Db {
    heartbeat: [Option<i64>; HOSTS],
    /// The stream's lease: (owner, epoch).
    stream: Option<(usize, u64)>,
    bridge: Option<(usize, u64)>,
    /// The stream's events: who committed each, under which epoch.
    log: Vec<(usize, u64)>,
    pending: BTreeMap<u64, Pending>,
    next_id: u64,
    /// Ingest keys appended to the stream.
    ingested: HashSet<u64>,
    /// JetStream: sequence → appended yet.
    js: BTreeMap<u64, bool>,
    js_next: u64,
    /// Sequences the shared consumer delivered (to some host).
    js_delivered: BTreeSet<u64>,
}

impl Db {
    /// `lease::take`: a new lease, one's own, or one whose owner's
    /// renewals lapsed; the epoch goes up.
    fn take(
        lease: &mut Option<(usize, u64)>,
        heartbeat: &[Option<i64>],
        me: usize,
        now: i64,
    ) -> Option<u64> {
        let epoch = match *lease {
            None => 1,
            Some((owner, epoch)) if owner == me => epoch + 1,
            Some((owner, epoch)) => {
                let live = heartbeat[owner].is_some_and(|hb| lease_live(hb, LEASE_MS, now));
                if live {
                    return None;
                }
                epoch + 1
            }
        };
        *lease = Some((me, epoch));
        Some(epoch)
    }
}

struct Actor {
    epoch: u64,
    /// The host's lapse count when it took the lease.
    lapses: u64,
    /// The stream's head as this actor knows it.
    head: usize,
}

struct Drain {
    ids: Vec<u64>,
    delete_at: i64,
}

struct Bridging {
    lapses: u64,
    queued: BTreeSet<u64>,
    max_seen: u64,
}

struct Host {
    /// Its clock runs at the database's rate, from another origin.
    clock_offset: i64,
    paused_until: i64,
    cut_until: i64,
    tenure: Tenure,
    next_renewal: i64,
    renewing: bool,
    actor: Option<Actor>,
    drain: Option<Drain>,
    bridge: Option<Bridging>,
}

enum Msg {
    /// A renewal reaches the database.
    Renew { host: usize, started: u64 },
    /// Its answer reaches the host.
    Renewed {
        host: usize,
        started: u64,
        continuous: bool,
    },
}

struct Sim {
    p: Protocol,
    rng: Rng,
    now: i64,
    db: Db,
    hosts: Vec<Host>,
    msgs: Vec<(i64, Msg)>,
    /// Acknowledged appends: (when, offset).
    acks: Vec<(i64, usize)>,
    /// The highest offset acknowledged before this step.
    acked_before: usize,
    violations: Vec<String>,
}

impl Sim {
    fn new(p: Protocol, seed: u64) -> Sim {
        let mut rng = Rng::new(seed);
        let hosts = (0..HOSTS)
            .map(|i| Host {
                clock_offset: 1_000_000 + (i as i64) * 7_919 + rng.below(5_000) as i64,
                paused_until: 0,
                cut_until: 0,
                tenure: Tenure::default(),
                next_renewal: 0,
                renewing: false,
                actor: None,
                drain: None,
                bridge: None,
            })
            .collect();
        Sim {
            p,
            rng,
            now: 0,
            db: Db::default(),
            hosts,
            msgs: Vec::new(),
            acks: Vec::new(),
            acked_before: 0,
            violations: Vec::new(),
        }
    }

    fn local(&self, h: usize) -> u64 {
        (self.now + self.hosts[h].clock_offset) as u64
    }

    fn cut(&self, h: usize) -> bool {
        self.hosts[h].cut_until > self.now
    }

    fn paused(&self, h: usize) -> bool {
        self.hosts[h].paused_until > self.now
    }

    fn run(p: Protocol, seed: u64) -> Vec<String> {
        let mut sim = Sim::new(p, seed);
        for _ in 0..STEPS {
            sim.step_clock();
            sim.deliver();
            sim.faults();
            sim.producers();
            let mut order: Vec<usize> = (0..HOSTS).collect();
            for i in (1..HOSTS).rev() {
                order.swap(i, sim.rng.below(i as u64 + 1) as usize);
            }
            for h in order {
                if sim.paused(h) {
                    continue;
                }
                sim.renew(h);
                if sim.rng.per_mille(300) {
                    sim.stream_work(h);
                }
                if sim.rng.per_mille(200) {
                    sim.drain(h);
                }
                if sim.rng.per_mille(200) {
                    sim.bridge(h);
                }
            }
        }
        sim.violations
    }

    /// Time passes; every append acknowledged so far is now in the past.
    fn step_clock(&mut self) {
        self.now += 1 + self.rng.below(20) as i64;
        self.acked_before = self.acks.last().map_or(0, |(_, o)| *o);
    }

    fn deliver(&mut self) {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.msgs)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.msgs = later;
        for (_, msg) in due {
            match msg {
                Msg::Renew { host, started } => {
                    if self.cut(host) {
                        // Lost on the way: the host hears nothing.
                        self.hosts[host].renewing = false;
                        continue;
                    }
                    let continuous =
                        self.db.heartbeat[host].is_some_and(|hb| lease_live(hb, LEASE_MS, now));
                    self.db.heartbeat[host] = Some(now);
                    let delay = self.delay();
                    self.msgs.push((
                        now + delay,
                        Msg::Renewed {
                            host,
                            started,
                            continuous,
                        },
                    ));
                }
                Msg::Renewed {
                    host,
                    started,
                    continuous,
                } => {
                    if self.paused(host) {
                        // Read once the process runs again.
                        let at = self.hosts[host].paused_until;
                        self.msgs.push((
                            at,
                            Msg::Renewed {
                                host,
                                started,
                                continuous,
                            },
                        ));
                        continue;
                    }
                    self.hosts[host].renewing = false;
                    if self.cut(host) {
                        continue; // the answer is lost
                    }
                    self.hosts[host]
                        .tenure
                        .renewed(started, LEASE_MS, continuous);
                }
            }
        }
    }

    /// A message's delay: mostly short, sometimes slow (a loaded database),
    /// so messages overtake each other.
    fn delay(&mut self) -> i64 {
        if self.rng.per_mille(50) {
            self.rng.below(1_500) as i64
        } else {
            self.rng.below(40) as i64
        }
    }

    fn faults(&mut self) {
        if self.rng.per_mille(4) {
            let h = self.rng.below(HOSTS as u64) as usize;
            let pause = 300 + self.rng.below(2_700) as i64;
            self.hosts[h].paused_until = self.hosts[h].paused_until.max(self.now + pause);
        }
        if self.rng.per_mille(4) {
            let h = self.rng.below(HOSTS as u64) as usize;
            let cut = 300 + self.rng.below(2_700) as i64;
            self.hosts[h].cut_until = self.hosts[h].cut_until.max(self.now + cut);
        }
    }

    fn producers(&mut self) {
        if self.rng.per_mille(250) {
            // An acceptance: its id now, visible when its commit lands.
            let id = self.db.next_id;
            self.db.next_id += 1;
            let visible_at = self.now + self.rng.below(300) as i64;
            self.db.pending.insert(
                id,
                Pending {
                    key: id,
                    visible_at,
                },
            );
        }
        if self.rng.per_mille(250) {
            self.db.js_next += 1;
            self.db.js.insert(self.db.js_next, false);
        }
    }

    fn renew(&mut self, h: usize) {
        let local = self.local(h) as i64;
        if self.hosts[h].renewing || local < self.hosts[h].next_renewal {
            return;
        }
        self.hosts[h].renewing = true;
        self.hosts[h].next_renewal = local + LEASE_MS / 3;
        // The start is read before the message leaves.
        let started = self.local(h);
        let delay = self.delay();
        self.msgs
            .push((self.now + delay, Msg::Renew { host: h, started }));
    }

    /// Whether host `h` may serve now, as the protocol says.
    fn serving(&self, h: usize) -> bool {
        !self.p.self_fence || self.hosts[h].tenure.valid_at(self.local(h))
    }

    fn stream_work(&mut self, h: usize) {
        if self.p.self_fence {
            let lapses = self.hosts[h].tenure.lapses();
            if self.hosts[h]
                .actor
                .as_ref()
                .is_some_and(|a| a.lapses != lapses)
            {
                // The database let its leases lapse: load again first.
                self.hosts[h].actor = None;
            }
        }
        let Some(actor) = &self.hosts[h].actor else {
            // A request arrives: the actor loads and takes the lease.
            if self.cut(h) || !self.serving(h) {
                return;
            }
            let lapses = self.hosts[h].tenure.lapses();
            if let Some(epoch) = Db::take(&mut self.db.stream, &self.db.heartbeat, h, self.now) {
                self.hosts[h].actor = Some(Actor {
                    epoch,
                    lapses,
                    head: self.db.log.len(),
                });
            }
            return;
        };
        if self.rng.per_mille(500) {
            // An append: committed only under the lease's owner and epoch.
            if self.cut(h) {
                return;
            }
            let epoch = actor.epoch;
            if self.db.stream != Some((h, epoch)) {
                self.hosts[h].actor = None; // deposed: loads again
                return;
            }
            if let Some((owner, _)) = self.db.log.iter().find(|(_, e)| *e == epoch) {
                if *owner != h {
                    self.violations
                        .push(format!("two owners committed under epoch {epoch}"));
                }
            }
            self.db.log.push((h, epoch));
            let offset = self.db.log.len();
            self.hosts[h].actor.as_mut().expect("an actor").head = offset;
            self.acks.push((self.now, offset));
        } else {
            // A read, served from what the actor knows.
            if !self.serving(h) {
                return; // 503 lease-lost
            }
            let (head, acked) = (actor.head, self.acked_before);
            if acked > head {
                self.violations.push(format!(
                    "stale read at {}: host {h} served head {head} after offset {acked} was acknowledged",
                    self.now
                ));
            }
        }
    }

    fn drain(&mut self, h: usize) {
        if self.cut(h) {
            self.hosts[h].drain = None; // the write does not land: read again later
            return;
        }
        match self.hosts[h].drain.take() {
            None => {
                let now = self.now;
                let ids: Vec<u64> = self
                    .db
                    .pending
                    .iter()
                    .filter(|(_, r)| r.visible_at <= now)
                    .map(|(id, _)| *id)
                    .take(4)
                    .collect();
                if ids.is_empty() {
                    return;
                }
                for id in &ids {
                    let key = self.db.pending[id].key;
                    self.db.ingested.insert(key); // appended, deduplicated by key
                }
                let delete_at = self.now + self.rng.below(200) as i64;
                self.hosts[h].drain = Some(Drain { ids, delete_at });
            }
            Some(d) if d.delete_at > self.now => self.hosts[h].drain = Some(d),
            Some(d) => {
                let now = self.now;
                let gone: Vec<u64> = if self.p.exact_ingest_delete {
                    d.ids.clone()
                } else {
                    let last = *d.ids.iter().max().expect("a drained row");
                    self.db
                        .pending
                        .iter()
                        .filter(|(id, r)| **id <= last && r.visible_at <= now)
                        .map(|(id, _)| *id)
                        .collect()
                };
                for id in gone {
                    if let Some(row) = self.db.pending.remove(&id) {
                        if !self.db.ingested.contains(&row.key) {
                            self.violations
                                .push(format!("ingest row {id} deleted unappended by host {h}"));
                        }
                    }
                }
            }
        }
    }

    fn bridge(&mut self, h: usize) {
        if self.p.bridge_lease {
            let lapses = self.hosts[h].tenure.lapses();
            let held = self.hosts[h]
                .bridge
                .as_ref()
                .is_some_and(|b| b.lapses == lapses && self.serving(h));
            if !held {
                // Lost (or never had) the lease: stops at once.
                self.hosts[h].bridge = None;
                if self.cut(h) || !self.serving(h) {
                    return;
                }
                if Db::take(&mut self.db.bridge, &self.db.heartbeat, h, self.now).is_none() {
                    return;
                }
                // The consumer is made anew: everything still in the
                // stream is delivered to this host.
                let queued: BTreeSet<u64> = self
                    .db
                    .js
                    .iter()
                    .filter(|(_, appended)| !**appended)
                    .map(|(s, _)| *s)
                    .collect();
                self.db.js_delivered = self.db.js.keys().copied().collect();
                let max_seen = self.db.js.keys().next_back().copied().unwrap_or(0);
                self.hosts[h].bridge = Some(Bridging {
                    lapses,
                    queued,
                    max_seen,
                });
                return;
            }
        } else if self.hosts[h].bridge.is_none() {
            self.hosts[h].bridge = Some(Bridging {
                lapses: 0,
                queued: BTreeSet::new(),
                max_seen: 0,
            });
        }
        if self.cut(h) {
            return;
        }
        // Receive: the shared consumer hands each message to one host.
        let fresh: Vec<u64> = self
            .db
            .js
            .keys()
            .filter(|s| !self.db.js_delivered.contains(s))
            .copied()
            .take(3)
            .collect();
        let b = self.hosts[h].bridge.as_mut().expect("bridging");
        for s in fresh {
            self.db.js_delivered.insert(s);
            b.queued.insert(s);
            b.max_seen = b.max_seen.max(s);
        }
        // Append the oldest queued (committed to the stream).
        let n = self.rng.below(3) as usize;
        let appended: Vec<u64> = b.queued.iter().copied().take(n).collect();
        for s in &appended {
            b.queued.remove(s);
            if let Some(done) = self.db.js.get_mut(s) {
                *done = true;
            }
        }
        // Then purge below the lowest still waiting, if it may.
        if self.p.bridge_lease && !self.serving(h) {
            self.hosts[h].bridge = None;
            return;
        }
        let b = self.hosts[h].bridge.as_ref().expect("bridging");
        let floor = b
            .queued
            .iter()
            .next()
            .copied()
            .unwrap_or(u64::MAX)
            .min(b.max_seen + 1);
        let purged: Vec<u64> = self.db.js.range(..floor).map(|(s, _)| *s).collect();
        for s in purged {
            if self.db.js.remove(&s) == Some(false) {
                self.violations.push(format!(
                    "JetStream message {s} purged unappended by host {h}"
                ));
            }
        }
    }
}

/// Seeds that find at least one violation containing `kind`.
/// The first of 200 seeds whose run finds a violation of `kind`, if any.
fn seed_finding(p: Protocol, kind: &str) -> Option<u64> {
    (1..=200u64).find(|seed| Sim::run(p, *seed).iter().any(|v| v.contains(kind)))
}

#[test]
fn the_lease_protocol_keeps_its_promises_under_pauses_cuts_and_reordering() {
    for seed in 1..=200u64 {
        let v = Sim::run(CURRENT, seed);
        assert!(v.is_empty(), "seed {seed}: {v:?}");
    }
}

#[test]
fn the_simulation_finds_each_defect_the_remedies_fix() {
    let without_fence = Protocol {
        self_fence: false,
        ..CURRENT
    };
    assert!(
        seed_finding(without_fence, "stale read").is_some(),
        "a paused owner without its own fence served no stale read in 200 seeds"
    );
    let range_delete = Protocol {
        exact_ingest_delete: false,
        ..CURRENT
    };
    assert!(
        seed_finding(range_delete, "deleted unappended").is_some(),
        "deleting up to the last id lost no ingest row in 200 seeds"
    );
    let every_host_bridges = Protocol {
        bridge_lease: false,
        ..CURRENT
    };
    assert!(
        seed_finding(every_host_bridges, "purged unappended").is_some(),
        "every host bridging purged no unappended message in 200 seeds"
    );
}

#[test]
fn the_simulation_actually_moves_streams_between_hosts() {
    // Not a vacuous pass: pauses and cuts make other hosts take over.
    let mut takeovers = 0;
    for seed in 1..=20u64 {
        let mut sim = Sim::new(CURRENT, seed);
        let mut owner = None;
        for _ in 0..STEPS {
            sim.step_clock();
            sim.deliver();
            sim.faults();
            for h in 0..HOSTS {
                if !sim.paused(h) {
                    sim.renew(h);
                    if sim.rng.per_mille(300) {
                        sim.stream_work(h);
                    }
                }
            }
            let now_owner = sim.db.stream.map(|(o, _)| o);
            if owner.is_some() && now_owner != owner {
                takeovers += 1;
            }
            owner = now_owner;
        }
        assert!(
            sim.violations.is_empty(),
            "seed {seed}: {:?}",
            sim.violations
        );
        assert!(sim.acks.len() > 100, "seed {seed}: few appends");
    }
    assert!(takeovers > 20, "only {takeovers} takeovers");
}
