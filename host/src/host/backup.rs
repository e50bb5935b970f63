//! Backups of a running host's SQLite database (`GET /v1/backup`,
//! `streamhost backup`): a consistent copy while writes go on, checked
//! before it is kept.

use std::path::Path;

use crate::error::Error;
use crate::storage::{backup_failed_full, BackupSummary, BackupUnavailable};

use super::Host;

/// How long a client is asked to wait before trying a backup again after
/// the disk was full.
const FULL_RETRY_AFTER_S: u32 = 5;

/// Where `GET /v1/backup` writes its copy before it answers with it (under
/// the data dir: the database's file system).
pub(crate) fn scratch_dir(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("backups")
}

/// Removes what a backup for `GET /v1/backup` left when the server stopped
/// while it was written or sent (a partial copy, or a whole one never
/// unlinked): nothing else writes there, and no backup is under way while
/// the host opens. Answers how many files went.
pub(super) fn clear_scratch(data_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(scratch_dir(data_dir)) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if (name.starts_with("backup-") || name.starts_with(".backup-"))
            && std::fs::remove_file(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(
            removed,
            dir = %scratch_dir(data_dir).display(),
            "removed the files of backups a stop interrupted"
        );
    }
    removed
}

impl Host {
    /// Writes a consistent copy of this host's database to `to` (which must
    /// not exist) while appends and everything else go on, checks it
    /// (SQLite's `quick_check`, a schema version this build knows) and
    /// answers what it holds. A failed backup leaves nothing at `to`. On
    /// PostgreSQL it answers `409 backup-unavailable`: PostgreSQL's own
    /// tools back that log up.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> anyhow::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// # let host = streamhost::Host::open(streamhost::Config { data_dir: dir.path().join("data"), ..Default::default() })?;
    /// use streamhost::EventInput;
    ///
    /// let orders = host.stream("acme", "/orders/eu")?;
    /// host.append(&orders, [EventInput::new("events.example/order-placed")]).await?;
    /// let copy = dir.path().join("backup.db");
    /// let summary = host.backup_into(&copy).await?;
    /// assert_eq!(summary.events, 2); // stream-created and the order
    /// assert!(host.backup_into(&copy).await.is_err(), "never overwritten");
    /// # Ok(()) }
    /// ```
    pub async fn backup_into(&self, to: impl AsRef<Path>) -> Result<BackupSummary, Error> {
        let storage = self.streams.storage().clone();
        let to = to.as_ref().to_path_buf();
        let result = tokio::task::spawn_blocking(move || storage.backup_into(&to))
            .await
            .map_err(|e| Error::internal(format!("the backup's task failed: {e}")))?;
        result.map_err(|e| {
            if e.downcast_ref::<BackupUnavailable>().is_some() {
                Error::conflict("backup-unavailable", e.to_string())
            } else if backup_failed_full(&e) {
                Error::unavailable(
                    "storage-full",
                    format!("the backup failed for want of room: {e:#}; nothing was kept"),
                    FULL_RETRY_AFTER_S,
                )
            } else {
                Error::internal(format!("the backup failed: {e:#}; nothing was kept"))
            }
        })
    }
}
