//! A stream actor's hold on its stream when several hosts share a
//! PostgreSQL database: the fence every write carries, whether the host's
//! leases lapsed since it was taken (the stream is loaded again first), and
//! whether the stream's last load found it owned elsewhere. On SQLite there
//! is no fence and nothing lapses. A sub-machine of the actor's core
//! ([`super::core::ActorCore`]): pure, the caller passes the host's lapse
//! count.

use crate::storage::Fence;

/// What one actor holds of its stream's lease.
#[derive(Debug, Default)]
pub(super) struct Tenure {
    /// This host's lease on the stream, carried by every write (`None` on
    /// SQLite, and while the lease is not this host's).
    fence: Option<Fence>,
    /// The host's lapse count when the fence was taken.
    lapses: u64,
    /// The last load found the stream owned by another host (or this host
    /// unable to serve it) with nothing of it held here: the actor goes as
    /// soon as it has answered, like one of a missing stream.
    elsewhere: bool,
}

impl Tenure {
    /// The fence a write carries.
    pub(super) fn fence(&self) -> Option<Fence> {
        self.fence.clone()
    }

    /// Whether this actor holds a fence (several hosts, the lease is its).
    pub(super) fn fenced(&self) -> bool {
        self.fence.is_some()
    }

    /// Whether the host's leases lapsed since the fence was taken (the host
    /// counts `host_lapses`): another host may have written the stream, so
    /// it is loaded (and its lease taken) again before anything is planned.
    pub(super) fn lapsed(&self, host_lapses: u64) -> bool {
        self.fenced() && host_lapses != self.lapses
    }

    /// Whether the last load found the stream owned elsewhere with nothing
    /// of it held here.
    pub(super) fn elsewhere(&self) -> bool {
        self.elsewhere
    }

    /// A load succeeded with `fence` (none on SQLite) when the host's lapse
    /// count was `host_lapses`.
    pub(super) fn taken(&mut self, fence: Option<Fence>, host_lapses: u64) {
        self.fence = fence;
        self.lapses = host_lapses;
        self.elsewhere = false;
    }

    /// Another host owns the stream: nothing of it stays here.
    pub(super) fn owned_elsewhere(&mut self) {
        self.fence = None;
        self.elsewhere = true;
    }

    /// This host cannot renew its leases: the actor stays only while it
    /// holds something of the stream (`holds_stream`).
    pub(super) fn lost(&mut self, holds_stream: bool) {
        self.elsewhere = !holds_stream;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(epoch: i64) -> Fence {
        Fence {
            project: "p".into(),
            path: "/s".into(),
            owner: "host-a".into(),
            epoch,
        }
    }

    #[test]
    fn on_sqlite_nothing_is_fenced_and_nothing_lapses() {
        let mut t = Tenure::default();
        t.taken(None, 0);
        assert!(!t.fenced() && t.fence().is_none());
        assert!(
            !t.lapsed(7),
            "no fence: the host's lapses are not this stream's"
        );
    }

    #[test]
    fn a_fence_lapses_when_the_hosts_count_moves_and_a_new_load_takes_it_again() {
        let mut t = Tenure::default();
        t.taken(Some(fence(1)), 3);
        assert_eq!(t.fence(), Some(fence(1)));
        assert!(!t.lapsed(3));
        assert!(t.lapsed(4), "a renewal found the lease expired since");
        t.taken(Some(fence(2)), 4);
        assert!(!t.lapsed(4));
        assert_eq!(t.fence().map(|f| f.epoch), Some(2));
    }

    #[test]
    fn owned_elsewhere_drops_the_fence_until_a_load_takes_the_stream() {
        let mut t = Tenure::default();
        t.taken(Some(fence(1)), 0);
        t.owned_elsewhere();
        assert!(t.elsewhere() && !t.fenced() && !t.lapsed(9));
        t.taken(Some(fence(2)), 9);
        assert!(!t.elsewhere() && t.fenced());
    }

    #[test]
    fn a_lost_lease_keeps_the_actor_only_while_it_holds_the_stream() {
        let mut t = Tenure::default();
        t.taken(Some(fence(1)), 0);
        t.lost(true);
        assert!(!t.elsewhere());
        t.lost(false);
        assert!(t.elsewhere());
    }
}
