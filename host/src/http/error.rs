//! HTTP errors: a domain [`Error`] mapped to its HTTP status (the one place
//! that knows the statuses), or an error of the HTTP layer itself; rendered
//! as `{"error": {"code", "message"}}` (and a `hint` where one helps), with
//! `retry-after` on `503`.

use std::fmt;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::{Error, ErrorKind};

/// An error that reaches a caller. `status` is the HTTP status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// Seconds for the `retry-after` header of `503` answers.
    pub retry_after_s: Option<u32>,
    /// The owning host's URL of a `stream-owned-elsewhere` answer (the
    /// forwarding layer takes it from the `streamhost-owner` header).
    pub owner_url: Option<String>,
    /// `"retryable"` in the body, when the error says.
    pub retryable: Option<bool>,
    /// `"reactor"` in the body: the reactor that refused.
    pub reactor: Option<String>,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_s: None,
            owner_url: None,
            retryable: None,
            reactor: None,
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

    /// `404` with the given code (`stream-not-found`, `not-found`, ...).
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(404, code, message)
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

/// The HTTP status of each kind of domain error.
pub fn status_of(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::Invalid => 400,
        ErrorKind::Unauthorized => 401,
        ErrorKind::Forbidden => 403,
        ErrorKind::NotFound => 404,
        ErrorKind::Timeout => 408,
        ErrorKind::Conflict => 409,
        ErrorKind::Gone => 410,
        ErrorKind::TooLarge => 413,
        ErrorKind::Unprocessable => 422,
        ErrorKind::Internal => 500,
        ErrorKind::Unavailable => 503,
        ErrorKind::TooMany => 429,
        ErrorKind::InsufficientStorage => 507,
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError {
            status: status_of(e.kind),
            code: e.code,
            message: e.message,
            retry_after_s: e.retry_after_s,
            owner_url: e.owner_url,
            retryable: e.retryable,
            reactor: e.reactor,
        }
    }
}

/// What to do about an error, for the codes where the message alone does
/// not say (served as `error.hint`).
pub fn hint_of(code: &str) -> Option<&'static str> {
    match code {
        "stream-paused" => Some(
            "a paused stream accepts only events.iterate.com/stream/ control events: \
             append events.iterate.com/stream/resumed to resume it (streamhost resume PATH)",
        ),
        _ => None,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut body = json!({"error": {"code": self.code, "message": self.message}});
        if let Some(hint) = hint_of(self.code) {
            body["error"]["hint"] = json!(hint);
        }
        if let Some(retryable) = self.retryable {
            body["error"]["retryable"] = json!(retryable);
        }
        if let Some(reactor) = &self.reactor {
            body["error"]["reactor"] = json!(reactor);
        }
        let mut response = (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if let Some(s) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if let Some(url) = self.owner_url.and_then(|u| HeaderValue::from_str(&u).ok()) {
            response.headers_mut().insert(super::forward::OWNER, url);
        }
        response
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

impl std::error::Error for ApiError {}
