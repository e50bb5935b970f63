//! API errors: an HTTP status, a kebab-case code and one human sentence that
//! names the offending value. Every layer returns these; `http` renders them as
//! `{"error": {"code", "message"}}`.

use std::fmt;

/// An error that reaches a caller. `status` is the HTTP status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// Seconds for the `retry-after` header of `503` answers.
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// `400 invalid-request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(400, "invalid-request", message)
    }

    /// `401 unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, "unauthorized", message)
    }

    /// `403 forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "forbidden", message)
    }

    /// `403 platform-authored`.
    pub fn platform_authored(message: impl Into<String>) -> Self {
        Self::new(403, "platform-authored", message)
    }

    /// `404` with the given code (`stream-not-found`, `not-found`, ...).
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(404, code, message)
    }

    /// `409` with the given conflict code.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(409, code, message)
    }

    /// `413 too-large`.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(413, "too-large", message)
    }

    /// `503` with a `retry-after` header.
    pub fn unavailable(code: &'static str, message: impl Into<String>, retry_after_s: u32) -> Self {
        ApiError {
            retry_after_s: Some(retry_after_s),
            ..Self::new(503, code, message)
        }
    }

    /// `500 internal` for failures of the host itself (storage, a lost task).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "internal", message)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

impl std::error::Error for ApiError {}
