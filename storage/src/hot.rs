//! What storage keeps in memory for the hot read paths (a wake, a delivery,
//! an ITX call): each recently written stream's newest events, processors'
//! checkpoints and component rows.
//!
//! **Invariant:** an entry is what SQLite would answer. The writer thread
//! changes entries only after the transaction holding the change has
//! committed and before that write is answered, in commit order. Readers
//! that miss read SQLite and may fill a checkpoint or component entry, but
//! only if no write touched the cache in between (a generation check), so a
//! stale row can never be put back over a newer one.
//!
//! A stream's tail is a contiguous suffix of its stored log: every stored
//! event from its first offset on. Only streams that are read get one: the
//! first read of a stream (a miss) asks for it, and it starts at the next
//! commit the writer sees (stored events only ever go after the head), so a
//! later read that starts inside it needs no SQL. Bounded: events per
//! stream, and bytes over all streams (least recently written streams go
//! first, and are asked for again by their next read); checkpoints and
//! components are bounded by bytes and count.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use super::writer::WriteOp;
use super::{CheckpointRow, ComponentRow};

/// Newest events kept per stream: a full delivery batch.
pub const TAIL_EVENTS_MAX: usize = 1000;
/// Bytes of event bodies kept over all streams.
pub const TAIL_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Largest processor state kept; larger ones are read from SQLite.
pub const CHECKPOINT_STATE_BYTES_MAX: usize = 1024 * 1024;
/// Bytes of processor state kept over all checkpoints.
pub const CHECKPOINT_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Component rows kept (present or absent).
pub const COMPONENTS_MAX: usize = 4096;

#[derive(Default)]
struct Tail {
    /// Bodies are shared, so a reader copies them after letting go of the lock.
    events: VecDeque<(u64, Arc<String>)>,
    bytes: usize,
    /// When the stream was last written (the cache's tick).
    written: u64,
}

#[derive(Default)]
struct State {
    /// Bumped by every write that changes checkpoints or components.
    generation: u64,
    tick: u64,
    tails: HashMap<i64, Tail>,
    tail_bytes: usize,
    checkpoints: HashMap<(i64, String), CheckpointRow>,
    checkpoint_bytes: usize,
    components: HashMap<(String, String), Option<ComponentRow>>,
    /// Whether a refold of a component is pending (what wakes ask).
    refolds: HashMap<(String, String), bool>,
}

/// The cache. Shared by the readers and the writer thread.
pub struct Hot {
    state: RwLock<State>,
    /// Processors' committed key values (`keys.rs`).
    pub(super) keys: super::keys::KeyCache,
}

impl Default for Hot {
    fn default() -> Self {
        Hot::new(crate::KEY_CACHE_BYTES_DEFAULT)
    }
}

/// A reader's ticket to fill an entry it missed: the generation it saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Miss(u64);

impl Hot {
    /// An empty cache whose key values hold at most `key_cache_bytes`.
    pub fn new(key_cache_bytes: u64) -> Hot {
        Hot {
            state: RwLock::default(),
            keys: super::keys::KeyCache::new(key_cache_bytes),
        }
    }

    // A panic while holding the lock leaves plain data behind; what is in
    // it was consistent at every unlock, so poisoning is ignored.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Stored events of `row_id` with `after < offset <= up_to`, at most
    /// `limit` and no more bytes than reach `max_bytes` (at least one), in
    /// order, if the stream's tail holds all of them.
    pub fn events_after(
        &self,
        row_id: i64,
        after: u64,
        limit: usize,
        up_to: u64,
        max_bytes: usize,
    ) -> Option<Vec<(u64, String)>> {
        let shared: Vec<(u64, Arc<String>)> = {
            let state = self.read();
            let Some(tail) = state.tails.get(&row_id) else {
                drop(state);
                // Someone reads this stream: keep its tail from the next
                // commit on. Streams nobody reads cost the writer nothing.
                self.write().tails.entry(row_id).or_default();
                return None;
            };
            let first = tail.events.front()?.0;
            if after.saturating_add(1) < first {
                return None;
            }
            // Offsets in a tail are increasing: skip to the first one after.
            let start = tail.events.partition_point(|(o, _)| *o <= after);
            let mut bytes = 0usize;
            tail.events
                .range(start..)
                .take_while(|(o, _)| *o <= up_to)
                .take(limit)
                .take_while(|(_, body)| {
                    let more = bytes < max_bytes;
                    bytes = bytes.saturating_add(body.len());
                    more
                })
                .cloned()
                .collect()
        };
        Some(
            shared
                .into_iter()
                .map(|(o, body)| (o, String::clone(&body)))
                .collect(),
        )
    }

