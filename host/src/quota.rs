//! What one project may hold of a host's shared resources at once: live
//! connections (`[limits] max-live-connections-per-project`), the
//! ephemeral events held in memory (`[limits] max-ephemeral-bytes` for all
//! streams together, a quarter of it for one project, so one project filling
//! its share leaves room for the others), and the bytes of its stored events
//! (`[limits] max-project-bytes`, so one project cannot fill the disk the
//! others write to).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, ErrorKind};

/// Seconds a refused caller is told to wait.
const RETRY_AFTER_S: u32 = 1;

/// Counts per project, with a bound.
#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_project: HashMap<String, usize>,
}

impl Counts {
    fn add(&mut self, project: &str, n: usize) {
        self.total += n;
        *self.by_project.entry(project.to_string()).or_default() += n;
    }

    fn remove(&mut self, project: &str, n: usize) {
        self.total = self.total.saturating_sub(n);
        if let Some(c) = self.by_project.get_mut(project) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                self.by_project.remove(project);
            }
        }
    }

    fn of(&self, project: &str) -> usize {
        self.by_project.get(project).copied().unwrap_or(0)
    }
}

/// The live connections of each project.
#[derive(Debug)]
pub struct LiveConnections {
    max_per_project: usize,
    counts: Mutex<Counts>,
}

/// One live connection's place in its project's count; freed when dropped.
#[derive(Debug)]
pub struct LiveSlot {
    owner: Arc<LiveConnections>,
    project: String,
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        if let Ok(mut c) = self.owner.counts.lock() {
            c.remove(&self.project, 1);
        }
    }
}

