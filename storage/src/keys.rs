//! Processors' keyed state in storage: `processor_keys(bucket, key, value)`,
//! a bucket per processor instance named by its checkpoint row
//! (`processor_checkpoints.bucket`; ids are random, so a new bucket never
//! meets an old one's rows). Rows change only in a checkpoint's transaction
//! (`writer.rs`), so a bucket's rows are always those of its checkpoint.
//!
//! [`KeyCache`] is the host's bounded cache of committed values
//! (`[processors] keyed-cache-bytes`), filled by reads and written through
//! by commits (the writer, after the commit and before it answers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;

use super::sql::{self, args, Arg, Db};
use super::Storage;

/// Writes to a bucket: a value, or `None` for a delete.
pub type Writes = std::collections::BTreeMap<String, Option<Vec<u8>>>;

/// Bucket ids: random, so a new bucket (a new source lifetime, a refold's)
/// never meets rows of an old one.
pub fn new_bucket_id() -> i64 {
    let id = uuid::Uuid::new_v4().as_u64_pair().0 & (i64::MAX as u64);
    id.max(1) as i64
}

/// Values larger than this are read from storage each time.
const CACHED_VALUE_BYTES_MAX: usize = 64 * 1024;

/// What identifies the bucket's contents at a checkpoint: its lifetime, its
/// offset, the version that wrote it.
pub fn tag(id: &super::CheckpointId) -> String {
    format!("{}/{}/{}", id.stream_id, id.offset, id.digest)
}

/// The host's bounded cache of committed key values, shared by every
/// processor instance. A bucket's entries are valid for the checkpoint they
/// were read or written at; a wake that finds its instance at another
/// checkpoint (another host's commit, a refold's switch, a failed commit)
/// moves the bucket to a new generation, and the old entries age out.
pub struct KeyCache {
    values: quick_cache::sync::Cache<(i64, u64, String), CachedValue, Weigh>,
    tags: Mutex<std::collections::HashMap<i64, (String, u64)>>,
    generation: AtomicU64,
    capacity: u64,
}

/// A cached value (`None`: the key does not exist).
#[derive(Clone)]
pub struct CachedValue(Option<Arc<[u8]>>);

#[derive(Clone)]
struct Weigh;

impl quick_cache::Weighter<(i64, u64, String), CachedValue> for Weigh {
    fn weight(&self, key: &(i64, u64, String), value: &CachedValue) -> u64 {
        // The key, the value and the entry's bookkeeping.
        (key.2.len() + value.0.as_ref().map_or(0, |v| v.len()) + 64) as u64
    }
}

impl KeyCache {
    /// A cache of at most `bytes` (keys, values and bookkeeping).
    pub fn new(bytes: u64) -> KeyCache {
        KeyCache {
            values: quick_cache::sync::Cache::with_weighter(16 * 1024, bytes.max(1), Weigh),
            tags: Mutex::new(std::collections::HashMap::new()),
            generation: AtomicU64::new(1),
            capacity: bytes,
        }
    }

    /// Bytes held, and the bound.
    pub fn usage(&self) -> (u64, u64) {
        (self.values.weight(), self.capacity)
    }

    /// The generation of `bucket`'s entries at checkpoint `tag` (`""`: a
    /// new bucket): the one it had when last seen at `tag`, else a new one.
    pub fn generation(&self, bucket: i64, tag: &str) -> u64 {
        let mut tags = self.tags.lock().expect("key cache tags");
        match tags.get(&bucket) {
            Some((t, g)) if t == tag => *g,
            _ => {
                let g = self.generation.fetch_add(1, Ordering::Relaxed);
                tags.insert(bucket, (tag.to_string(), g));
                g
            }
        }
    }

