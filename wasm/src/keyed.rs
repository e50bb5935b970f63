//! A processor's keyed state: the `wasi:keyvalue` bucket a fold opens with
//! `open("")`, as the fold sees it.
//!
//! The committed bucket is a [`Base`] (rows in storage behind the bounded
//! key cache of `storage/src/keys.rs` for wakes; a map in memory for verify,
//! refold, backfill and `streamhost fold`). A fold's writes never touch it: they collect in
//! the [`Bucket`]'s write set, which the wake commits with its checkpoint in
//! one transaction, or drops with a failing fold. Each guest call works in
//! a [`Session`], its own layer over the bucket, so a call whose result is
//! dropped (a batch folded again one event at a time) leaves no write
//! behind. Reads are deterministic: a key's value is what the checkpoint
//! committed, overlaid by this fold's own writes, in order.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Longest key, in bytes.
pub const KEY_BYTES_MAX: usize = 1024;
/// Largest value, in bytes.
pub const VALUE_BYTES_MAX: usize = 1024 * 1024;
/// Most keys a `list-keys` page holds.
pub const LIST_PAGE_KEYS: usize = 1000;
/// Most bytes (keys and values) one wake's writes may hold before they
/// commit: a fold that writes more fails (not retryable) naming the bound.
pub const WRITES_BYTES_MAX: usize = 256 * 1024 * 1024;

/// The committed bucket a fold reads.
pub trait Base: Send + Sync {
    /// The value of `key`.
    fn get(&self, key: &str) -> anyhow::Result<Option<Vec<u8>>>;
    /// Up to `limit` keys after `after` (all keys when `None`), in byte order.
    fn keys_after(&self, after: Option<&str>, limit: usize) -> anyhow::Result<Vec<String>>;
    /// The values of `keys`, in order (a store may read them at once).
    fn get_many(&self, keys: &[&str]) -> anyhow::Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }
}

/// A bucket held in memory: a scratch bucket (verify), one read from a
/// file (`streamhost fold --keys`), the benchmark's native baseline.
#[derive(Debug, Clone, Default)]
pub struct Memory(pub BTreeMap<String, Vec<u8>>);

impl Base for Memory {
    fn get(&self, key: &str) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(self.0.get(key).cloned())
    }

    fn keys_after(&self, after: Option<&str>, limit: usize) -> anyhow::Result<Vec<String>> {
        use std::ops::Bound;
        let start = match after {
            Some(a) => Bound::Excluded(a.to_string()),
            None => Bound::Unbounded,
        };
        Ok(self
            .0
            .range((start, Bound::Unbounded))
            .take(limit)
            .map(|(k, _)| k.clone())
            .collect())
    }
}

/// Writes to a bucket: a value, or `None` for a delete.
pub type Writes = BTreeMap<String, Option<Vec<u8>>>;

/// The bucket as one fold sees it: the committed `base` and the writes of
/// the fold's calls so far.
pub struct Bucket {
    base: Arc<dyn Base>,
    writes: Writes,
    write_bytes: usize,
}

impl Bucket {
    /// The bucket `base`, nothing written yet.
    pub fn new(base: Arc<dyn Base>) -> Bucket {
        Bucket {
            base,
            writes: Writes::new(),
            write_bytes: 0,
        }
    }

    /// An empty bucket in memory.
    pub fn empty() -> Bucket {
        Bucket::new(Arc::new(Memory::default()))
    }

    /// An empty bucket in memory with `writes` written already (a fold
    /// that starts from a kept state and its keys).
    pub fn with_writes(writes: Writes) -> Bucket {
        let write_bytes = writes
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
            .sum();
        Bucket {
            base: Arc::new(Memory::default()),
            writes,
            write_bytes,
        }
    }

    /// What the fold wrote, to commit.
    pub fn into_writes(self) -> Writes {
        self.writes
    }

    /// What the fold wrote so far.
    pub fn writes(&self) -> &Writes {
        &self.writes
    }

    /// The bytes (keys and values) of what the fold wrote so far.
    pub fn write_bytes(&self) -> usize {
        self.write_bytes
    }

