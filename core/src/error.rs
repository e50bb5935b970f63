//! Domain errors: what kind of failure, a kebab-case code and one human
//! sentence that names the offending value. Every layer below the HTTP edge
//! returns these; `http/error.rs` maps each kind to an HTTP status and
//! renders `{"error": {"code", "message"}}`.

use std::fmt;

/// What kind of failure an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The request is malformed or names a bad value.
    Invalid,
    /// No valid credentials.
    Unauthorized,
    /// The caller may not do this.
    Forbidden,
    /// The thing named does not exist.
    NotFound,
    /// The request conflicts with the current state (a fence, a stale write).
    Conflict,
    /// Over a size bound.
    TooLarge,
    /// Well-formed, but it could not be carried out (a transform or a guest failed).
    Unprocessable,
    /// Waited for something that did not come.
    Timeout,
    /// Temporarily refused (paused, at capacity): retry later.
    Unavailable,
    /// The caller holds as many of something as it may (live connections):
    /// retry once one is released.
    TooMany,
    /// A failure of the host itself (storage, a lost task).
    Internal,
    /// The thing named existed and is gone for good (a Durable Streams
    /// stream deleted while its forks still read it).
    Gone,
    /// A storage bound is reached (a project's `max-project-bytes`):
    /// nothing frees room by waiting.
    InsufficientStorage,
}

/// An error that reaches a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// What kind of failure (it maps to an HTTP status).
    pub kind: ErrorKind,
    /// The kebab-case code (`offset-conflict`).
    pub code: &'static str,
    /// One sentence naming the offending value.
    pub message: String,
    /// Seconds to wait before retrying an [`ErrorKind::Unavailable`].
    pub retry_after_s: Option<u32>,
    /// The URL of the host that owns the stream, for
    /// `stream-owned-elsewhere` (several hosts): the request goes there.
    pub owner_url: Option<String>,
    /// Whether the same request may succeed later (`reactor-unavailable`:
    /// `Some(true)`; `reactor-failed`: `Some(false)`); `None` where the code
    /// alone says.
    pub retryable: Option<bool>,
    /// The reactor that refused the request (`reactor-failed`,
    /// `reactor-unavailable`).
    pub reactor: Option<String>,
}

impl Error {
    /// An error of `kind` with `code` and `message`.
    pub fn new(kind: ErrorKind, code: &'static str, message: impl Into<String>) -> Self {
        Error {
            kind,
            code,
            message: message.into(),
            retry_after_s: None,
            owner_url: None,
            retryable: None,
            reactor: None,
        }
    }

    /// `invalid-request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, "invalid-request", message)
    }

    /// An invalid value with its own code (`invalid-expression`, ...).
    pub fn invalid_with(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, code, message)
    }

    /// `unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthorized, "unauthorized", message)
    }

    /// `forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, "forbidden", message)
    }

    /// `platform-authored`: a type only the platform may append.
    pub fn platform_authored(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, "platform-authored", message)
    }

    /// Not found, with the given code (`stream-not-found`, `not-found`, ...).
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, code, message)
    }

    /// `stream-not-found`, for a stream whose stored row is missing.
    pub fn stream_not_found(path: &str) -> Self {
        Self::not_found(
            "stream-not-found",
            format!("stream {path:?} does not exist"),
        )
    }

    /// A conflict with the given code.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, code, message)
    }

    /// Gone for good, with the given code (`offset-gone`, ...): `410`.
    pub fn gone(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Gone, code, message)
    }

    /// `too-large`.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::TooLarge, "too-large", message)
    }

    /// Could not be carried out, with the given code (`transform-failed`, ...).
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unprocessable, code, message)
    }

    /// Temporarily refused; retry after `retry_after_s`.
    pub fn unavailable(code: &'static str, message: impl Into<String>, retry_after_s: u32) -> Self {
        Error {
            retry_after_s: Some(retry_after_s),
            ..Self::new(ErrorKind::Unavailable, code, message)
        }
    }

    /// `stream-owned-elsewhere`: another host owns the stream (several
    /// hosts); the HTTP layer forwards the request to `url`.
    /// `url` empty: this host owned it and is stopping (the stream moves
    /// to another host).
    pub fn owned_elsewhere(path: &str, url: &str) -> Self {
        let message = if url.is_empty() {
            format!("stream {path:?} is moving to another host (this one is stopping); retry")
        } else {
            format!("stream {path:?} is owned by the host at {url}")
        };
        Error {
            owner_url: Some(url.to_string()),
            ..Self::unavailable("stream-owned-elsewhere", message, 1)
        }
    }

    /// `lease-lost`: this host could not renew its lease on the stream in
    /// time (several hosts), so it serves nothing of it until it (or
    /// another host) holds the lease again.
    pub fn lease_lost(path: &str) -> Self {
        Self::unavailable("lease-lost", lease_lost_message(path), 1)
    }

    /// `internal`: a failure of the host itself (storage, a lost task).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, "internal", message)
    }
}

/// What `lease-lost` says of the stream at `path`.
pub fn lease_lost_message(path: &str) -> String {
    format!(
        "this host could not renew its lease on stream {path:?} in time; retry (the stream is \
         served again once a host holds its lease)"
    )
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}
