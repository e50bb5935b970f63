//! Backup and restore: `streamhost backup --to FILE` downloads a consistent
//! copy of a running server's database (`GET /v1/backup`) and keeps it only
//! once whole and checked; `streamhost restore --from FILE --data-dir DIR`
//! makes it the database of a new data dir, which `streamhost serve` then
//! starts from.

use super::*;

#[derive(Debug, Args)]
pub(crate) struct BackupArgs {
    #[command(flatten)]
    pub server: AdminArgs,
    /// The file to write (it must not exist: a backup never overwrites).
    #[arg(long)]
    pub to: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct RestoreArgs {
    /// A backup written by `streamhost backup`.
    #[arg(long)]
    pub from: PathBuf,
    /// The data dir to restore into (created if missing; it must hold no
    /// database yet).
    #[arg(long)]
    pub data_dir: PathBuf,
}

/// `streamhost backup`.
pub(super) async fn backup(a: BackupArgs) -> Result<()> {
    let to = a.to;
    // What an earlier backup to this name left when it was killed.
    for gone in crate::storage::remove_dead_partials(&to) {
        eprintln!(
            "removed {}, left by a backup that was stopped",
            gone.display()
        );
    }
    if to.exists() {
        bail!(
            "{} exists already: a backup never overwrites a file",
            to.display()
        );
    }
    let url = format!("{}/v1/backup", a.server.url.trim_end_matches('/'));
    let response = send(
        reqwest::Client::new().get(&url),
        &url,
        a.server.token.as_deref(),
    )
    .await?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.context("reading the answer")?;
        return Err(api_error(status, &text));
    }
    let partial = crate::storage::partial_path(&to)?;
    let kept = download(response, &partial, &to).await;
    if kept.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    let summary = kept?;
    let mut out = serde_json::to_value(&summary)?;
    out["file"] = json!(to.display().to_string());
    print_line(&serde_json::to_string_pretty(&out)?)
}

/// Writes the answer's body to `partial`, checks it whole (every byte the
/// server announced, a database this build can open), then renames it to
/// `to`.
async fn download(
    mut response: reqwest::Response,
    partial: &std::path::Path,
    to: &std::path::Path,
) -> Result<crate::storage::BackupSummary> {
    use std::io::Write;
    let announced = response.content_length();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let mut written = 0u64;
    while let Some(chunk) = response
        .chunk()
        .await
        .context("receiving the backup from the server")?
    {
        file.write_all(&chunk)
            .with_context(|| format!("writing {}", partial.display()))?;
        written += chunk.len() as u64;
    }
    if let Some(n) = announced.filter(|n| *n != written) {
        bail!("the server's answer ended after {written} of {n} bytes: nothing was kept");
    }
    file.sync_all()
        .with_context(|| format!("syncing {}", partial.display()))?;
    drop(file);
    let summary = crate::storage::check_backup(partial)?;
    std::fs::rename(partial, to)
        .with_context(|| format!("renaming {} to {}", partial.display(), to.display()))?;
    crate::storage::sync_dir_of(to)?;
    Ok(summary)
}

/// `streamhost restore`.
pub(super) fn restore(a: RestoreArgs) -> Result<()> {
    let summary = crate::storage::check_backup(&a.from)?;
    let db = a.data_dir.join("streamhost.db");
    for existing in [db.clone(), a.data_dir.join("streamhost.db-wal")] {
        if existing.exists() {
            bail!(
                "{} already holds a database ({}): restore into a new data dir (a restore never \
                 overwrites)",
                a.data_dir.display(),
                existing.display()
            );
        }
    }
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("creating {}", a.data_dir.display()))?;
    let partial = crate::storage::partial_path(&db)?;
    let copied = (|| -> Result<()> {
        std::fs::copy(&a.from, &partial)
            .with_context(|| format!("copying {} to {}", a.from.display(), partial.display()))?;
        std::fs::File::open(&partial)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", partial.display()))?;
        std::fs::rename(&partial, &db)
            .with_context(|| format!("renaming {} to {}", partial.display(), db.display()))?;
        crate::storage::sync_dir_of(&db)
    })();
    if copied.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    copied?;
    let mut out = serde_json::to_value(&summary)?;
    out["dataDir"] = json!(a.data_dir.display().to_string());
    print_line(&serde_json::to_string_pretty(&out)?)
}
