//! Backups of a running server's SQLite database: a consistent copy taken
//! with `VACUUM INTO` in one read transaction of a connection of its own
//! (the writer goes on meanwhile: the log is in WAL mode), written beside
//! its target under a name of its own, checked, synced and only then
//! renamed into place, so a failed backup leaves no file that looks
//! complete. [`check_backup`] is what a backup passes before it is kept or
//! restored.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use rusqlite::{Connection, OpenFlags};

use crate::schema::SCHEMA_VERSION;

/// What a backup holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupSummary {
    /// Its size in bytes.
    pub bytes: u64,
    /// The schema version of the database it copies.
    pub schema_version: u32,
    /// Streams in it.
    pub streams: u64,
    /// Events in it, every stream's.
    pub events: u64,
}

/// The log is in PostgreSQL: there is no database file to copy (its own
/// tools back it up: `pg_dump`, or continuous archiving for point-in-time
/// recovery).
#[derive(Debug)]
pub struct BackupUnavailable;

impl std::fmt::Display for BackupUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "this server keeps its log in PostgreSQL: back it up with PostgreSQL's tools \
             (pg_dump, or continuous archiving for point-in-time recovery), not streamhost backup",
        )
    }
}

impl std::error::Error for BackupUnavailable {}

/// Whether a backup failed for want of room (SQLite's `SQLITE_FULL`, or a
/// write refused with `ENOSPC`/`EFBIG`).
pub fn backup_failed_full(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        if let Some(rusqlite::Error::SqliteFailure(f, _)) = c.downcast_ref::<rusqlite::Error>() {
            return f.code == rusqlite::ErrorCode::DiskFull;
        }
        c.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .is_some_and(|code| code == libc::ENOSPC || code == libc::EFBIG)
    })
}

/// Writes a consistent copy of the database at `db_path` to `to`, which
/// must not exist; answers what it holds. Nothing is left at `to` (or
/// beside it) unless the whole copy was written, checked and synced.
pub(crate) fn vacuum_into(db_path: &Path, to: &Path) -> Result<BackupSummary> {
    if to.exists() {
        bail!(
            "{} exists already: a backup never overwrites a file",
            to.display()
        );
    }
    let partial = partial_path(to)?;
    let result = (|| {
        let conn = Connection::open_with_flags(
            db_path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .with_context(|| format!("opening {} to back it up", db_path.display()))?;
        conn.busy_timeout(Duration::from_secs(10))?;
        let target = partial
            .to_str()
            .ok_or_else(|| anyhow!("{} is not a UTF-8 path", partial.display()))?;
        conn.execute("VACUUM INTO ?1", [target])
            .with_context(|| format!("writing the backup to {}", partial.display()))?;
        drop(conn);
        std::fs::File::open(&partial)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", partial.display()))?;
        let summary = check_backup(&partial)?;
        std::fs::rename(&partial, to)
            .with_context(|| format!("renaming {} to {}", partial.display(), to.display()))?;
        sync_dir_of(to)?;
        Ok(summary)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// Where a file meant for `to` is written until it is complete: beside it
/// (the same file system, so the rename is atomic), under a name no other
/// writer uses.
pub fn partial_path(to: &Path) -> Result<PathBuf> {
    let name = to
        .file_name()
        .ok_or_else(|| anyhow!("{} names no file", to.display()))?
        .to_string_lossy();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    Ok(to.with_file_name(format!(".{name}.partial-{}-{nanos}", std::process::id())))
}

/// Removes what killed writers of `to` left beside it: the partial files
/// [`partial_path`] names for `to` whose process is gone (on Linux, no
/// `/proc/PID`; elsewhere nothing is removed). A partial of a process
/// still running (another backup to the same name) stays. Answers the
/// files removed.
pub fn remove_dead_partials(to: &Path) -> Vec<PathBuf> {
    let (Some(name), true) = (to.file_name(), Path::new("/proc/self").exists()) else {
        return Vec::new();
    };
    let prefix = format!(".{}.partial-", name.to_string_lossy());
    let dir = match to.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = file
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, nanos)| nanos.parse::<u32>().ok().and(pid.parse::<u32>().ok()))
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if std::fs::remove_file(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}

/// Syncs the directory holding `path`, so that a rename into it survives a
/// crash.
pub fn sync_dir_of(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

/// Checks that `path` is a whole streamhost database this build can open:
/// SQLite's `quick_check` passes, its schema version is known; answers what
/// it holds.
pub fn check_backup(path: &Path) -> Result<BackupSummary> {
    let bytes = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    let not_ours = |why: String| anyhow!("{} is not a streamhost backup: {why}", path.display());
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| not_ours(e.to_string()))?;
    let quick: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| not_ours(e.to_string()))?;
    if quick != "ok" {
        bail!(
            "{} is damaged (SQLite's quick_check: {quick})",
            path.display()
        );
    }
    let version: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| not_ours(e.to_string()))?;
    if version == 0 {
        return Err(not_ours(
            "a SQLite database without streamhost's schema".into(),
        ));
    }
    if version > SCHEMA_VERSION {
        bail!(
            "{} has schema version {version}, newer than this build's {SCHEMA_VERSION}: restore \
             it with a newer streamhost",
            path.display()
        );
    }
    let count = |table: &str| -> Result<u64> {
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| {
            r.get::<_, i64>(0)
        })
        .map(|n| n as u64)
        .map_err(|e| not_ours(e.to_string()))
    };
    Ok(BackupSummary {
        bytes,
        schema_version: version,
        streams: count("streams")?,
        events: count("events")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_streamhost_database_is_named_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not a database at all, but long enough to be read").unwrap();
        let e = check_backup(&text).unwrap_err().to_string();
        assert!(e.contains("notes.txt is not a streamhost backup"), "{e}");
        let plain = dir.path().join("plain.db");
        Connection::open(&plain)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        let e = check_backup(&plain).unwrap_err().to_string();
        assert!(e.contains("without streamhost's schema"), "{e}");
        let missing = dir.path().join("missing.db");
        let e = format!("{:#}", check_backup(&missing).unwrap_err());
        assert!(e.contains("missing.db"), "{e}");
    }

    #[test]
    fn a_backup_never_overwrites_and_leaves_nothing_when_it_fails() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("streamhost.db");
        let conn = Connection::open(&db).unwrap();
        crate::schema::migrate(&conn).unwrap();
        drop(conn);
        let to = dir.path().join("backup.db");
        let summary = vacuum_into(&db, &to).unwrap();
        assert_eq!(summary.schema_version, SCHEMA_VERSION);
        assert_eq!((summary.streams, summary.events), (0, 0));
        assert_eq!(check_backup(&to).unwrap(), summary);
        let e = vacuum_into(&db, &to).unwrap_err().to_string();
        assert!(e.contains("exists already"), "{e}");
        // A target in a directory that does not exist: an error naming it,
        // and nothing left behind.
        let nowhere = dir.path().join("no-such-dir").join("b.db");
        let e = format!("{:#}", vacuum_into(&db, &nowhere).unwrap_err());
        assert!(e.contains("no-such-dir"), "{e}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.contains("partial"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
