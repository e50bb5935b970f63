//! SQLite: the WAL is copied into the database file on a thread and a
//! connection of its own, beside the writer, not inside its commits.
//!
//! SQLite's default checkpoints after the commit that grows the WAL past
//! 1,000 pages, on the committing connection: the writer thread copied
//! 4 MB of pages and fsynced the database file while every queued write
//! (every project's) waited for it — tens of milliseconds under a stream
//! of large appends. Here the checkpointer wakes after commits (at most
//! every [`CHECKPOINT_EVERY`]) and runs a `PASSIVE` checkpoint, which
//! waits for no reader or writer; the writer keeps committing meanwhile.
//! The writer's own checkpoint stays as a backstop at
//! [`WRITER_CHECKPOINT_PAGES`]: the WAL starts over only when a checkpoint
//! has copied all of it, and a checkpointer racing a writer that never
//! pauses may not get there; the writer then copies what the checkpointer
//! has not, and the WAL stops growing.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

/// The shortest time between two checkpoints.
pub(crate) const CHECKPOINT_EVERY: Duration = Duration::from_millis(50);

/// The WAL pages (of 4 KiB) past which the writer checkpoints in its own
/// commit (SQLite's `wal_autocheckpoint`; its default is 1,000): 256 MiB.
/// Under a writer that never pauses (a project appending 7 MB events
/// without a break) the WAL starts over only here: at 64 MiB the
/// writer's own checkpoints copied the checkpointer's lag while everyone
/// waited (p99 ×4 of this value's).
pub(crate) const WRITER_CHECKPOINT_PAGES: u32 = 65_536;

/// The bytes of WAL file kept when the WAL starts over (SQLite's
/// `journal_size_limit`): what a burst grew past this is given back.
pub(crate) const WAL_KEPT_BYTES: i64 = 64 * 1024 * 1024;

#[derive(Default)]
struct Wake {
    /// Something committed since the last checkpoint began.
    written: bool,
    stop: bool,
}

/// The handle the writer holds: tells the checkpointer of commits, and
/// stops it when dropped.
pub(crate) struct Checkpointer {
    wake: Arc<(Mutex<Wake>, Condvar)>,
    /// Held while a checkpoint runs.
    running: Arc<Mutex<()>>,
}

impl Checkpointer {
    /// Starts the checkpointer of the database at `db_path`, with its own
    /// connection (`synchronous` as the writer's: a checkpoint fsyncs the
    /// WAL before it copies and the database file after).
    pub(crate) fn start(db_path: &std::path::Path, synchronous: &str) -> Result<Checkpointer> {
        let conn = rusqlite::Connection::open(db_path)
            .with_context(|| format!("opening {} to checkpoint it", db_path.display()))?;
        conn.pragma_update(None, "synchronous", synchronous)?;
        let wake = Arc::new((Mutex::new(Wake::default()), Condvar::new()));
        let running = Arc::new(Mutex::new(()));
        let (theirs, runs) = (wake.clone(), running.clone());
        std::thread::Builder::new()
            .name("streamhost-checkpoint".into())
            .spawn(move || run(&conn, &theirs, &runs))
            .context("starting the checkpoint thread")?;
        Ok(Checkpointer { wake, running })
    }

    /// Waits for a checkpoint under way to end, and holds the next one off
    /// while the guard lives (a redaction's truncating checkpoint).
    pub(crate) fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A commit wrote to the WAL.
    pub(crate) fn wrote(&self) {
        let (lock, cv) = &*self.wake;
        let mut wake = lock.lock().unwrap_or_else(|p| p.into_inner());
        if !wake.written {
            wake.written = true;
            cv.notify_one();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (lock, cv) = &*self.wake;
        lock.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        cv.notify_one();
    }
}

fn run(conn: &rusqlite::Connection, wake: &(Mutex<Wake>, Condvar), running: &Mutex<()>) {
    let (lock, cv) = wake;
    loop {
        {
            let mut w = lock.lock().unwrap_or_else(|p| p.into_inner());
            while !w.written && !w.stop {
                w = cv.wait(w).unwrap_or_else(|p| p.into_inner());
            }
            if w.stop {
                return;
            }
            w.written = false;
        }
        // A passive checkpoint copies what no reader still needs from the
        // WAL and waits for nobody.
        let checkpointed = {
            let _running = running.lock().unwrap_or_else(|p| p.into_inner());
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        };
        if let Err(e) = checkpointed {
            tracing::warn!(error = %e, "checkpointing the WAL (the writer's own checkpoint remains)");
        }
        // Paced; a stop ends the wait.
        let w = lock.lock().unwrap_or_else(|p| p.into_inner());
        let (w, _) = cv
            .wait_timeout_while(w, CHECKPOINT_EVERY, |w| !w.stop)
            .unwrap_or_else(|p| p.into_inner());
        if w.stop {
            return;
        }
    }
}