    /// `key` as the fold sees it.
    pub fn get(&self, key: &str) -> anyhow::Result<Option<Vec<u8>>> {
        match self.writes.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.base.get(key),
        }
    }

    /// A guest call's view of the bucket.
    pub fn session(self) -> Session {
        Session {
            bucket: self,
            layer: Writes::new(),
            layer_bytes: 0,
            seen: BTreeSet::new(),
            cursors: Vec::new(),
        }
    }
}

/// Why a bucket operation did not answer.
#[derive(Debug)]
pub enum KeyedError {
    /// The guest asked for something the bucket refuses (a key or value
    /// over its bound): answered to the guest as `error::other`.
    Refused(String),
    /// Storage failed: the call traps, and the wake is retried.
    Storage(anyhow::Error),
}

impl From<anyhow::Error> for KeyedError {
    fn from(e: anyhow::Error) -> Self {
        KeyedError::Storage(e)
    }
}

/// One guest call's view of the bucket: the fold's bucket with this call's
/// writes in a layer of their own, merged by [`Session::keep`] when the
/// call's result is kept.
pub struct Session {
    bucket: Bucket,
    layer: Writes,
    layer_bytes: usize,
    /// Keys this call read from the bucket as it stood at the call's start
    /// (the repro seeds them).
    seen: BTreeSet<String>,
    /// `list-keys` cursors: cursor `n` resumes after `cursors[n - 1]`.
    cursors: Vec<String>,
}

/// Refuses a key no engine can store (a NUL byte) or longer than the bound.
pub fn check_key(key: &str) -> Result<(), KeyedError> {
    // PostgreSQL's text holds no NUL; neither engine takes one, so a key
    // means the same on both.
    if let Some(at) = key.find('\0') {
        let head: String = key.chars().take(32).collect();
        return Err(KeyedError::Refused(format!(
            "key {head:?} holds a NUL byte (at byte {at}): keys are text without NUL"
        )));
    }
    if key.len() > KEY_BYTES_MAX {
        let head: String = key.chars().take(32).collect();
        return Err(KeyedError::Refused(format!(
            "key {head:?}... is {} bytes, over the {KEY_BYTES_MAX}-byte key limit",
            key.len()
        )));
    }
    Ok(())
}

fn check_value(key: &str, value: &[u8]) -> Result<(), KeyedError> {
    if value.len() > VALUE_BYTES_MAX {
        return Err(KeyedError::Refused(format!(
            "the value of key {key:?} is {} bytes, over the {VALUE_BYTES_MAX}-byte value limit",
            value.len()
        )));
    }
    Ok(())
}

