//! Keyed state: per-key entries beside the JSON state, for processors
//! whose state outgrows one JSON text (a balance per account, a record per
//! order). A wake reads and writes only the keys it touches, so its cost
//! follows what changed, not how many keys there are.
//!
//! The entries live in the processor's bucket (`wasi:keyvalue`, opened
//! with `open("")`): as of the checkpoint, plus this fold's own writes,
//! which commit with the new checkpoint and state, or not at all. A
//! [`Map`] is a typed view of the keys under one prefix, its values JSON
//! (so the host's `:processors/{component}/keys` shows them as text).
//! Keys are at most 1 KiB (prefix included), values at most 1 MiB.
//!
//! ```ignore
//! use streamhost_guest::keyed::Map;
//!
//! // Balances in cents, one key per account: "balance/<account>".
//! const BALANCES: Map<i64> = Map::new("balance/");
//!
//! let before = BALANCES.get("acct-1")?.unwrap_or(0);
//! BALANCES.set("acct-1", &(before + 250))?;
//! for (account, cents) in BALANCES.scan("acct-")? { /* ... */ }
//! ```
//!
//! A fold that knows from an event which keys it will read names them in
//! [`crate::Processor::prefetch`]: the SDK reads a batch's keys in one call
//! to the host (one statement per 64 keys in storage) before folding it.
//!
//! Under the `wasmtime` CLI, give the guest keys with
//! `wasmtime run -S keyvalue -S keyvalue-in-memory-data=KEY=VALUE ...`.

use std::cell::RefCell;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::bindings::wasi::keyvalue::{batch, store};
use crate::Failure;

thread_local! {
    /// The bucket, opened once per guest call (the host gives each call a
    /// fresh instance, so the handle never outlives its call).
    static BUCKET: RefCell<Option<std::rc::Rc<store::Bucket>>> = const { RefCell::new(None) };
    /// Values read ahead for this call ([`crate::Processor::prefetch`]),
    /// kept up to date by this call's writes. (A `BTreeMap`: a `HashMap`
    /// seeds itself with random bytes, and a fold that reads random bytes
    /// is folded again one event per call.)
    static READ: RefCell<std::collections::BTreeMap<String, Option<Vec<u8>>>> =
        const { RefCell::new(std::collections::BTreeMap::new()) };
}

/// Reads `keys` in one call to the host and keeps their values for this
/// call's `get`s (the SDK does it with the keys
/// [`crate::Processor::prefetch`] names for a batch).
pub fn prefetch(keys: Vec<String>) -> Result<(), Failure> {
    if keys.is_empty() {
        return Ok(());
    }
    let values = raw::get_many(&keys)?;
    READ.with(|r| r.borrow_mut().extend(keys.into_iter().zip(values)));
    Ok(())
}

/// A write of this call: a key read ahead now reads what was written.
fn remember(key: &str, value: Option<&[u8]>) {
    READ.with(|r| {
        if let Some(v) = r.borrow_mut().get_mut(key) {
            *v = value.map(<[u8]>::to_vec);
        }
    });
}

fn failure(what: &str, key: &str, e: store::Error) -> Failure {
    match e {
        store::Error::NoSuchStore => Failure::fatal("the host has no keyed state for this call"),
        store::Error::AccessDenied => Failure::fatal("the keyed state is open only during fold"),
        // A bound (key or value size): the same events give the same error.
        store::Error::Other(m) => Failure::fatal(format!("{what} {key:?}: {m}")),
    }
}

fn bucket() -> Result<std::rc::Rc<store::Bucket>, Failure> {
    BUCKET.with(|b| {
        if let Some(bucket) = &*b.borrow() {
            return Ok(bucket.clone());
        }
        let opened = std::rc::Rc::new(store::open("").map_err(|e| failure("open", "", e))?);
        *b.borrow_mut() = Some(opened.clone());
        Ok(opened)
    })
}

/// Raw access to the bucket: bytes under full keys.
pub mod raw {
    use super::*;

    /// The value of `key`.
    pub fn get(key: &str) -> Result<Option<Vec<u8>>, Failure> {
        if let Some(v) = READ.with(|r| r.borrow().get(key).cloned()) {
            return Ok(v);
        }
        bucket()?.get(key).map_err(|e| failure("get", key, e))
    }

    /// Sets `key` to `value`.
    pub fn set(key: &str, value: &[u8]) -> Result<(), Failure> {
        bucket()?
            .set(key, value)
            .map_err(|e| failure("set", key, e))?;
        remember(key, Some(value));
        Ok(())
    }

