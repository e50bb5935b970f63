//! `POST {stream}:backfillProcessor` over HTTP: parse, run the host's
//! backfill ([`crate::host::backfill`]), render. With `accept:
//! application/x-ndjson` the answer streams a `{"progress": ...}` line after
//! the first batch and then at most every half second and ends with
//! `{"result": ...}` (or `{"error": ...}`).

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::host::backfill::Backfill;
use crate::host::Host;
use crate::stream::StreamAddress;

/// The backfill as a stream of JSON lines: progress, then the result.
pub fn streamed(host: Host, address: StreamAddress, backfill: Backfill) -> Response {
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    let progress = tx.clone();
    tokio::spawn(async move {
        let report = move |p| {
            let _ = progress.send(json!({ "progress": p }));
        };
        let line = match host
            .backfill_with_progress(&address, backfill, report)
            .await
        {
            Ok(result) => json!({ "result": result }),
            Err(e) => json!({"error": {"code": e.code, "message": e.message}}),
        };
        let _ = tx.send(line);
    });
    let lines = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|v| (Ok::<_, std::convert::Infallible>(format!("{v}\n")), rx))
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}
