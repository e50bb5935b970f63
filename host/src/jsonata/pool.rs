//! The threads JSONata runs on when the caller is an async task.
//!
//! Live connections and `waitForEvent` evaluate their conditions here, never
//! on the runtime's workers that serve HTTP. The threads run under
//! `SCHED_IDLE` (Linux): on CPU time no other thread wants, preempted at once
//! by any thread that wakes. Jobs queue per project and the threads take
//! them round-robin, at most [`per_project`] of one project's at a time: a
//! project whose expressions run up to their time bound again and again
//! waits behind its own jobs, never in front of another project's.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

/// Threads in the pool: one per core, at least two.
fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(2)
}

/// Jobs of one project that run at once: half the threads.
pub fn per_project() -> usize {
    (threads() / 2).max(1)
}

#[derive(Default)]
struct Queues {
    /// Waiting jobs, per project.
    jobs: HashMap<String, VecDeque<Job>>,
    /// Projects with waiting jobs, in turn order.
    turn: VecDeque<String>,
    /// Jobs running now, per project.
    running: HashMap<String, usize>,
}

impl Queues {
    /// The next job to run: the first project in turn that may run one
    /// more, which then goes to the back of the turn.
    fn next(&mut self, limit: usize) -> Option<(String, Job)> {
        let at = self
            .turn
            .iter()
            .position(|p| self.running.get(p).copied().unwrap_or(0) < limit)?;
        let project = self.turn.remove(at)?;
        let queue = self.jobs.get_mut(&project)?;
        let job = queue.pop_front()?;
        if queue.is_empty() {
            self.jobs.remove(&project);
        } else {
            self.turn.push_back(project.clone());
        }
        *self.running.entry(project.clone()).or_default() += 1;
        Some((project, job))
    }

    fn done(&mut self, project: &str) {
        if let Some(n) = self.running.get_mut(project) {
            *n -= 1;
            if *n == 0 {
                self.running.remove(project);
            }
        }
    }
}

struct Pool {
    queues: Mutex<Queues>,
    ready: Condvar,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            queues: Mutex::new(Queues::default()),
            ready: Condvar::new(),
        }));
        for i in 0..threads() {
            std::thread::Builder::new()
                .name(format!("jsonata-{i}"))
                .spawn(move || worker(pool))
                .expect("spawning a JSONata thread");
        }
        pool
    })
}

fn worker(pool: &Pool) {
    lower_priority();
    let limit = per_project();
    loop {
        let (project, job) = {
            let mut queues = pool.queues.lock().expect("the JSONata queues");
            loop {
                if let Some(next) = queues.next(limit) {
                    break next;
                }
                queues = pool.ready.wait(queues).expect("the JSONata queues");
            }
        };
        // A panic ends the job (its caller then panics), not the thread.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        pool.queues
            .lock()
            .expect("the JSONata queues")
            .done(&project);
        // A job of that project may be runnable now.
        pool.ready.notify_one();
    }
}

/// `SCHED_IDLE` for the calling thread (Linux): it runs on CPU time no
/// other thread wants, and any other thread that wakes preempts it at once.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: a plain system call on the calling thread (pid 0), with a
    // parameter that lives across it.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
    }
}

/// Runs `f` for `project` (`""`: the global namespace) on a JSONata thread
/// and returns its result.
pub async fn run<T: Send + 'static>(project: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    let pool = pool();
    {
        let mut queues = pool.queues.lock().expect("the JSONata queues");
        let queue = queues.jobs.entry(project.to_string()).or_default();
        let first = queue.is_empty();
        queue.push_back(job);
        if first {
            queues.turn.push_back(project.to_string());
        }
    }
    pool.ready.notify_one();
    match rx.await {
        Ok(v) => v,
        Err(_) => panic!("a JSONata job panicked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_jsonata_threads() {
        let name = run("a", || std::thread::current().name().map(str::to_string)).await;
        assert!(name.is_some_and(|n| n.starts_with("jsonata-")));
    }

    #[test]
    fn projects_take_turns_and_one_project_runs_at_most_its_share() {
        let mut q = Queues::default();
        for (project, n) in [("evil", 3), ("good", 2)] {
            for _ in 0..n {
                let queue = q.jobs.entry(project.to_string()).or_default();
                if queue.is_empty() {
                    q.turn.push_back(project.to_string());
                }
                queue.push_back(Box::new(|| {}));
            }
        }
        let order: Vec<String> = std::iter::from_fn(|| q.next(1).map(|(p, _)| p)).collect();
        // One each: the limit of one running job per project holds the rest.
        assert_eq!(order, ["evil", "good"]);
        q.done("evil");
        assert_eq!(q.next(1).map(|(p, _)| p).as_deref(), Some("evil"));
        assert!(q.next(1).is_none(), "evil runs one, good runs one");
        q.done("good");
        assert_eq!(q.next(1).map(|(p, _)| p).as_deref(), Some("good"));
    }
}