    /// After a commit that moved `bucket` from checkpoint `from` to `to`
    /// with `writes`: the writes go into the cache when it was at `from`;
    /// otherwise it forgets the bucket.
    pub(super) fn committed(&self, bucket: i64, from: &str, to: &str, writes: &Writes) {
        let mut tags = self.tags.lock().expect("key cache tags");
        let g = match tags.get(&bucket) {
            Some((t, g)) if t == from => *g,
            _ => {
                tags.remove(&bucket);
                return;
            }
        };
        for (k, v) in writes {
            let entry = (bucket, g, k.clone());
            match v {
                Some(v) if v.len() > CACHED_VALUE_BYTES_MAX => {
                    self.values.remove(&entry);
                }
                _ => self
                    .values
                    .insert(entry, CachedValue(v.as_deref().map(Arc::from))),
            }
        }
        tags.insert(bucket, (to.to_string(), g));
    }

    /// Forgets `bucket`.
    pub(super) fn forget(&self, bucket: i64) {
        self.tags.lock().expect("key cache tags").remove(&bucket);
    }

    /// Forgets every bucket (a failed commit may or may not have landed).
    pub(super) fn clear(&self) {
        self.tags.lock().expect("key cache tags").clear();
    }

    fn get(&self, bucket: i64, g: u64, key: &str) -> Option<CachedValue> {
        self.values.get(&(bucket, g, key.to_string()))
    }

    fn fill(&self, bucket: i64, g: u64, key: &str, value: &Option<Vec<u8>>) {
        if value
            .as_ref()
            .is_none_or(|v| v.len() <= CACHED_VALUE_BYTES_MAX)
        {
            self.values.insert(
                (bucket, g, key.to_string()),
                CachedValue(value.as_deref().map(Arc::from)),
            );
        }
    }
}

/// A committed bucket, read through the cache (a wake's reads); misses
/// read in one read transaction, taken at the first and held while this
/// lives.
pub struct StoredBucket {
    storage: Storage,
    bucket: i64,
    generation: u64,
    reads: Mutex<Option<super::ReadTransaction>>,
    /// Reads go through the key cache (a snapshot's do not: its values
    /// may be older than the cache's generation of the bucket).
    cached: bool,
}