    /// Deletes `key` (nothing if absent).
    pub fn delete(key: &str) -> Result<(), Failure> {
        bucket()?
            .delete(key)
            .map_err(|e| failure("delete", key, e))?;
        remember(key, None);
        Ok(())
    }

    /// The values of `keys`, in order, in one call to the host.
    pub fn get_many(keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, Failure> {
        let b = bucket()?;
        let found = batch::get_many(&b, keys).map_err(|e| failure("get-many", "", e))?;
        Ok(found.into_iter().map(|kv| kv.map(|(_, v)| v)).collect())
    }

    /// Sets many keys in one call to the host.
    pub fn set_many(pairs: &[(String, Vec<u8>)]) -> Result<(), Failure> {
        let b = bucket()?;
        batch::set_many(&b, pairs).map_err(|e| failure("set-many", "", e))?;
        for (k, v) in pairs {
            remember(k, Some(v));
        }
        Ok(())
    }

    /// Every key that starts with `prefix`, in byte order. The bucket has
    /// no prefix index: this pages through all its keys (`list-keys`), so
    /// its cost is the bucket's size; keep it for small buckets or rare
    /// events.
    pub fn keys_with_prefix(prefix: &str) -> Result<Vec<String>, Failure> {
        let b = bucket()?;
        let mut out = Vec::new();
        let mut cursor = None;
        loop {
            let page = b
                .list_keys(cursor)
                .map_err(|e| failure("list-keys", prefix, e))?;
            out.extend(page.keys.into_iter().filter(|k| k.starts_with(prefix)));
            match page.cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        // Hosts may list in any order (the CLI's in-memory store does).
        out.sort();
        Ok(out)
    }
}

/// A typed map over the keys that start with `prefix`: values are JSON.
pub struct Map<V> {
    prefix: &'static str,
    _values: PhantomData<fn() -> V>,
}

impl<V: Serialize + DeserializeOwned> Map<V> {
    /// The map of the keys under `prefix` (e.g. `"balance/"`).
    pub const fn new(prefix: &'static str) -> Map<V> {
        Map {
            prefix,
            _values: PhantomData,
        }
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn decode(&self, key: &str, bytes: &[u8]) -> Result<V, Failure> {
        serde_json::from_slice(bytes).map_err(|e| {
            Failure::fatal(format!(
                "the value of key {:?} does not fit this map: {e}",
                self.key(key)
            ))
        })
    }

    fn encode(&self, key: &str, value: &V) -> Result<Vec<u8>, Failure> {
        serde_json::to_vec(value).map_err(|e| {
            Failure::fatal(format!(
                "the value of key {:?} does not serialize: {e}",
                self.key(key)
            ))
        })
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Result<Option<V>, Failure> {
        raw::get(&self.key(key))?
            .map(|b| self.decode(key, &b))
            .transpose()
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &V) -> Result<(), Failure> {
        raw::set(&self.key(key), &self.encode(key, value)?)
    }

    /// Deletes `key`.
    pub fn delete(&self, key: &str) -> Result<(), Failure> {
        raw::delete(&self.key(key))
    }

    /// The values of `keys`, in order, in one call to the host.
    pub fn get_many(&self, keys: &[&str]) -> Result<Vec<Option<V>>, Failure> {
        let full: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        raw::get_many(&full)?
            .into_iter()
            .zip(keys)
            .map(|(v, k)| v.map(|b| self.decode(k, &b)).transpose())
            .collect()
    }

    /// Sets many keys in one call to the host.
    pub fn set_many(&self, pairs: &[(&str, V)]) -> Result<(), Failure> {
        let encoded: Vec<(String, Vec<u8>)> = pairs
            .iter()
            .map(|(k, v)| Ok((self.key(k), self.encode(k, v)?)))
            .collect::<Result<_, Failure>>()?;
        raw::set_many(&encoded)
    }

    /// The entries whose key (after the map's prefix) starts with `prefix`,
    /// in key order. Pages through the whole bucket: see
    /// [`raw::keys_with_prefix`].
    pub fn scan(&self, prefix: &str) -> Result<Vec<(String, V)>, Failure> {
        let keys = raw::keys_with_prefix(&self.key(prefix))?;
        let values = raw::get_many(&keys)?;
        keys.into_iter()
            .zip(values)
            .filter_map(|(k, v)| {
                let short = k[self.prefix.len()..].to_string();
                v.map(|b| self.decode(&short, &b).map(|v| (short, v)))
            })
            .collect()
    }
}