    /// The checkpoint of (`row_id`, `component`), or a ticket to fill it.
    pub fn checkpoint(&self, row_id: i64, component: &str) -> Result<CheckpointRow, Miss> {
        let state = self.read();
        // (A borrowed key would need the tuple's parts borrowed together.)
        match state.checkpoints.get(&(row_id, component.to_string())) {
            Some(row) => Ok(row.clone()),
            None => Err(Miss(state.generation)),
        }
    }

    /// Fills a checkpoint read from SQLite, unless a write came in between.
    pub fn fill_checkpoint(&self, miss: Miss, row_id: i64, component: &str, row: &CheckpointRow) {
        let mut state = self.write();
        if state.generation == miss.0 {
            state.put_checkpoint(row_id, component, row.clone());
        }
    }

    /// The component row of (`project`, `name`) (`Some(None)`: known not to
    /// be deployed), or a ticket to fill it.
    pub fn component(&self, project: &str, name: &str) -> Result<Option<ComponentRow>, Miss> {
        let state = self.read();
        match state
            .components
            .get(&(project.to_string(), name.to_string()))
        {
            Some(row) => Ok(row.clone()),
            None => Err(Miss(state.generation)),
        }
    }

    /// Fills a component row read from SQLite, unless a write came in between.
    pub fn fill_component(
        &self,
        miss: Miss,
        project: &str,
        name: &str,
        row: &Option<ComponentRow>,
    ) {
        let mut state = self.write();
        if state.generation == miss.0 {
            if state.components.len() >= COMPONENTS_MAX {
                state.components.clear();
            }
            state
                .components
                .insert((project.to_string(), name.to_string()), row.clone());
        }
    }

    /// Whether a refold of component `name` of `project` is pending.
    pub fn refold_pending(&self, project: &str, name: &str) -> Result<bool, Miss> {
        let state = self.read();
        match state.refolds.get(&(project.to_string(), name.to_string())) {
            Some(pending) => Ok(*pending),
            None => Err(Miss(state.generation)),
        }
    }

    /// Fills what was read of a pending refold, unless a write came in
    /// between.
    pub fn fill_refold(&self, miss: Miss, project: &str, name: &str, pending: bool) {
        let mut state = self.write();
        if state.generation == miss.0 {
            if state.refolds.len() >= COMPONENTS_MAX {
                state.refolds.clear();
            }
            state
                .refolds
                .insert((project.to_string(), name.to_string()), pending);
        }
    }

    /// Forgets a component's row and refold: another host deployed a
    /// version of it, or finished its refold.
    pub(super) fn forget_component(&self, project: &str, name: &str) {
        let mut state = self.write();
        state.generation += 1;
        let key = (project.to_string(), name.to_string());
        state.components.remove(&key);
        state.refolds.remove(&key);
    }

    /// Forgets every component row and refold: deploys on other hosts may
    /// have gone unheard (the connection that hears of them was lost).
    pub(super) fn forget_components(&self) {
        let mut state = self.write();
        state.generation += 1;
        state.components.clear();
        state.refolds.clear();
    }

    /// Forgets what it holds of stream `row_id`: with several hosts, other
    /// hosts wrote to it while this one did not own it.
    pub(super) fn forget_stream(&self, row_id: i64) {
        self.write().forget_stream(row_id);
    }

    /// Forgets everything (a commit failed and may or may not have reached
    /// the disk); readers go back to SQLite and ask again.
    pub(super) fn clear(&self) {
        self.keys.clear();
        let mut state = self.write();
        let generation = state.generation + 1;
        *state = State {
            generation,
            ..State::default()
        };
    }