impl StoredBucket {
    fn read<T>(&self, f: impl FnOnce(Db<'_>) -> Result<T>) -> Result<T> {
        let mut held = self.reads.lock().expect("bucket reads");
        if held.is_none() {
            *held = Some(self.storage.read_transaction()?);
        }
        held.as_ref().expect("just set").with(f)
    }

    /// The committed value of `key`.
    pub fn value(&self, key: &str) -> Result<Option<Vec<u8>>> {
        if !self.cached {
            return self.read(|db| value_in(db, self.bucket, key));
        }
        let cache = &self.storage.inner.hot.keys;
        if let Some(CachedValue(v)) = cache.get(self.bucket, self.generation, key) {
            return Ok(v.map(|v| v.to_vec()));
        }
        let v = self.read(|db| value_in(db, self.bucket, key))?;
        cache.fill(self.bucket, self.generation, key, &v);
        Ok(v)
    }

    /// Up to `limit` committed keys after `after`, in byte order.
    pub fn keys(&self, after: Option<&str>, limit: usize) -> Result<Vec<String>> {
        self.read(|db| keys_after_in(db, self.bucket, after, limit))
    }

    /// [`Storage::keys_page`] of this bucket, read as this bucket reads.
    pub fn page(
        &self,
        prefix: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        self.read(|db| page_in(db, self.bucket, prefix, None, limit, max_bytes))
    }

    /// The committed values of `keys`, in order: the cache's, and the rest
    /// read in statements of `ROWS_PER_STATEMENT` keys (one round trip
    /// each on PostgreSQL).
    pub fn values(&self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>> {
        if !self.cached {
            return keys.iter().map(|k| self.value(k)).collect();
        }
        let cache = &self.storage.inner.hot.keys;
        let mut out: Vec<Option<Option<Vec<u8>>>> = keys
            .iter()
            .map(|k| {
                cache
                    .get(self.bucket, self.generation, k)
                    .map(|CachedValue(v)| v.map(|v| v.to_vec()))
            })
            .collect();
        let misses: Vec<&str> = keys
            .iter()
            .zip(&out)
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| *k)
            .collect();
        let mut found = std::collections::HashMap::new();
        let mut chunks = misses.chunks_exact(ROWS_PER_STATEMENT);
        for chunk in &mut chunks {
            let mut params = vec![Arg::Int(self.bucket)];
            params.extend(chunk.iter().map(|k| Arg::Text(k)));
            let rows = self.read(|db| {
                db.query_all(&SELECT_MANY, &params, |r| Ok((r.text(0)?, r.bytes(1)?)))
            })?;
            found.extend(rows);
        }
        for k in chunks.remainder() {
            if let Some(v) = self.read(|db| value_in(db, self.bucket, k))? {
                found.insert(k.to_string(), v);
            }
        }
        for (k, v) in keys.iter().zip(out.iter_mut()) {
            if v.is_none() {
                let value = found.get(*k).cloned();
                cache.fill(self.bucket, self.generation, k, &value);
                *v = Some(value);
            }
        }
        Ok(out.into_iter().map(Option::flatten).collect())
    }
}

/// The values of [`ROWS_PER_STATEMENT`] keys in one statement: one
/// equality lookup per key, `UNION ALL`ed (an `IN` list lets PostgreSQL's
/// planner scan the whole bucket when its statistics are young).
static SELECT_MANY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    (0..ROWS_PER_STATEMENT)
        .map(|i| {
            format!(
                "SELECT key, value FROM processor_keys WHERE bucket = ?1 AND key = ?{}",
                2 + i
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
});

/// Up to `limit` keys and values of `bucket` that start with `prefix`,
/// after `after`, in byte order, no more bytes than reach `max_bytes` (at
/// least one key).
fn page_in(
    db: Db<'_>,
    bucket: i64,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
    max_bytes: usize,
) -> Result<Vec<(String, Vec<u8>)>> {
    // Keys at or after the prefix, in order: those that start with it
    // come first, so the page ends at the first that does not.
    let from = match after {
        Some(a) if a >= prefix => a,
        _ => prefix,
    };
    let op = if after.is_none_or(|a| a < prefix) {
        ">="
    } else {
        ">"
    };
    let bound = max_bytes.min(i64::MAX as usize) as i64;
    let rows = match db.dialect() {
        // Rows are read one by one: stop at the bound.
        sql::Dialect::Sqlite => {
            let mut bytes = 0usize;
            db.query_while(
                &format!(
                    "SELECT key, value FROM processor_keys WHERE bucket = ?1 AND key {op} ?2
                     ORDER BY key LIMIT ?3"
                ),
                args![bucket, from, limit as i64],
                |r| {
                    if bytes >= max_bytes {
                        return Ok(None);
                    }
                    let (key, value) = (r.text(0)?, r.bytes(1)?);
                    bytes += key.len() + value.len();
                    Ok(Some((key, value)))
                },
            )
        }
        // The client takes the whole answer: the database cuts it.
        sql::Dialect::Postgres => db.query_all(
            &format!(
                "SELECT key, value FROM (
                     SELECT key, value,
                            SUM(octet_length(key) + octet_length(value)) OVER (ORDER BY key)
                                - octet_length(key) - octet_length(value) AS before
                     FROM processor_keys WHERE bucket = ?1 AND key {op} ?2
                     ORDER BY key LIMIT ?3
                 ) page
                 WHERE before < ?4
                 ORDER BY key"
            ),
            args![bucket, from, limit as i64, bound],
            |r| Ok((r.text(0)?, r.bytes(1)?)),
        ),
    }?;
    Ok(rows
        .into_iter()
        .take_while(|(k, _)| k.starts_with(prefix))
        .collect())
}

fn value_in(db: Db<'_>, bucket: i64, key: &str) -> Result<Option<Vec<u8>>> {
    db.query_opt(
        "SELECT value FROM processor_keys WHERE bucket = ?1 AND key = ?2",
        args![bucket, key],
        |r| r.bytes(0),
    )
}

fn keys_after_in(
    db: Db<'_>,
    bucket: i64,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>> {
    db.query_all(
        "SELECT key FROM processor_keys WHERE bucket = ?1 AND key > ?2
         ORDER BY key LIMIT ?3",
        args![bucket, after.unwrap_or(""), limit as i64],
        |r| r.text(0),
    )
}

impl Storage {
    /// `bucket` read through the cache, at the checkpoint `tag` (`""`: a
    /// new bucket).
    pub fn stored_bucket(&self, bucket: i64, tag: &str) -> StoredBucket {
        StoredBucket {
            storage: self.clone(),
            bucket,
            generation: self.inner.hot.keys.generation(bucket, tag),
            reads: Mutex::new(None),
            cached: true,
        }
    }

    /// `bucket` read in `reads` (a snapshot), not through the cache.
    pub(super) fn snapshot_bucket(
        &self,
        bucket: i64,
        reads: super::ReadTransaction,
    ) -> StoredBucket {
        StoredBucket {
            storage: self.clone(),
            bucket,
            generation: 0,
            reads: Mutex::new(Some(reads)),
            cached: false,
        }
    }

    /// A new bucket's id, known to the cache as empty (its first commit
    /// fills the cache with its writes).
    pub fn new_bucket(&self) -> i64 {
        let id = new_bucket_id();
        self.inner.hot.keys.generation(id, "");
        id
    }

    /// The key cache's bytes held and bound.
    pub fn key_cache_usage(&self) -> (u64, u64) {
        self.inner.hot.keys.usage()
    }

    /// The committed value of `key` in `bucket`.
    pub fn key_value(&self, bucket: i64, key: &str) -> Result<Option<Vec<u8>>> {
        self.with_reader(|db| value_in(db, bucket, key))
    }

    /// Up to `limit` committed keys of `bucket` after `after`, in byte order.
    #[cfg(test)]
    pub fn keys_after(
        &self,
        bucket: i64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>> {
        self.with_reader(|db| {
            db.query_all(
                "SELECT key FROM processor_keys WHERE bucket = ?1 AND key > ?2
                 ORDER BY key LIMIT ?3",
                args![bucket, after.unwrap_or(""), limit as i64],
                |r| r.text(0),
            )
        })
    }

    /// Up to `limit` committed keys and values of `bucket` that start with
    /// `prefix`, after `after`, in byte order, and no more bytes of them
    /// than reach `max_bytes` (at least one key).
    pub fn keys_page(
        &self,
        bucket: i64,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        self.with_reader(|db| page_in(db, bucket, prefix, after, limit, max_bytes))
    }

    /// Every committed key and value of `bucket`, in byte order, a page at
    /// a time (verify's comparison).
    pub fn each_key(
        &self,
        bucket: i64,
        mut each: impl FnMut(String, Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        let mut after: Option<String> = None;
        loop {
            let page = self.keys_page(
                bucket,
                "",
                after.as_deref(),
                1000,
                self.bounds().read_bytes_max,
            )?;
            let Some((last, _)) = page.last() else {
                return Ok(());
            };
            after = Some(last.clone());
            for (k, v) in page {
                each(k, v)?;
            }
        }
    }
}

/// A processor instance as a SQLite data dir holds it, read offline
/// (`streamhost fold --data-dir`): its checkpoint offset, state and keys.
pub struct OfflineInstance {
    pub checkpoint_offset: u64,
    pub state: String,
    pub keys: std::collections::BTreeMap<String, Vec<u8>>,
}

/// Reads processor `component`'s instance on stream `path` of `project`
/// (`""`: the global namespace) from the SQLite database in `data_dir`,
/// read-only (a running server may hold it).
pub fn read_offline(
    data_dir: &std::path::Path,
    project: &str,
    path: &str,
    component: &str,
) -> Result<OfflineInstance> {
    use anyhow::Context as _;
    let db_path = data_dir.join("streamhost.db");
    if !db_path.exists() {
        anyhow::bail!("{} holds no streamhost.db", data_dir.display());
    }
    let conn =
        rusqlite::Connection::open_with_flags(&db_path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .with_context(|| format!("opening {}", db_path.display()))?;
    let db = Db::Sqlite(&conn);
    db.batch("BEGIN")?;
    let row = db
        .query_opt(
            "SELECT id FROM streams WHERE project = ?1 AND path = ?2",
            args![project, path],
            |r| r.int(0),
        )?
        .with_context(|| {
            format!(
                "no stream {path:?} in project {project:?} in {}",
                db_path.display()
            )
        })?;
    let (offset, state, bucket) = db
        .query_opt(
            "SELECT checkpoint_offset, state, bucket FROM processor_checkpoints
             WHERE stream = ?1 AND component = ?2",
            args![row, component],
            |r| Ok((r.int(0)? as u64, r.text(1)?, r.int(2)?)),
        )?
        .with_context(|| format!("processor {component:?} has no checkpoint on stream {path:?}"))?;
    let mut keys = std::collections::BTreeMap::new();
    for (k, v) in db.query_all(
        "SELECT key, value FROM processor_keys WHERE bucket = ?1 ORDER BY key",
        args![bucket],
        |r| Ok((r.text(0)?, r.bytes(1)?)),
    )? {
        keys.insert(k, v);
    }
    Ok(OfflineInstance {
        checkpoint_offset: offset,
        state,
        keys,
    })
}

/// Applies a checkpoint's writes to its bucket, and drops the bucket it
/// replaces (a new source lifetime, a refold's switch). In the checkpoint's
/// transaction.
pub(super) fn apply(
    conn: Db<'_>,
    bucket: i64,
    writes: &Writes,
    drop_bucket: Option<i64>,
) -> Result<()> {
    if let Some(old) = drop_bucket {
        conn.execute("DELETE FROM processor_keys WHERE bucket = ?1", args![old])?;
    }
    // Many rows per statement (one round trip on PostgreSQL, one statement
    // step on SQLite), in chunks of one size so the statement is prepared
    // once; the rest one by one.
    let sets: Vec<(&String, &Vec<u8>)> = writes
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
        .collect();
    let deletes: Vec<&String> = writes
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k)
        .collect();
    let mut chunks = sets.chunks_exact(ROWS_PER_STATEMENT);
    for chunk in &mut chunks {
        let mut params = vec![Arg::Int(bucket)];
        for (k, v) in chunk {
            params.push(Arg::Text(k));
            params.push(Arg::Bytes(v));
        }
        conn.execute(&UPSERT_MANY, &params)?;
    }
    for (k, v) in chunks.remainder() {
        conn.execute(
            "INSERT INTO processor_keys (bucket, key, value) VALUES (?1, ?2, ?3)
             ON CONFLICT (bucket, key) DO UPDATE SET value = excluded.value",
            args![bucket, *k, *v],
        )?;
    }
    let mut chunks = deletes.chunks_exact(ROWS_PER_STATEMENT);
    for chunk in &mut chunks {
        let mut params = vec![Arg::Int(bucket)];
        params.extend(chunk.iter().map(|k| Arg::Text(k)));
        conn.execute(&DELETE_MANY, &params)?;
    }
    for k in chunks.remainder() {
        conn.execute(
            "DELETE FROM processor_keys WHERE bucket = ?1 AND key = ?2",
            args![bucket, *k],
        )?;
    }
    Ok(())
}

/// A scratch bucket's life (`scratch_buckets`): the keyed state a shadow
/// or a refold folds, in storage while it folds.
#[derive(Debug, Clone)]
pub enum ScratchOp {
    /// A fold of `instance` for `purpose` starts in `bucket`: any earlier
    /// scratch bucket of the same instance and purpose goes (a fold
    /// replaced, or one a restart left), and `copy_from` (the instance's
    /// base, when retention kept one) is copied in.
    Start {
        bucket: i64,
        instance: ScratchInstance,
        copy_from: Option<i64>,
    },
    /// A fold's writes so far, into its bucket; refused when the bucket
    /// was dropped (a newer fold of the instance replaced it).
    Write { bucket: i64, keys: Writes },
    /// The fold ended without being adopted: its bucket goes.
    Drop { bucket: i64 },
    /// At start: the scratch buckets whose component has no pending refold
    /// or shadow of their version any more go (their folds cannot resume).
    Sweep,
}

/// Whose scratch bucket: a processor instance, the version folding it, and
/// why (`shadow`, `refold`).
#[derive(Debug, Clone)]
pub struct ScratchInstance {
    pub project: String,
    pub path: String,
    pub component: String,
    pub digest: String,
    pub purpose: String,
}

/// Applies a [`ScratchOp`] in the writer's transaction; answers the rows
/// of `scratch_buckets` it touched.
pub(super) fn apply_scratch(conn: Db<'_>, op: &ScratchOp) -> Result<i64> {
    match op {
        ScratchOp::Start {
            bucket,
            instance: i,
            copy_from,
        } => {
            let earlier = "SELECT bucket FROM scratch_buckets WHERE project = ?1 AND path = ?2
                 AND component = ?3 AND purpose = ?4";
            conn.execute(
                &format!("DELETE FROM processor_keys WHERE bucket IN ({earlier})"),
                args![&i.project, &i.path, &i.component, &i.purpose],
            )?;
            conn.execute(
                "DELETE FROM scratch_buckets WHERE project = ?1 AND path = ?2
                 AND component = ?3 AND purpose = ?4",
                args![&i.project, &i.path, &i.component, &i.purpose],
            )?;
            conn.execute(
                "INSERT INTO scratch_buckets (bucket, project, path, component, digest, purpose)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                args![
                    *bucket,
                    &i.project,
                    &i.path,
                    &i.component,
                    &i.digest,
                    &i.purpose
                ],
            )?;
            if let Some(from) = copy_from {
                // The base read before may have been replaced since (its
                // rows gone): then the fold starts again.
                let kept = conn.query_opt(
                    "SELECT 1 FROM processor_bases WHERE bucket = ?1",
                    args![*from],
                    |r| r.int(0),
                )?;
                if kept.is_none() {
                    anyhow::bail!(
                        "the instance's base moved while the fold started: it starts again"
                    );
                }
                conn.execute(
                    "INSERT INTO processor_keys (bucket, key, value)
                     SELECT ?1, key, value FROM processor_keys WHERE bucket = ?2",
                    args![*bucket, *from],
                )?;
            }
            Ok(1)
        }
        ScratchOp::Write { bucket, keys } => {
            if !is_scratch(conn, *bucket)? {
                anyhow::bail!(
                    "the fold's keyed state (scratch bucket {bucket}) was dropped: a newer fold \
                     of the instance replaced it"
                );
            }
            apply(conn, *bucket, keys, None)?;
            Ok(1)
        }
        ScratchOp::Drop { bucket } => {
            conn.execute(
                "DELETE FROM processor_keys WHERE bucket = ?1",
                args![*bucket],
            )?;
            Ok(conn.execute(
                "DELETE FROM scratch_buckets WHERE bucket = ?1",
                args![*bucket],
            )? as i64)
        }
        ScratchOp::Sweep => {
            let orphans = "SELECT bucket FROM scratch_buckets s WHERE NOT EXISTS (
                     SELECT 1 FROM pending_refolds p
                     WHERE p.project = s.project AND p.name = s.component AND p.digest = s.digest)";
            conn.execute(
                &format!("DELETE FROM processor_keys WHERE bucket IN ({orphans})"),
                args![],
            )?;
            Ok(conn.execute(
                &format!("DELETE FROM scratch_buckets WHERE bucket IN ({orphans})"),
                args![],
            )? as i64)
        }
    }
}

/// Whether `bucket` is a fold's scratch bucket still.
fn is_scratch(conn: Db<'_>, bucket: i64) -> Result<bool> {
    Ok(conn
        .query_opt(
            "SELECT 1 FROM scratch_buckets WHERE bucket = ?1",
            args![bucket],
            |r| r.int(0),
        )?
        .is_some())
}

/// A checkpoint that adopts a fold's scratch bucket (a promotion, a
/// refold's switch): its row goes, in the checkpoint's transaction; an
/// error when it went already (a newer fold replaced it: its rows are
/// gone).
pub(super) fn adopt_scratch(conn: Db<'_>, bucket: i64) -> Result<()> {
    let adopted = conn.execute(
        "DELETE FROM scratch_buckets WHERE bucket = ?1",
        args![bucket],
    )?;
    if adopted != 1 {
        anyhow::bail!(
            "the fold's keyed state (scratch bucket {bucket}) was dropped: a newer fold of the \
             instance replaced it"
        );
    }
    Ok(())
}

/// Rows written by one multi-row statement.
const ROWS_PER_STATEMENT: usize = 64;

/// `INSERT ... VALUES (?1, ?2, ?3), (?1, ?4, ?5), ... ON CONFLICT ...` for
/// [`ROWS_PER_STATEMENT`] rows.
static UPSERT_MANY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let rows: Vec<String> = (0..ROWS_PER_STATEMENT)
        .map(|i| format!("(?1, ?{}, ?{})", 2 + 2 * i, 3 + 2 * i))
        .collect();
    format!(
        "INSERT INTO processor_keys (bucket, key, value) VALUES {}
         ON CONFLICT (bucket, key) DO UPDATE SET value = excluded.value",
        rows.join(", ")
    )
});