impl Session {
    /// `get`.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, KeyedError> {
        check_key(key)?;
        if let Some(v) = self.layer.get(key) {
            return Ok(v.clone());
        }
        self.saw(key);
        Ok(self.bucket.get(key)?)
    }

    /// `get-many`: what the call wrote itself from its layer, the rest
    /// from the bucket, whose committed part is read at once.
    pub fn get_many(&mut self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, KeyedError> {
        let mut out: Vec<Option<Option<Vec<u8>>>> = Vec::with_capacity(keys.len());
        let mut missing: Vec<&str> = Vec::new();
        for k in keys {
            check_key(k)?;
            let known = match self.layer.get(k.as_str()) {
                Some(v) => Some(v.clone()),
                None => {
                    self.saw(k);
                    self.bucket.writes.get(k.as_str()).cloned()
                }
            };
            if known.is_none() {
                missing.push(k);
            }
            out.push(known);
        }
        let mut read = self.bucket.base.get_many(&missing)?.into_iter();
        Ok(out
            .into_iter()
            .map(|v| v.unwrap_or_else(|| read.next().flatten()))
            .collect())
    }

    /// Notes that this call read `key` from the bucket as it stood at the
    /// call's start.
    fn saw(&mut self, key: &str) {
        if !self.seen.contains(key) {
            self.seen.insert(key.to_string());
        }
    }

    /// `exists`.
    pub fn exists(&mut self, key: &str) -> Result<bool, KeyedError> {
        Ok(self.get(key)?.is_some())
    }

    /// `set`.
    pub fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), KeyedError> {
        check_key(&key)?;
        check_value(&key, &value)?;
        self.write(key, Some(value))
    }

    /// `delete`.
    pub fn delete(&mut self, key: String) -> Result<(), KeyedError> {
        check_key(&key)?;
        self.write(key, None)
    }

    fn write(&mut self, key: String, value: Option<Vec<u8>>) -> Result<(), KeyedError> {
        let bytes = key.len() + value.as_ref().map_or(0, Vec::len);
        let total = self.bucket.write_bytes + self.layer_bytes + bytes;
        if total > WRITES_BYTES_MAX {
            return Err(KeyedError::Refused(format!(
                "the fold's writes reached {total} bytes, over the {WRITES_BYTES_MAX}-byte bound on one wake's writes"
            )));
        }
        self.layer_bytes += bytes;
        self.layer.insert(key, value);
        Ok(())
    }

    /// Whether `key` exists as the fold sees it outside this call's layer.
    fn visible(&self, key: &str) -> Option<bool> {
        self.layer.get(key).map(Option::is_some)
    }

    /// `list-keys`: a page of keys in byte order and the cursor of the
    /// next page.
    pub fn list_keys(
        &mut self,
        cursor: Option<u64>,
    ) -> Result<(Vec<String>, Option<u64>), KeyedError> {
        let after = match cursor {
            None | Some(0) => None,
            Some(n) => Some(self.cursors.get(n as usize - 1).cloned().ok_or_else(|| {
                KeyedError::Refused(format!(
                    "cursor {n} was not returned by list-keys in this call"
                ))
            })?),
        };
        let base = self
            .bucket
            .base
            .keys_after(after.as_deref(), LIST_PAGE_KEYS)?;
        // The base page ends at its last key when it is full: overlaid
        // keys past it belong to later pages.
        let bound = (base.len() == LIST_PAGE_KEYS)
            .then(|| base.last().cloned())
            .flatten();
        let in_range = |k: &String| {
            after.as_ref().is_none_or(|a| k > a) && bound.as_ref().is_none_or(|b| k <= b)
        };
        let mut keys: BTreeSet<String> = base.into_iter().collect();
        for (k, v) in self.bucket.writes.iter().filter(|(k, _)| in_range(k)) {
            if v.is_some() {
                keys.insert(k.clone());
            } else {
                keys.remove(k);
            }
        }
        let before_layer: Vec<String> = keys.iter().cloned().collect();
        for (k, v) in self.layer.iter().filter(|(k, _)| in_range(k)) {
            if v.is_some() {
                keys.insert(k.clone());
            } else {
                keys.remove(k);
            }
        }
        for k in before_layer {
            if self.visible(&k).is_none() {
                self.seen.insert(k);
            }
        }
        let mut page: Vec<String> = keys.into_iter().collect();
        let more = bound.is_some() || page.len() > LIST_PAGE_KEYS;
        page.truncate(LIST_PAGE_KEYS);
        let next = match (more, page.last()) {
            (true, Some(last)) => {
                self.cursors.push(last.clone());
                Some(self.cursors.len() as u64)
            }
            _ => None,
        };
        Ok((page, next))
    }

    /// Ends the call keeping its writes.
    pub fn keep(mut self) -> Bucket {
        self.bucket.write_bytes += self.layer_bytes;
        // (Inserted one by one: `append` would rebuild the whole write set,
        // which a range fold grows to every key it wrote.)
        self.bucket.writes.extend(std::mem::take(&mut self.layer));
        self.bucket
    }

    /// Ends the call dropping its writes.
    pub fn drop_writes(self) -> Bucket {
        self.bucket
    }

    /// Ends a failed call: the bucket as it was before it, and the keys the
    /// call read with their values then (those that exist), for the repro.
    pub fn failed(self) -> (Bucket, Vec<(String, Vec<u8>)>) {
        let mut read = Vec::new();
        for k in &self.seen {
            if let Ok(Some(v)) = self.bucket.get(k) {
                read.push((k.clone(), v));
            }
        }
        (self.bucket, read)
    }
}

