//! The threads JSONata runs on when the caller is an async task.
//!
//! Live connections and `waitForEvent` evaluate their conditions here, never
//! on the runtime's workers that serve HTTP. The threads run at a lower
//! scheduling priority (nice 10), so a project whose expressions keep them
//! busy takes CPU only left over by requests; every evaluation is bounded in
//! time and size, so a queued job waits at most for the jobs ahead of it.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

/// Threads in the pool: one per core, at least two.
fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(2)
}

fn queue() -> &'static Mutex<Sender<Job>> {
    static QUEUE: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();
    QUEUE.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads() {
            let rx = Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("jsonata-{i}"))
                .spawn(move || worker(&rx))
                .expect("spawning a JSONata thread");
        }
        Mutex::new(tx)
    })
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    lower_priority();
    loop {
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        match job {
            // A panic ends the job (its caller then panics), not the thread.
            Ok(job) => {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
            Err(_) => return,
        }
    }
}

/// Nice 10 for the calling thread (Linux: `setpriority` on a thread id).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain system calls on the calling thread's own id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

/// Runs `f` on a JSONata thread and returns its result.
pub async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    queue()
        .lock()
        .expect("the JSONata queue")
        .send(job)
        .expect("JSONata threads never exit while the queue lives");
    match rx.await {
        Ok(v) => v,
        Err(_) => panic!("a JSONata job panicked"),
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn jobs_run_on_jsonata_threads() {
        let name = super::run(|| std::thread::current().name().map(str::to_string)).await;
        assert!(name.is_some_and(|n| n.starts_with("jsonata-")));
    }
}