    /// Applies committed writes, in commit order: `row_id` is each one's
    /// answer (the stream row a commit wrote to). Called by the writer only,
    /// with writes it is done with: event bodies and states move into the
    /// cache, nothing is copied.
    pub(super) fn committed<'a>(&self, writes: impl Iterator<Item = (&'a mut WriteOp, i64)>) {
        let mut state = self.write();
        for (op, row_id) in writes {
            match op {
                WriteOp::Commit(c) if !c.events.is_empty() => {
                    if !c.redactions.is_empty() || c.removed_through.is_some() {
                        // A body it holds changed: the tail goes, and is
                        // asked for again by the next read.
                        if let Some(t) = state.tails.remove(&row_id) {
                            state.tail_bytes -= t.bytes;
                        }
                    }
                    let events = std::mem::take(&mut c.events);
                    state.append(row_id, events.into_iter().map(|e| (e.offset, e.body)));
                }
                WriteOp::Checkpoint(c) => {
                    state.generation += 1;
                    let from = match &c.previous_offset {
                        Some(p) if p.bucket == c.bucket => super::keys::tag(p),
                        _ => String::new(),
                    };
                    let keys = std::mem::take(&mut c.keys);
                    let to = super::keys::tag(&super::CheckpointId {
                        stream_id: c.stream_id.clone(),
                        offset: c.offset,
                        digest: c.digest.clone(),
                        bucket: c.bucket,
                    });
                    self.keys.committed(c.bucket, &from, &to, &keys);
                    if let Some(old) = c.drop_bucket {
                        self.keys.forget(old);
                    }
                    state.remove_checkpoint(c.row_id, &c.component);
                    // (`put_checkpoint` keeps only states under the bound.)
                    let row = CheckpointRow {
                        stream_id: c.stream_id.clone(),
                        checkpoint_offset: c.offset,
                        state: std::mem::take(&mut c.state),
                        digest: c.digest.clone(),
                        updated_at: c.updated_at.clone(),
                        bucket: c.bucket,
                    };
                    state.put_checkpoint(c.row_id, &c.component, row);
                }
                WriteOp::Deploy(d) => {
                    state.generation += 1;
                    let key = (d.project.clone(), d.name.clone());
                    state.components.remove(&key);
                    state.refolds.remove(&key);
                }
                WriteOp::RefoldDone { project, name, .. } => {
                    state.generation += 1;
                    state.refolds.remove(&(project.clone(), name.clone()));
                }
                WriteOp::Reset { row_id, .. } => state.forget_stream(*row_id),
                _ => {}
            }
        }
    }
}

impl State {
    /// Drops a stream's tail and checkpoints (and fills in flight).
    fn forget_stream(&mut self, row_id: i64) {
        self.generation += 1;
        if let Some(t) = self.tails.remove(&row_id) {
            self.tail_bytes -= t.bytes;
        }
        let gone: Vec<_> = self
            .checkpoints
            .keys()
            .filter(|(r, _)| *r == row_id)
            .cloned()
            .collect();
        for (r, component) in gone {
            self.remove_checkpoint(r, &component);
        }
    }

    fn append(&mut self, row_id: i64, events: impl Iterator<Item = (u64, Arc<String>)>) {
        self.tick += 1;
        let tick = self.tick;
        let Some(tail) = self.tails.get_mut(&row_id) else {
            return;
        };
        tail.written = tick;
        let mut added = 0;
        for (offset, body) in events {
            if tail
                .events
                .back()
                .is_some_and(|(last, _)| offset != last + 1)
            {
                // Not the next offset (a write this cache never saw): the
                // tail would hide a gap, so it goes and is asked for again.
                let gone = self.tails.remove(&row_id).expect("the tail being extended");
                self.tail_bytes -= gone.bytes;
                return;
            }
            added += body.len();
            tail.events.push_back((offset, body));
        }
        tail.bytes += added;
        self.tail_bytes += added;
        let mut removed = 0;
        while tail.events.len() > TAIL_EVENTS_MAX {
            let (_, body) = tail.events.pop_front().expect("longer than the bound");
            removed += body.len();
        }
        tail.bytes -= removed;
        self.tail_bytes -= removed;
        if self.tail_bytes > TAIL_BYTES_MAX {
            self.evict_tails(row_id);
        }
    }

    /// Drops the least recently written tails (never `keep`'s) until the
    /// tails fit in three quarters of the bound: eviction is amortized.
    fn evict_tails(&mut self, keep: i64) {
        let mut by_age: Vec<(u64, i64)> = self
            .tails
            .iter()
            .filter(|(r, _)| **r != keep)
            .map(|(r, t)| (t.written, *r))
            .collect();
        by_age.sort_unstable();
        for (_, r) in by_age {
            if self.tail_bytes <= TAIL_BYTES_MAX / 4 * 3 {
                break;
            }
            if let Some(t) = self.tails.remove(&r) {
                self.tail_bytes -= t.bytes;
            }
        }
        if self.tail_bytes > TAIL_BYTES_MAX {
            // One stream alone passes the bound: keep its newest events.
            if let Some(tail) = self.tails.get_mut(&keep) {
                while tail.bytes > TAIL_BYTES_MAX / 4 * 3 && tail.events.len() > 1 {
                    let (_, body) = tail.events.pop_front().expect("non-empty");
                    tail.bytes -= body.len();
                    self.tail_bytes -= body.len();
                }
            }
        }
    }