/// A key's value as the API shows it: text when it is UTF-8, else
/// `{"base64": "..."}`.
pub fn value_json(value: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(value) {
        Ok(text) => serde_json::Value::String(text.to_string()),
        Err(_) => {
            use base64::Engine as _;
            serde_json::json!({"base64": base64::engine::general_purpose::STANDARD.encode(value)})
        }
    }
}

/// The bytes of a value as [`value_json`] shows it.
pub fn value_from_json(key: &str, v: &serde_json::Value) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    match v {
        serde_json::Value::String(s) => Ok(s.as_bytes().to_vec()),
        serde_json::Value::Object(o) if o.len() == 1 && o.contains_key("base64") => {
            let text = o["base64"].as_str().unwrap_or_default();
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| format!("key {key:?}: the base64 value is not base64: {e}"))
        }
        other => Err(format!(
            "key {key:?}: a value is text or {{\"base64\": \"...\"}}, got {other}"
        )),
    }
}

/// Keys and values from JSON: the read API's page (`{"keys": [{"key",
/// "value"}]}`), or an object of key → value.
pub fn keys_from_json(v: &serde_json::Value) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut out = BTreeMap::new();
    match v.get("keys") {
        Some(serde_json::Value::Array(rows)) => {
            for (i, row) in rows.iter().enumerate() {
                let key = row["key"]
                    .as_str()
                    .ok_or_else(|| format!("keys[{i}] has no \"key\" text"))?;
                out.insert(key.to_string(), value_from_json(key, &row["value"])?);
            }
        }
        _ => {
            let object = v.as_object().ok_or_else(|| {
                "keys are {\"keys\": [{\"key\", \"value\"}]} or an object of key to value"
                    .to_string()
            })?;
            for (k, v) in object {
                out.insert(k.clone(), value_from_json(k, v)?);
            }
        }
    }
    for (k, v) in &out {
        check_key(k)
            .and_then(|_| check_value(k, v))
            .map_err(|e| match e {
                KeyedError::Refused(m) => m,
                KeyedError::Storage(e) => e.to_string(),
            })?;
    }
    Ok(out)
}

/// Keys and values as the read API's page shows them.
pub fn keys_to_json<'a>(
    keys: impl Iterator<Item = (&'a String, &'a Vec<u8>)>,
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = keys
        .map(|(k, v)| serde_json::json!({"key": k, "value": value_json(v)}))
        .collect();
    serde_json::json!({ "keys": rows })
}

impl Base for streamhost_storage::StoredBucket {
    fn get(&self, key: &str) -> anyhow::Result<Option<Vec<u8>>> {
        self.value(key)
    }

    fn get_many(&self, keys: &[&str]) -> anyhow::Result<Vec<Option<Vec<u8>>>> {
        self.values(keys)
    }

