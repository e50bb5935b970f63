//! `GET /v1/backup` (admin): a consistent copy of this host's SQLite
//! database, taken while writes go on and streamed as the answer
//! (`application/vnd.sqlite3`). `streamhost backup --to FILE` downloads it,
//! checks it and keeps it only when whole.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tokio::io::AsyncReadExt;

use super::authenticate;
use super::error::ApiError;
use crate::host::Host;

/// The media type of a SQLite database file.
pub const SQLITE: &str = "application/vnd.sqlite3";

/// Bytes read from the copy at a time.
const CHUNK: usize = 256 * 1024;

/// `GET /v1/backup`.
pub async fn backup(State(host): State<Arc<Host>>, headers: HeaderMap) -> Response {
    match take(&host, &headers).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn take(host: &Host, headers: &HeaderMap) -> Result<Response, ApiError> {
    authenticate(host, headers)?.require_admin("GET /v1/backup")?;
    // Written in the data dir (the database's file system, where its size
    // surely fits less often than not in a temporary one), read back as
    // the answer: the file is unlinked once open, so it goes with the
    // answer whatever happens to the connection.
    let dir = crate::host::backup::scratch_dir(&host.config().data_dir);
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| crate::error::Error::internal(format!("creating {}: {e}", dir.display())))?;
    let path = dir.join(format!("backup-{}.db", uuid::Uuid::new_v4()));
    let summary = host.backup_into(&path).await?;
    let file = tokio::fs::File::open(&path).await;
    let _ = std::fs::remove_file(&path);
    let file = file.map_err(|e| {
        crate::error::Error::internal(format!("reading the backup {}: {e}", path.display()))
    })?;
    let body = futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buf = vec![0u8; CHUNK];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = StatusCode::OK;
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(SQLITE));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(summary.bytes));
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"streamhost-backup.db\""),
    );
    if let Ok(v) = HeaderValue::from_str(&serde_json::to_string(&summary).unwrap_or_default()) {
        h.insert("streamhost-backup", v);
    }
    Ok(response)
}
