// Keyed state: per-key entries beside the JSON state, for processors whose
// state outgrows one JSON text (a balance per account, a record per order).
// A wake reads and writes only the keys it touches.
//
// The entries live in the processor's bucket (`wasi:keyvalue`, opened with
// `open("")`): as of the checkpoint, plus this fold's own writes, which
// commit with the new checkpoint and state, or not at all. A `KeyedMap` is
// a typed view of the keys under one prefix, its values JSON. Keys are at
// most 1 KiB (prefix included), values at most 1 MiB.
//
//   import { KeyedMap } from "@streamhost/guest/keyed";
//   const balances = new KeyedMap("balance/");
//   balances.set("acct-1", (balances.get("acct-1") ?? 0) + 250);

import { open } from "wasi:keyvalue/store@0.2.0-draft";
import { getMany, setMany } from "wasi:keyvalue/batch@0.2.0-draft";
import { Failure } from "./index.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

// The bucket, opened once per guest call (the host gives each call a fresh
// instance, so the handle never outlives its call), and the values read
// ahead for this call, kept up to date by its writes.
let bucket;
const read = new Map();

function failure(what, key, e) {
  const tag = e?.payload?.tag ?? e?.tag;
  if (tag === "no-such-store") return Failure.fatal("the host has no keyed state for this call");
  if (tag === "access-denied") return Failure.fatal("the keyed state is open only during fold");
  const message = e?.payload?.val ?? e?.val ?? e?.message ?? String(e);
  // A bound (key or value size): the same events give the same error.
  return Failure.fatal(`${what} ${JSON.stringify(key)}: ${message}`);
}

function theBucket() {
  if (bucket === undefined) {
    try {
      bucket = open("");
    } catch (e) {
      throw failure("open", "", e);
    }
  }
  return bucket;
}

function remember(key, value) {
  if (read.has(key)) read.set(key, value);
}

/** Raw access to the bucket: bytes (`Uint8Array`) under full keys. */
export const raw = {
  get(key) {
    if (read.has(key)) return read.get(key);
    try {
      return theBucket().get(key);
    } catch (e) {
      throw failure("get", key, e);
    }
  },
  set(key, value) {
    try {
      theBucket().set(key, value);
    } catch (e) {
      throw failure("set", key, e);
    }
    remember(key, value);
  },
  delete(key) {
    try {
      theBucket().delete(key);
    } catch (e) {
      throw failure("delete", key, e);
    }
    remember(key, undefined);
  },
  getMany(keys) {
    let found;
    try {
      found = getMany(theBucket(), keys);
    } catch (e) {
      throw failure("get-many", "", e);
    }
    return found.map((kv) => (kv === undefined ? undefined : kv[1]));
  },
  setMany(pairs) {
    try {
      setMany(theBucket(), pairs);
    } catch (e) {
      throw failure("set-many", "", e);
    }
    for (const [k, v] of pairs) remember(k, v);
  },
  /**
   * Every key that starts with `prefix`, in byte order. The bucket has no
   * prefix index: this pages through all its keys, so its cost is the
   * bucket's size.
   */
  keysWithPrefix(prefix) {
    const out = [];
    let cursor;
    for (;;) {
      let page;
      try {
        page = theBucket().listKeys(cursor);
      } catch (e) {
        throw failure("list-keys", prefix, e);
      }
      for (const k of page.keys) if (k.startsWith(prefix)) out.push(k);
      if (page.cursor === undefined) break;
      cursor = page.cursor;
    }
    return out.sort(byBytes);
  },
};

function byBytes(a, b) {
  const x = encoder.encode(a);
  const y = encoder.encode(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    if (x[i] !== y[i]) return x[i] - y[i];
  }
  return x.length - y.length;
}

/**
 * Reads `keys` in one call to the host and keeps their values for this
 * call's `get`s (the SDK does it with the keys a processor's `prefetch`
 * names for a batch).
 */
export function prefetch(keys) {
  if (keys.length === 0) return;
  const values = raw.getMany(keys);
  keys.forEach((k, i) => read.set(k, values[i]));
}
globalThis.__streamhostPrefetch = prefetch;

/** A typed map over the keys that start with `prefix`: values are JSON. */
export class KeyedMap {
  constructor(prefix) {
    this.prefix = String(prefix);
  }

  #key(key) {
    return this.prefix + key;
  }

  #decode(key, bytes) {
    try {
      return JSON.parse(decoder.decode(bytes));
    } catch (e) {
      throw Failure.fatal(`the value of key ${JSON.stringify(this.#key(key))} does not fit this map: ${e.message}`);
    }
  }

  #encode(key, value) {
    const text = JSON.stringify(value);
    if (text === undefined) {
      throw Failure.fatal(`the value of key ${JSON.stringify(this.#key(key))} is not a JSON value`);
    }
    return encoder.encode(text);
  }

  /** The value of `key`, or `undefined`. */
  get(key) {
    const bytes = raw.get(this.#key(key));
    return bytes === undefined ? undefined : this.#decode(key, bytes);
  }

  /** Sets `key` to `value`. */
  set(key, value) {
    raw.set(this.#key(key), this.#encode(key, value));
  }

  /** Deletes `key` (nothing if absent). */
  delete(key) {
    raw.delete(this.#key(key));
  }

  /** The values of `keys`, in order, in one call to the host. */
  getMany(keys) {
    return raw
      .getMany(keys.map((k) => this.#key(k)))
      .map((bytes, i) => (bytes === undefined ? undefined : this.#decode(keys[i], bytes)));
  }

  /** Sets many `[key, value]` pairs in one call to the host. */
  setMany(pairs) {
    raw.setMany(pairs.map(([k, v]) => [this.#key(k), this.#encode(k, v)]));
  }

  /**
   * The `[key, value]` entries whose key (after the map's prefix) starts
   * with `prefix`, in key order. Pages through the whole bucket.
   */
  scan(prefix = "") {
    const keys = raw.keysWithPrefix(this.#key(prefix));
    const values = raw.getMany(keys);
    const out = [];
    keys.forEach((k, i) => {
      if (values[i] !== undefined) {
        const short = k.slice(this.prefix.length);
        out.push([short, this.#decode(short, values[i])]);
      }
    });
    return out;
  }
}
