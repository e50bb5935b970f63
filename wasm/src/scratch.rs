//! A shadow's or a refold's keyed state in storage while it folds (a
//! scratch bucket, `scratch_buckets`): the fold reads the bucket's rows
//! and holds in memory only what it wrote since its last spill, so a
//! fold over millions of keys holds a bounded part of them. A promotion or
//! a refold's switch adopts the bucket as the instance's in its checkpoint
//! write; a fold dropped without that drops the bucket (and a restart's
//! sweep the buckets of folds that cannot resume).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::keyed::Bucket;
use streamhost_core::delivery::Failure;
use streamhost_storage::{ScratchInstance, ScratchOp, Storage, WriteOp};

/// A fold spills its writes to storage once they reach this many bytes
/// (and at the end of each step).
pub const SPILL_BYTES: usize = 8 * 1024 * 1024;

/// Commits `op` through the writer thread and waits for it. (Not
/// `commit_blocking`, which commits on the calling thread when the writer
/// is idle: verify and `/at/` fold on the runtime's lowest-priority
/// threads, and one of those holding the write connection while it waits
/// for a core would hold every other write.)
fn write(storage: &Storage, op: WriteOp) -> Result<i64, streamhost_storage::CommitError> {
    storage.submit(op).blocking_recv().unwrap_or_else(|_| {
        Err(streamhost_storage::CommitError::new(
            "the storage writer has stopped",
        ))
    })
}

/// A fold's scratch bucket.
pub struct Scratch {
    storage: Storage,
    bucket: i64,
    /// Spills so far: each names a new generation of the key cache's
    /// entries for the bucket (the rows changed).
    spills: AtomicU64,
    /// The fold's state and offset at its last spill within a run: what
    /// the stored rows hold (a run that fails after a spill goes on from
    /// there, not from where it began).
    mark: Mutex<Option<(String, u64)>>,
    adopted: bool,
}

impl Scratch {
    /// A new scratch bucket for `instance`, replacing any earlier one of
    /// the same instance and purpose, with the keys of the base bucket
    /// `copy_from` (retention's base of the instance) copied in.
    pub fn start(
        storage: &Storage,
        instance: ScratchInstance,
        copy_from: Option<i64>,
    ) -> Result<Scratch, Failure> {
        let bucket = storage.new_bucket();
        write(
            storage,
            WriteOp::Scratch(ScratchOp::Start {
                bucket,
                instance,
                copy_from,
            }),
        )
        .map_err(|e| {
            Failure::new(
                format!("starting the fold's keyed state failed: {}", e.message()),
                true,
            )
        })?;
        Ok(Scratch {
            storage: storage.clone(),
            bucket,
            spills: AtomicU64::new(0),
            mark: Mutex::new(None),
            adopted: false,
        })
    }

    /// The bucket's id.
    pub fn id(&self) -> i64 {
        self.bucket
    }

    /// The bucket as a fold reads it now: its stored rows (read in one
    /// read transaction, held while the answer lives: drop it between
    /// steps), nothing written yet.
    pub fn bucket(&self) -> Bucket {
        let tag = format!("scratch/{}", self.spills.load(Ordering::Relaxed));
        Bucket::new(Arc::new(self.storage.stored_bucket(self.bucket, &tag)))
    }

    /// Writes what `bucket` (one of [`Scratch::bucket`]'s) wrote into the
    /// stored bucket; answers the bucket to fold on with.
    pub fn spill(&self, bucket: Bucket) -> Result<Bucket, Failure> {
        if bucket.writes().is_empty() {
            return Ok(bucket);
        }
        let keys = bucket.into_writes();
        write(
            &self.storage,
            WriteOp::Scratch(ScratchOp::Write {
                bucket: self.bucket,
                keys,
            }),
        )
        .map_err(|e| {
            Failure::new(
                format!("keeping the fold's keyed state failed: {}", e.message()),
                true,
            )
        })?;
        self.spills.fetch_add(1, Ordering::Relaxed);
        Ok(self.bucket())
    }

    /// Spills when `bucket` holds [`SPILL_BYTES`] of writes: the fold's
    /// `state` after the events through `through` (kept as the mark).
    pub fn spill_if_full(
        &self,
        bucket: Bucket,
        state: &str,
        through: u64,
    ) -> Result<Bucket, Failure> {
        if bucket.write_bytes() < SPILL_BYTES {
            return Ok(bucket);
        }
        let bucket = self.spill(bucket)?;
        *self.mark.lock().expect("scratch mark") = Some((state.to_string(), through));
        Ok(bucket)
    }

    /// The state and offset of the last spill within a run, taken (a run
    /// that failed goes on from there).
    pub fn take_mark(&self) -> Option<(String, u64)> {
        self.mark.lock().expect("scratch mark").take()
    }

    /// A checkpoint took the bucket as the instance's (it stays).
    pub fn adopted(mut self) {
        self.adopted = true;
    }
}

/// A stored bucket's keys and values in byte order, read a page at a
/// time; a read that fails ends it and is kept in `error`.
pub struct StoredKeys<'a> {
    storage: &'a Storage,
    bucket: i64,
    page: std::vec::IntoIter<(String, Vec<u8>)>,
    after: Option<String>,
    done: bool,
    error: Option<anyhow::Error>,
}

impl<'a> StoredKeys<'a> {
    /// The keys of `bucket` (0: none).
    pub fn new(storage: &'a Storage, bucket: i64) -> StoredKeys<'a> {
        StoredKeys {
            storage,
            bucket,
            page: Vec::new().into_iter(),
            after: None,
            done: bucket == 0,
            error: None,
        }
    }

    /// Whether every read succeeded (an iteration that ended early on a
    /// failed read is not the bucket's whole).
    pub fn finish(self) -> anyhow::Result<()> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Iterator for StoredKeys<'_> {
    type Item = (String, Vec<u8>);

    fn next(&mut self) -> Option<(String, Vec<u8>)> {
        loop {
            if let Some((k, v)) = self.page.next() {
                self.after = Some(k.clone());
                return Some((k, v));
            }
            if self.done {
                return None;
            }
            let read = self.storage.keys_page(
                self.bucket,
                "",
                self.after.as_deref(),
                1000,
                self.storage.bounds().read_bytes_max,
            );
            match read {
                Ok(page) if page.is_empty() => self.done = true,
                Ok(page) => self.page = page.into_iter(),
                Err(e) => {
                    self.error = Some(e);
                    self.done = true;
                }
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.adopted {
            // Not waited for: the writer drops it in its next group.
            drop(self.storage.submit(WriteOp::Scratch(ScratchOp::Drop {
                bucket: self.bucket,
            })));
        }
    }
}
