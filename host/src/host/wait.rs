//! Waiting until something a host runs is as asked: look, then look again
//! when the executors report an end on this host, and every quarter second
//! (the work may run on another host), until a deadline.

use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Error, ErrorKind};

/// How often a wait looks again with nothing ending on this host.
const RECHECK: Duration = Duration::from_millis(250);

/// What one look found.
pub(crate) enum Look<T, S> {
    /// As waited for.
    Done(T),
    /// Not yet: what the timeout's message tells of.
    NotYet(S),
}

/// Looks with `look` until it answers [`Look::Done`] (or an error), again
/// each time `ended` changes and every [`RECHECK`]; after `within`, a
/// `timeout` error whose message `late` writes from the last look.
pub(crate) async fn until<T, S>(
    ended: &watch::Sender<u64>,
    within: Duration,
    mut look: impl AsyncFnMut() -> Result<Look<T, S>, Error>,
    late: impl FnOnce(S) -> String,
) -> Result<T, Error> {
    let mut ended = ended.subscribe();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        ended.borrow_and_update();
        let seen = match look().await? {
            Look::Done(done) => return Ok(done),
            Look::NotYet(seen) => seen,
        };
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(Error::new(ErrorKind::Timeout, "timeout", late(seen)));
        }
        tokio::select! {
            _ = ended.changed() => {}
            _ = tokio::time::sleep_until(deadline.min(now + RECHECK)) => {}
        }
    }
}