/// `DELETE ... WHERE bucket = ?1 AND key IN (?2, ...)` for
/// [`ROWS_PER_STATEMENT`] keys.
static DELETE_MANY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "DELETE FROM processor_keys WHERE bucket = ?1 AND key IN ({})",
        sql::placeholders(2, ROWS_PER_STATEMENT)
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_moves_a_bucket_to_a_new_generation_at_another_checkpoint() {
        let cache = KeyCache::new(1 << 20);
        let g1 = cache.generation(7, "s/10/d");
        assert_eq!(cache.generation(7, "s/10/d"), g1);
        let mut w = Writes::new();
        w.insert("a".into(), Some(b"1".to_vec()));
        cache.committed(7, "s/10/d", "s/11/d", &w);
        assert_eq!(cache.generation(7, "s/11/d"), g1, "our own commit keeps it");
        assert!(cache.get(7, g1, "a").is_some());
        let g2 = cache.generation(7, "s/12/d");
        assert_ne!(g1, g2, "someone else's commit moves it");
        assert!(cache.get(7, g2, "a").is_none());
        // A commit from a checkpoint the cache was not at forgets it.
        cache.committed(7, "s/99/d", "s/100/d", &w);
        assert_ne!(cache.generation(7, "s/100/d"), g2);
    }

    #[test]
    fn the_cache_holds_at_most_its_bytes() {
        let cache = KeyCache::new(100_000);
        let g = cache.generation(1, "t");
        for i in 0..10_000 {
            cache.fill(1, g, &format!("key-{i}"), &Some(vec![0; 100]));
        }
        let (used, cap) = cache.usage();
        assert!(used <= cap, "{used} > {cap}");
    }
}