impl LiveConnections {
    /// Counts with a bound of `max_per_project` connections per project.
    pub fn new(max_per_project: usize) -> Arc<LiveConnections> {
        Arc::new(LiveConnections {
            max_per_project,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// A slot for one more live connection of `project` (`""`: the global
    /// namespace), or `429 too-many-connections`.
    pub fn take(self: &Arc<Self>, project: &str) -> Result<LiveSlot, Error> {
        let mut c = self.counts.lock().expect("live connection counts");
        if c.of(project) >= self.max_per_project {
            let mut e = Error::new(
                ErrorKind::TooMany,
                "too-many-connections",
                format!(
                    "project {project:?} already holds {} live connections, the most \
                     [limits] max-live-connections-per-project allows: close one first",
                    self.max_per_project
                ),
            );
            e.retry_after_s = Some(RETRY_AFTER_S);
            return Err(e);
        }
        c.add(project, 1);
        Ok(LiveSlot {
            owner: Arc::clone(self),
            project: project.to_string(),
        })
    }
}

/// The bytes of ephemeral events held by every stream's buffer.
#[derive(Debug)]
pub struct EphemeralMemory {
    max: usize,
    counts: Mutex<Counts>,
}

impl EphemeralMemory {
    /// Counts with a bound of `max` bytes in total.
    pub fn new(max: usize) -> Arc<EphemeralMemory> {
        Arc::new(EphemeralMemory {
            max,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// What one project may hold.
    pub fn project_share(&self) -> usize {
        (self.max / 4).max(1)
    }

    /// Whether `bytes` more of `project`'s ephemeral events fit, or `503
    /// ephemeral-capacity-exhausted` naming the bound.
    pub fn admit(&self, project: &str, bytes: usize) -> Result<(), Error> {
        let c = self.counts.lock().expect("ephemeral counts");
        let (bound, held, whose) = if c.of(project) + bytes > self.project_share() {
            (
                self.project_share(),
                c.of(project),
                format!("project {project:?}'s share"),
            )
        } else if c.total + bytes > self.max {
            (self.max, c.total, "all streams together".to_string())
        } else {
            return Ok(());
        };
        Err(Error::unavailable(
            "ephemeral-capacity-exhausted",
            format!(
                "ephemeral events held in memory: {held} bytes for {whose}, and {bytes} more \
                 would pass the {bound}-byte bound ([limits] max-ephemeral-bytes); retry as \
                 older ones are evicted"
            ),
            RETRY_AFTER_S,
        ))
    }

    pub(crate) fn add(&self, project: &str, bytes: usize) {
        if let Ok(mut c) = self.counts.lock() {
            c.add(project, bytes);
        }
    }

    pub(crate) fn remove(&self, project: &str, bytes: usize) {
        if let Ok(mut c) = self.counts.lock() {
            c.remove(project, bytes);
        }
    }

    /// Bytes held now, by all streams.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.counts.lock().map(|c| c.total).unwrap_or(0)
    }
}

/// The bytes each project stores (its events, its processors' keyed state
/// and its components' versions), against `[limits] max-project-bytes`:
/// read from storage when the host opens and every few seconds after (what
/// other hosts and the platform's own appends wrote, what overwrites and
/// deletes gave back), and counted up by every append, keyed write and
/// deploy it admits in between, so that a burst cannot run far past the
/// bound.
#[derive(Debug)]
pub struct StoredBytes {
    max: Option<u64>,
    by_project: Mutex<HashMap<String, u64>>,
}

impl StoredBytes {
    /// Usage of a host bounded by `max` bytes a project (`None`: unbounded,
    /// nothing counted).
    pub fn new(max: Option<u64>) -> Arc<StoredBytes> {
        Arc::new(StoredBytes {
            max,
            by_project: Mutex::new(HashMap::new()),
        })
    }

    /// The bound, if any.
    pub fn max(&self) -> Option<u64> {
        self.max
    }

    /// What storage says each project's events take now (every project:
    /// one missing from `usage` stores nothing).
    pub fn refresh(&self, usage: Vec<(String, u64)>) {
        let mut by_project = self.by_project.lock().unwrap_or_else(|e| e.into_inner());
        *by_project = usage.into_iter().collect();
    }

    /// The bytes each project stores, as last counted, by project.
    pub fn all(&self) -> Vec<(String, u64)> {
        let by_project = self.by_project.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(String, u64)> = by_project.iter().map(|(p, b)| (p.clone(), *b)).collect();
        all.sort();
        all
    }

    /// Admits `bytes` more of `project`'s events and counts them, or `507
    /// project-storage-full` naming the bound and what the project stores.
    /// An append of nothing durable is always admitted.
    pub fn admit(&self, project: &str, bytes: u64) -> Result<(), Error> {
        self.fits(project, bytes, true)
    }

    /// Whether `bytes` more of `project`'s events would fit, without
    /// counting them (an ingest acceptance: its drain counts them).
    pub fn check(&self, project: &str, bytes: u64) -> Result<(), Error> {
        self.fits(project, bytes, false)
    }

    fn fits(&self, project: &str, bytes: u64, count: bool) -> Result<(), Error> {
        let Some(max) = self.max else {
            return Ok(());
        };
        if bytes == 0 {
            return Ok(());
        }
        let mut by_project = self.by_project.lock().unwrap_or_else(|e| e.into_inner());
        let stored = by_project.entry(project.to_string()).or_default();
        if stored.saturating_add(bytes) > max {
            return Err(Error::new(
                ErrorKind::InsufficientStorage,
                "project-storage-full",
                format!(
                    "project {project:?} stores {} bytes (events, keyed state and components), \
                     and {bytes} more would pass its bound of {max} bytes ([limits] \
                     max-project-bytes): nothing of this was stored",
                    *stored
                ),
            ));
        }
        if count {
            *stored += bytes;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_at_its_connection_bound_is_refused_until_one_closes() {
        let live = LiveConnections::new(2);
        let a1 = live.take("a").unwrap();
        let _a2 = live.take("a").unwrap();
        let e = live.take("a").unwrap_err();
        assert_eq!(
            (e.kind, e.code),
            (ErrorKind::TooMany, "too-many-connections")
        );
        assert!(e.message.contains("\"a\""), "{}", e.message);
        // Another project is not affected.
        let _b = live.take("b").unwrap();
        drop(a1);
        assert!(live.take("a").is_ok());
    }

    #[test]
    fn stored_bytes_are_bounded_per_project_counted_on_admission_and_refreshed() {
        let unbounded = StoredBytes::new(None);
        assert!(unbounded.admit("a", u64::MAX).is_ok());
        let s = StoredBytes::new(Some(1000));
        s.refresh(vec![("a".into(), 900)]);
        s.admit("a", 100).unwrap();
        let e = s.admit("a", 1).unwrap_err();
        assert_eq!(
            (e.kind, e.code),
            (ErrorKind::InsufficientStorage, "project-storage-full")
        );
        assert!(
            e.message.contains("\"a\" stores 1000 bytes") && e.message.contains("1000 bytes"),
            "{}",
            e.message
        );
        // Nothing durable is always admitted; another project has its own.
        assert!(s.admit("a", 0).is_ok());
        s.admit("b", 1000).unwrap();
        // Storage says less now (a stream deleted): room again.
        s.refresh(vec![("a".into(), 10)]);
        assert_eq!(s.all(), [("a".to_string(), 10)]);
        s.admit("a", 990).unwrap();
    }

    #[test]
    fn ephemeral_bytes_are_bounded_per_project_and_in_total() {
        let m = EphemeralMemory::new(400);
        m.admit("a", 100).unwrap();
        m.add("a", 100);
        let e = m.admit("a", 1).unwrap_err();
        assert_eq!(e.code, "ephemeral-capacity-exhausted");
        assert!(e.message.contains("share"), "{}", e.message);
        for p in ["b", "c", "d"] {
            m.admit(p, 100).unwrap();
            m.add(p, 100);
        }
        let e = m.admit("e", 1).unwrap_err();
        assert!(e.message.contains("all streams together"), "{}", e.message);
        m.remove("a", 100);
        m.admit("e", 100).unwrap();
        assert_eq!(m.held(), 300);
    }
}