    fn put_checkpoint(&mut self, row_id: i64, component: &str, row: CheckpointRow) {
        if row.state.len() > CHECKPOINT_STATE_BYTES_MAX {
            return;
        }
        self.remove_checkpoint(row_id, component);
        if self.checkpoint_bytes + row.state.len() > CHECKPOINT_BYTES_MAX {
            self.checkpoints.clear();
            self.checkpoint_bytes = 0;
        }
        self.checkpoint_bytes += row.state.len();
        self.checkpoints
            .insert((row_id, component.to_string()), row);
    }

    fn remove_checkpoint(&mut self, row_id: i64, component: &str) {
        if let Some(old) = self.checkpoints.remove(&(row_id, component.to_string())) {
            self.checkpoint_bytes -= old.state.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::{Checkpoint, StoredEvent, StreamCommit, StreamRef};

    fn commit(row_id: i64, offsets: std::ops::RangeInclusive<u64>) -> WriteOp {
        WriteOp::Commit(StreamCommit {
            stream: StreamRef::Existing {
                row_id,
                expected_head: offsets.start() - 1,
            },
            events: offsets
                .clone()
                .map(|o| StoredEvent {
                    offset: o,
                    event_type: "t".into(),
                    idempotency_key: None,
                    body: Arc::new(format!("{{\"offset\":{o}}}")),
                })
                .collect(),
            head_offset: *offsets.end(),
            state_json: String::new(),
            state_offset: 0,
            cursors: Vec::new(),
            removed_cursors: Vec::new(),
            fence: None,
            effects: Vec::new(),
            settled: None,
            redactions: Vec::new(),
            removed_through: None,
            staged: Vec::new(),
        })
    }

    fn offsets(v: Option<Vec<(u64, String)>>) -> Option<Vec<u64>> {
        v.map(|v| v.into_iter().map(|(o, _)| o).collect())
    }

    #[test]
    fn a_tail_answers_reads_that_start_inside_it_and_only_those() {
        let hot = Hot::default();
        let mut unread = [commit(1, 1..=4)];
        hot.committed(unread.iter_mut().map(|op| (op, 1)));
        assert_eq!(
            hot.events_after(1, 0, 10, u64::MAX, usize::MAX),
            None,
            "a stream nobody read has no tail; this read asks for one"
        );
        let mut ops = [commit(1, 5..=7), commit(1, 8..=9)];
        hot.committed(ops.iter_mut().map(|op| (op, 1)));
        assert_eq!(
            offsets(hot.events_after(1, 3, 10, 9, usize::MAX)),
            None,
            "4 may exist"
        );
        assert_eq!(
            offsets(hot.events_after(1, 4, 10, 9, usize::MAX)),
            Some(vec![5, 6, 7, 8, 9])
        );
        assert_eq!(
            offsets(hot.events_after(1, 6, 2, 9, usize::MAX)),
            Some(vec![7, 8])
        );
        assert_eq!(
            offsets(hot.events_after(1, 6, 10, 7, usize::MAX)),
            Some(vec![7])
        );
        // A byte bound stops at the first event that reaches it, never
        // before the first.
        let size = hot.events_after(1, 4, 1, 9, usize::MAX).unwrap()[0].1.len();
        assert_eq!(offsets(hot.events_after(1, 4, 10, 9, 1)), Some(vec![5]));
        assert_eq!(offsets(hot.events_after(1, 4, 10, 9, size)), Some(vec![5]));
        assert_eq!(
            offsets(hot.events_after(1, 4, 10, 9, size + 1)),
            Some(vec![5, 6])
        );
        assert_eq!(
            offsets(hot.events_after(1, 9, 10, u64::MAX, usize::MAX)),
            Some(vec![])
        );
        assert_eq!(
            hot.events_after(2, 0, 10, u64::MAX, usize::MAX),
            None,
            "another row"
        );
    }

    #[test]
    fn a_tail_keeps_the_newest_events_and_a_reset_drops_it() {
        let hot = Hot::default();
        assert_eq!(
            hot.events_after(1, 0, 1, 1, usize::MAX),
            None,
            "asks for a tail"
        );
        let n = TAIL_EVENTS_MAX as u64 + 10;
        let mut op = commit(1, 1..=n);
        hot.committed(std::iter::once((&mut op, 1)));
        assert_eq!(
            hot.events_after(1, 9, 1, n, usize::MAX),
            None,
            "10 was evicted"
        );
        assert_eq!(
            offsets(hot.events_after(1, 10, 1, n, usize::MAX)),
            Some(vec![11])
        );
        let mut reset = WriteOp::Reset {
            row_id: 1,
            fence: None,
        };
        hot.committed(std::iter::once((&mut reset, 1)));
        assert_eq!(hot.events_after(1, 10, 1, n, usize::MAX), None);
    }

    #[test]
    fn a_write_the_cache_never_saw_drops_the_tail_and_a_failed_commit_clears_all() {
        let hot = Hot::default();
        assert_eq!(
            hot.events_after(1, 0, 10, 9, usize::MAX),
            None,
            "asks for a tail"
        );
        let mut first = commit(1, 1..=3);
        hot.committed(std::iter::once((&mut first, 1)));
        assert_eq!(
            offsets(hot.events_after(1, 0, 10, 3, usize::MAX)),
            Some(vec![1, 2, 3])
        );
        // 4..=5 committed but its answer was an error (never applied here).
        let mut after_gap = commit(1, 6..=7);
        hot.committed(std::iter::once((&mut after_gap, 1)));
        assert_eq!(
            hot.events_after(1, 0, 10, 7, usize::MAX),
            None,
            "no tail with a hole"
        );
        assert_eq!(hot.events_after(1, 5, 10, 7, usize::MAX), None);

        let mut again = commit(1, 8..=8);
        hot.committed(std::iter::once((&mut again, 1)));
        assert_eq!(
            offsets(hot.events_after(1, 7, 10, 8, usize::MAX)),
            Some(vec![8])
        );
        let miss = hot.checkpoint(1, "c").unwrap_err();
        hot.clear();
        assert_eq!(hot.events_after(1, 7, 10, 8, usize::MAX), None, "cleared");
        let row = CheckpointRow {
            stream_id: "s".into(),
            checkpoint_offset: 1,
            state: "{}".into(),
            digest: "d".into(),
            updated_at: "t".into(),
            bucket: 0,
        };
        hot.fill_checkpoint(miss, 1, "c", &row);
        assert!(
            hot.checkpoint(1, "c").is_err(),
            "a read from before the clear cannot fill"
        );
    }

    fn checkpoint(offset: u64) -> WriteOp {
        WriteOp::Checkpoint(Checkpoint {
            row_id: 1,
            component: "c".into(),
            stream_id: "s".into(),
            previous_offset: None,
            offset,
            state: format!("{{\"n\":{offset}}}"),
            digest: "d".into(),
            effects: Vec::new(),
            bucket: 0,
            keys: Default::default(),
            drop_bucket: None,
            adopts_scratch: false,
            updated_at: "t".into(),
            now_ms: 0,
            project: "p".into(),
            path: "/x".into(),
            fence: None,
        })
    }

    #[test]
    fn a_fill_that_raced_a_write_is_dropped() {
        let hot = Hot::default();
        let miss = hot.checkpoint(1, "c").unwrap_err();
        // The writer commits offset 2 while the reader read offset 1 from SQLite.
        let mut op = checkpoint(2);
        hot.committed(std::iter::once((&mut op, 1)));
        let stale = CheckpointRow {
            stream_id: "s".into(),
            checkpoint_offset: 1,
            state: "{}".into(),
            digest: "d".into(),
            updated_at: "t".into(),
            bucket: 0,
        };
        hot.fill_checkpoint(miss, 1, "c", &stale);
        assert_eq!(hot.checkpoint(1, "c").unwrap().checkpoint_offset, 2);
        let mut reset = WriteOp::Reset {
            row_id: 1,
            fence: None,
        };
        hot.committed(std::iter::once((&mut reset, 1)));
        let miss = hot.checkpoint(1, "c").unwrap_err();
        hot.fill_checkpoint(miss, 1, "c", &stale);
        assert_eq!(hot.checkpoint(1, "c").unwrap().checkpoint_offset, 1);
    }

    #[test]
    fn a_deploy_forgets_the_component_row() {
        let hot = Hot::default();
        let miss = hot.component("p", "c").unwrap_err();
        hot.fill_component(miss, "p", "c", &None);
        assert_eq!(hot.component("p", "c"), Ok(None));
        let mut deploy = WriteOp::Deploy(crate::Deployment {
            project: "p".into(),
            name: "c".into(),
            digest: "d".into(),
            exports: vec![],
            bytes: vec![],
            deployed_at: "t".into(),
            mode: Default::default(),
            versions_kept: crate::VERSIONS_KEPT_DEFAULT,
        });
        hot.committed(std::iter::once((&mut deploy, 0)));
        assert!(hot.component("p", "c").is_err());
    }
}
