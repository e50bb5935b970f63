//! The one failure policy for broken invariants: a panic inside the host is
//! a bug (an `assert!` naming its invariant, or an unexpected state), and
//! the process stops with a message naming it, before it writes anything the
//! bug made. Restart is the recovery: every acknowledged write is durable,
//! and the kill -9 tests prove that a restarted host carries on from the log.
//!
//! The exception is third-party code run on outside input that may panic on
//! a hostile input (the JSONata parser and evaluator): such a call runs
//! [`contained`], which catches the panic and answers it as that input's
//! error; nothing of the host's state is shared with it.
//!
//! The `streamhost` binary installs the policy ([`stop_on_broken_invariant`])
//! before it starts; an embedding program may install it too.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    /// How many [`contained`] calls this thread is inside.
    static CONTAINED: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f`, third-party code on outside input, and answers its panic as
/// `Err` (with the panic's message) instead of treating it as a broken
/// invariant of the host.
pub fn contained<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    CONTAINED.with(|c| c.set(c.get() + 1));
    let result = catch_unwind(AssertUnwindSafe(f));
    CONTAINED.with(|c| c.set(c.get() - 1));
    result.map_err(|payload| panic_message(payload.as_ref()))
}

/// Whether this thread is inside a [`contained`] call.
pub fn is_contained() -> bool {
    CONTAINED.with(|c| c.get() > 0)
}

/// A panic payload's message.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The line the process prints when it stops: the invariant (the panic's
/// message, which for the host's assertions begins `invariant <name>`) and
/// where it broke.
pub fn stop_message(message: &str, location: Option<&std::panic::Location<'_>>) -> String {
    let at = location
        .map(|l| format!(" at {}:{}", l.file(), l.line()))
        .unwrap_or_default();
    format!(
        "broken invariant: {message}{at}; the process stops (restart recovers: every acknowledged write is durable)"
    )
}

/// Installs the failure policy for broken invariants: a panic inside the
/// host (outside the third-party parsers it runs on outside input, whose
/// panics are that input's errors) prints `broken invariant: <message> at
/// <file:line>; the process stops ...` and aborts the process. Restart is
/// the recovery: every acknowledged write is durable. The `streamhost`
/// binary installs it before it starts; an embedding program may too.
pub fn stop_on_broken_invariant() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if is_contained() {
            return;
        }
        previous(info);
        let message = panic_message(info.payload());
        let line = stop_message(&message, info.location());
        tracing::error!("{line}");
        eprintln!("streamhost: {line}");
        std::process::abort();
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contained_panic_is_an_error_with_its_message() {
        assert_eq!(contained(|| 7), Ok(7));
        let e = contained(|| -> u32 { panic!("S0201 the parser gave up") }).unwrap_err();
        assert_eq!(e, "S0201 the parser gave up");
        assert!(!is_contained(), "the count is back to zero after a panic");
        let nested = contained(|| {
            assert!(is_contained());
            contained(|| panic!("{}", String::from("inner"))).unwrap_err()
        });
        assert_eq!(nested, Ok("inner".to_string()));
    }

    #[test]
    fn the_stop_message_names_the_invariant_and_the_place() {
        let m = stop_message("invariant dense-offsets: offset 9 after 7", None);
        assert!(
            m.starts_with(
                "broken invariant: invariant dense-offsets: offset 9 after 7; the process stops"
            ),
            "{m}"
        );
        let here = std::panic::Location::caller();
        assert!(stop_message("x", Some(here)).contains("invariant.rs:"));
    }
}
