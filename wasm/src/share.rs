//! Guest calls at once, per project and in all: a call into a component
//! that a caller asks for (an ITX call, a fold to an offset) or a shadow
//! runs holds a place of its project's share
//! (`[processors] max-concurrent-calls-per-project`) and one of the host's
//! (`max-concurrent-calls`, well under the blocking pool's threads), so one
//! project's looping calls never take the threads that serve another's
//! reads and writes.
//!
//! A call waits for its project's place first, then for the host's: a
//! project at its share queues behind its own calls, never in front of
//! another project's (the host's places are handed out first come, first
//! served, and a project has at most its share waiting for them).
//!
//! A processor wake and an ITX receiver's batch take the same places
//! (`executor::spawn`): one that must wait has no deadline until it has
//! them (the delivery schedule's `placed`). The deliveries' places
//! (`[delivery] concurrency`: webhook POSTs and copies) are another
//! `Shares`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use streamhost_core::error::Error;

/// The places of guest calls (see the module).
pub struct Shares {
    host: Arc<Semaphore>,
    per_project: usize,
    projects: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// A call's places, given back when dropped (fields drop in order: the
/// places, then the project's entry).
pub struct Place {
    _host: OwnedSemaphorePermit,
    _project: OwnedSemaphorePermit,
    _entry: Entry,
}

/// A call's claim on its project's share: when the last is gone (placed,
/// or given up waiting), the share is forgotten, so a project touched once
/// costs nothing after.
struct Entry {
    name: String,
    shares: Arc<Shares>,
}

impl Shares {
    pub fn new(total: usize, per_project: usize) -> Arc<Shares> {
        Arc::new(Shares {
            host: Arc::new(Semaphore::new(total.max(1))),
            per_project: per_project.max(1),
            projects: Mutex::new(HashMap::new()),
        })
    }

    /// A project's share of places (the first call makes it).
    fn of(&self, project: &str) -> Arc<Semaphore> {
        let mut projects = self.projects.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            projects
                .entry(project.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_project))),
        )
    }

    /// Places for one call of `project`, waited for as long as it takes.
    pub async fn enter(self: &Arc<Self>, project: &str) -> Place {
        // Dropped last, also when the caller stops waiting.
        let entry = Entry {
            name: project.to_string(),
            shares: Arc::clone(self),
        };
        let project_place = self
            .of(project)
            .acquire_owned()
            .await
            .expect("never closed");
        let host_place = Arc::clone(&self.host)
            .acquire_owned()
            .await
            .expect("never closed");
        Place {
            _host: host_place,
            _project: project_place,
            _entry: entry,
        }
    }

    /// Places for one call of `project` if both are free now, without
    /// waiting (and without passing anyone who waits).
    pub fn try_enter(self: &Arc<Self>, project: &str) -> Option<Place> {
        let entry = Entry {
            name: project.to_string(),
            shares: Arc::clone(self),
        };
        let project_place = self.of(project).try_acquire_owned().ok()?;
        let host_place = Arc::clone(&self.host).try_acquire_owned().ok()?;
        Some(Place {
            _host: host_place,
            _project: project_place,
            _entry: entry,
        })
    }

    /// Places for one call of `project` within `wait`, else `429
    /// too-many-calls` naming the share.
    pub async fn enter_within(
        self: &Arc<Self>,
        project: &str,
        wait: Duration,
    ) -> Result<Place, Error> {
        tokio::time::timeout(wait, self.enter(project))
            .await
            .map_err(|_| {
                let mut e = Error::new(
                    streamhost_core::error::ErrorKind::TooMany,
                    "too-many-calls",
                    format!(
                        "project {project:?} has {} calls into its components running \
                         ([processors] max-concurrent-calls-per-project = {}), or the host all \
                         it runs at once; this one waited {} ms: retry later",
                        self.per_project,
                        self.per_project,
                        wait.as_millis()
                    ),
                );
                e.retry_after_s = Some(1);
                e
            })
    }

    /// Calls of `project` running now.
    #[cfg(test)]
    pub fn running(&self, project: &str) -> usize {
        let projects = self.projects.lock().unwrap_or_else(|e| e.into_inner());
        projects
            .get(project)
            .map_or(0, |s| self.per_project - s.available_permits())
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // Only the map holds a share nobody holds or waits for.
        let mut projects = self
            .shares
            .projects
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if projects
            .get(&self.name)
            .is_some_and(|s| Arc::strong_count(s) == 1)
        {
            projects.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_project_at_its_share_waits_and_another_does_not() {
        let shares = Shares::new(8, 2);
        let a1 = shares.enter("a").await;
        let _a2 = shares.enter("a").await;
        let refused = shares
            .enter_within("a", Duration::from_millis(20))
            .await
            .err()
            .expect("a third call of a waits");
        assert_eq!(
            (refused.code, refused.retry_after_s),
            ("too-many-calls", Some(1))
        );
        assert!(
            refused
                .message
                .contains("max-concurrent-calls-per-project = 2"),
            "{}",
            refused.message
        );
        let _b = shares
            .enter_within("b", Duration::from_millis(20))
            .await
            .expect("b has its own share");
        assert_eq!(shares.running("a"), 2);
        drop(a1);
        let _a3 = shares
            .enter_within("a", Duration::from_millis(20))
            .await
            .expect("a place given back");
    }

    #[tokio::test]
    async fn a_place_is_taken_without_waiting_only_when_both_are_free() {
        let shares = Shares::new(3, 2);
        let a1 = shares.try_enter("a").expect("free");
        let _a2 = shares.try_enter("a").expect("free");
        assert!(shares.try_enter("a").is_none(), "a is at its share");
        let b = shares.try_enter("b").expect("b has its own share");
        assert!(shares.try_enter("c").is_none(), "the host is full");
        assert_eq!(shares.running("c"), 0, "a refused try holds nothing");
        drop(b);
        assert!(shares.try_enter("c").is_some());
        // Someone waiting is not passed: a's waiter gets a's place back.
        let mut waiter = std::pin::pin!(shares.enter("a"));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(
            waiter.as_mut().poll(&mut cx).is_pending(),
            "a is at its share"
        );
        drop(a1);
        assert!(
            shares.try_enter("a").is_none(),
            "a's freed place is the waiter's"
        );
        let _placed = waiter.await;
    }

    #[tokio::test]
    async fn the_host_bound_holds_over_all_projects_and_shares_are_forgotten() {
        let shares = Shares::new(2, 2);
        let a = shares.enter("a").await;
        let b = shares.enter("b").await;
        assert!(shares
            .enter_within("c", Duration::from_millis(20))
            .await
            .is_err());
        drop((a, b));
        assert!(shares.projects.lock().unwrap().is_empty());
        assert!(shares
            .enter_within("c", Duration::from_millis(20))
            .await
            .is_ok());
    }
}
