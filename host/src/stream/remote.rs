//! Several hosts: the host's own work on a stream another host owns (a copy
//! batch for a receiving stream, an effect's append) goes to that host over
//! HTTP, to `POST /internal/v1/call` (not part of the public API: it
//! carries the database's cluster secret instead of a token, and is served
//! without forwarding it again).
//!
//! What the owner answers comes back as the local call would have: the
//! result, or the error with its kind and code.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{AppendInput, Authority, Namespace, StreamAddress};
use crate::delivery::copy::CopyBatch;
use crate::error::{Error, ErrorKind};

/// The path of the host-to-host endpoint.
pub const PATH: &str = "/internal/v1/call";
/// The header carrying the cluster secret.
pub const SECRET_HEADER: &str = "streamhost-cluster-secret";

/// One call on a stream, as sent to its owner.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteCall {
    /// The project; `None` for the global namespace.
    pub project: Option<String>,
    pub path: String,
    pub call: Call,
}

/// What to do on the stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Call {
    Append {
        input: AppendInput,
        authority: Authority,
    },
    Deliver {
        batch: CopyBatch,
    },
    /// Refold the instance of `component` on this stream with version
    /// `digest` (the host that took the deploy asks the stream's owner);
    /// answers the offset it switched at.
    Refold {
        component: String,
        digest: String,
        timeout_ms: u64,
    },
    /// Retry failing subscriptions at once (`Streams::retry`).
    Retry {
        key: Option<String>,
        component: Option<String>,
    },
}

impl RemoteCall {
    /// The call's stream; a bad project or path is an error naming it.
    pub fn address(&self) -> Result<StreamAddress, Error> {
        let namespace = match &self.project {
            Some(p) => Namespace::project(p)?,
            None => Namespace::Global,
        };
        StreamAddress::new(namespace, &self.path)
    }
}

/// Sends `call` on `address` to the owner at `url`; answers as the owner's
/// local call did.
/// `wait`: how long the owner may take (a hung owner's lease expires, and
/// the caller's retry finds the next one).
pub async fn send<T: serde::de::DeserializeOwned>(
    client: &reqwest::Client,
    secret: &str,
    wait: std::time::Duration,
    url: &str,
    address: &StreamAddress,
    call: Call,
) -> Result<T, Error> {
    let body = RemoteCall {
        project: address.namespace.project_id().map(str::to_string),
        path: address.path.clone(),
        call,
    };
    let unavailable = |why: String| {
        Error::unavailable(
            "stream-owned-elsewhere",
            format!("the owner of stream {address} at {url} {why}"),
            1,
        )
    };
    let answer = client
        .post(format!("{}{PATH}", url.trim_end_matches('/')))
        .timeout(wait)
        .header(SECRET_HEADER, secret)
        .json(&body)
        .send()
        .await
        .map_err(|e| unavailable(format!("did not answer: {e}")))?;
    let status = answer.status().as_u16();
    let value: Value = answer
        .json()
        .await
        .map_err(|e| unavailable(format!("answered unreadably: {e}")))?;
    if status == 200 {
        return serde_json::from_value(value)
            .map_err(|e| unavailable(format!("answered unreadably: {e}")));
    }
    let code = value["error"]["code"].as_str().unwrap_or("internal");
    let message = value["error"]["message"]
        .as_str()
        .unwrap_or("no message")
        .to_string();
    let mut e = Error::new(kind_of(status), static_code(code), message);
    if kind_of(status) == ErrorKind::Unavailable {
        e.retry_after_s = Some(1);
    }
    Err(e)
}

/// The kind of an HTTP status (the inverse of the HTTP layer's mapping).
fn kind_of(status: u16) -> ErrorKind {
    match status {
        400 => ErrorKind::Invalid,
        401 => ErrorKind::Unauthorized,
        403 => ErrorKind::Forbidden,
        404 => ErrorKind::NotFound,
        408 => ErrorKind::Timeout,
        409 => ErrorKind::Conflict,
        413 => ErrorKind::TooLarge,
        422 => ErrorKind::Unprocessable,
        503 => ErrorKind::Unavailable,
        429 => ErrorKind::TooMany,
        _ => ErrorKind::Internal,
    }
}

/// The codes an append or a copy can answer (an unknown one reads as
/// `internal`, its message kept).
fn static_code(code: &str) -> &'static str {
    const CODES: &[&str] = &[
        "invalid-request",
        "invalid-jsonata",
        "platform-authored",
        "forbidden",
        "stream-not-found",
        "timeout",
        "idempotency-conflict",
        "offset-conflict",
        "stream-id-changed",
        "stale-delivery",
        "too-large",
        "transform-failed",
        "jsonata-limit-exceeded",
        "stream-paused",
        "capacity-exhausted",
        "overloaded",
        "stream-owned-elsewhere",
        "lease-lost",
        "too-many-connections",
        "ephemeral-capacity-exhausted",
    ];
    CODES
        .iter()
        .find(|c| **c == code)
        .copied()
        .unwrap_or("internal")
}

/// Serializes a local result for the wire.
pub fn to_value<T: Serialize>(v: Result<T, Error>) -> Result<Value, Error> {
    v.and_then(|v| {
        serde_json::to_value(v)
            .map_err(|e| Error::internal(format!("serializing the answer failed: {e}")))
    })
}

/// Whether `given` is the cluster secret (in time that does not depend on
/// where they differ).
pub fn secret_matches(given: &[u8], secret: &str) -> bool {
    let secret = secret.as_bytes();
    given.len() == secret.len()
        && given
            .iter()
            .zip(secret)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}
