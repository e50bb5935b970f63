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

use crate::delivery::copy::CopyBatch;
use crate::error::{Error, ErrorKind};
use crate::stream::{AppendInput, Authority, Namespace, StreamAddress};

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
    /// An append to the stream, made with `authority` (an append the host
    /// makes for an effect or a copy is not a public caller's).
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
    /// A request of the host's API on the stream (a `StreamRequest` as
    /// JSON), which the owner's host carries out (`Host::apply`): the
    /// registry carries it and does not look inside.
    Request {
        request: Value,
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
    if !answer.status().is_success() {
        return Err(unavailable(format!("answered {}", answer.status())));
    }
    let answer: Answer = answer
        .json()
        .await
        .map_err(|e| unavailable(format!("answered unreadably: {e}")))?;
    match answer {
        Answer::Ok(value) => serde_json::from_value(value)
            .map_err(|e| unavailable(format!("answered unreadably: {e}"))),
        Answer::Error(e) => Err(e.into_error()),
    }
}

/// What the owner answers: the call's result, or its error with the kind
/// and code it had there.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Answer {
    /// The result.
    Ok(Value),
    /// The error.
    Error(WireError),
}

impl From<Result<Value, Error>> for Answer {
    fn from(r: Result<Value, Error>) -> Self {
        match r {
            Ok(v) => Answer::Ok(v),
            Err(e) => Answer::Error(WireError {
                kind: e.kind,
                code: e.code.to_string(),
                message: e.message,
                retry_after_s: e.retry_after_s,
                retryable: e.retryable,
                reactor: e.reactor,
            }),
        }
    }
}

/// An [`Error`] on the wire.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireError {
    kind: ErrorKind,
    code: String,
    message: String,
    retry_after_s: Option<u32>,
    #[serde(default)]
    retryable: Option<bool>,
    #[serde(default)]
    reactor: Option<String>,
}

impl WireError {
    /// The error as the owner raised it.
    fn into_error(self) -> Error {
        let w = self;
        let mut e = Error::new(w.kind, intern(&w.code), w.message);
        e.retry_after_s = w.retry_after_s;
        e.retryable = w.retryable;
        e.reactor = w.reactor;
        e
    }
}

/// The `&'static str` of an error code heard from another host: each
/// distinct code is kept once (the codes are a fixed set; the peer holds
/// the cluster secret).
fn intern(code: &str) -> &'static str {
    static CODES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut codes = CODES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(known) = codes.iter().find(|c| **c == code) {
        return known;
    }
    let code: &'static str = Box::leak(code.to_string().into_boxed_str());
    codes.push(code);
    code
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_crosses_the_wire_with_its_kind_code_and_retry() {
        for e in [
            Error::conflict("offset-conflict", "offset 7 is taken"),
            Error::unavailable("stream-paused", "stream \"/a\" is paused", 1),
            Error::new(ErrorKind::TooMany, "too-many-connections", "at the bound"),
            Error::unprocessable("a-code-added-later", "kept as it was"),
        ] {
            let wire = serde_json::to_string(&Answer::from(Err(e.clone()))).unwrap();
            let Answer::Error(back) = serde_json::from_str(&wire).unwrap() else {
                panic!("{wire}")
            };
            assert_eq!(back.into_error(), e, "{wire}");
        }
        let wire = serde_json::to_string(&Answer::from(Ok(serde_json::json!({"n": 1})))).unwrap();
        assert_eq!(wire, r#"{"ok":{"n":1}}"#);
    }
}