    fn keys_after(&self, after: Option<&str>, limit: usize) -> anyhow::Result<Vec<String>> {
        self.keys(after, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(pairs: &[(&str, &str)]) -> Bucket {
        Bucket::new(Arc::new(Memory(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
        )))
    }

    #[test]
    fn a_call_reads_the_base_under_its_own_and_earlier_writes() {
        let mut s = memory(&[("a", "1"), ("b", "2")]).session();
        assert_eq!(s.get("a").unwrap(), Some(b"1".to_vec()));
        s.set("a".into(), b"10".to_vec()).unwrap();
        s.delete("b".into()).unwrap();
        assert_eq!(s.get("a").unwrap(), Some(b"10".to_vec()));
        assert_eq!(s.get("b").unwrap(), None);
        let mut next = s.keep().session();
        assert_eq!(next.get("a").unwrap(), Some(b"10".to_vec()));
        assert!(!next.exists("b").unwrap());
        let bucket = next.keep();
        assert_eq!(bucket.writes().len(), 2);
    }

    #[test]
    fn get_many_answers_the_calls_writes_the_folds_and_the_base_in_order() {
        let mut earlier = memory(&[("a", "1"), ("b", "2"), ("c", "3")]).session();
        earlier.delete("b".into()).unwrap();
        let mut s = earlier.keep().session();
        s.set("c".into(), b"30".to_vec()).unwrap();
        let keys: Vec<String> = ["c", "b", "a", "zz"]
            .iter()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(
            s.get_many(&keys).unwrap(),
            vec![Some(b"30".to_vec()), None, Some(b"1".to_vec()), None]
        );
        let (_, read) = s.failed();
        assert_eq!(
            read,
            vec![("a".to_string(), b"1".to_vec())],
            "seeds: a (b is deleted, zz absent)"
        );
    }

    #[test]
    fn a_dropped_call_leaves_no_write() {
        let mut s = memory(&[("a", "1")]).session();
        s.set("a".into(), b"2".to_vec()).unwrap();
        let mut again = s.drop_writes().session();
        assert_eq!(again.get("a").unwrap(), Some(b"1".to_vec()));
        assert!(again.keep().into_writes().is_empty());
    }

    #[test]
    fn sizes_over_the_bounds_are_refused_naming_them() {
        let mut s = Bucket::empty().session();
        let long = "k".repeat(KEY_BYTES_MAX + 1);
        match s.set(long, vec![1]) {
            Err(KeyedError::Refused(m)) => {
                assert!(
                    m.contains("1025 bytes") && m.contains("1024-byte key limit"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        match s.set("big".into(), vec![0; VALUE_BYTES_MAX + 1]) {
            Err(KeyedError::Refused(m)) => {
                assert!(m.contains("\"big\"") && m.contains("1048577 bytes"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(s
            .set("k".repeat(KEY_BYTES_MAX), vec![0; VALUE_BYTES_MAX])
            .is_ok());
    }

    #[test]
    fn list_keys_pages_merge_base_and_writes_in_byte_order() {
        let base: Vec<(String, String)> = (0..2500)
            .map(|i| (format!("k{i:05}"), i.to_string()))
            .collect();
        let pairs: Vec<(&str, &str)> = base.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let mut s = memory(&pairs).session();
        s.delete("k00000".into()).unwrap();
        s.set("k00999x".into(), b"new".to_vec()).unwrap();
        s.set("zz".into(), b"last".to_vec()).unwrap();
        let mut all = Vec::new();
        let mut cursor = None;
        loop {
            let (page, next) = s.list_keys(cursor).unwrap();
            assert!(page.len() <= LIST_PAGE_KEYS);
            all.extend(page);
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        let mut expected: Vec<String> = base.into_iter().map(|(k, _)| k).skip(1).collect();
        expected.push("k00999x".into());
        expected.push("zz".into());
        expected.sort();
        assert_eq!(all, expected);
        assert!(matches!(
            s.list_keys(Some(99)),
            Err(KeyedError::Refused(m)) if m.contains("cursor 99")
        ));
    }

    #[test]
    fn keys_round_trip_through_json_and_bad_ones_are_named() {
        let mut keys = BTreeMap::new();
        keys.insert("text".to_string(), b"hello".to_vec());
        keys.insert("bin".to_string(), vec![0xff, 0, 1]);
        let json = keys_to_json(keys.iter());
        assert_eq!(json["keys"][0]["value"]["base64"], "/wAB");
        assert_eq!(keys_from_json(&json).unwrap(), keys);
        let object = serde_json::json!({"a": "1", "b": {"base64": "/wAB"}});
        assert_eq!(keys_from_json(&object).unwrap()["b"], vec![0xff, 0, 1]);
        let bad = keys_from_json(&serde_json::json!({"a": 5})).unwrap_err();
        assert!(bad.contains("key \"a\""), "{bad}");
        let long = serde_json::json!({ "k".repeat(2000): "v" });
        assert!(keys_from_json(&long).unwrap_err().contains("2000 bytes"));
    }

    #[test]
    fn a_failed_call_names_what_it_read_as_it_was_before_the_call() {
        let mut s = memory(&[("a", "1"), ("b", "2"), ("c", "3")]).session();
        s.get("a").unwrap();
        s.set("b".into(), b"changed".to_vec()).unwrap();
        s.get("b").unwrap(); // written first in the call: not a seed
        s.get("missing").unwrap();
        let (bucket, read) = s.failed();
        assert_eq!(read, vec![("a".to_string(), b"1".to_vec())]);
        assert!(bucket.into_writes().is_empty());
    }
}
