// Keyed state over `wasi:keyvalue` (see keyed.js).

/** Raw access to the bucket: bytes under full keys. */
export declare const raw: {
  get(key: string): Uint8Array | undefined;
  set(key: string, value: Uint8Array): void;
  delete(key: string): void;
  getMany(keys: string[]): Array<Uint8Array | undefined>;
  setMany(pairs: Array<[string, Uint8Array]>): void;
  /** Every key that starts with `prefix`, in byte order (pages through the bucket). */
  keysWithPrefix(prefix: string): string[];
};

/** Reads `keys` in one call to the host for this call's `get`s. */
export declare function prefetch(keys: string[]): void;

/** A typed map over the keys that start with `prefix`: values are JSON. */
export declare class KeyedMap<V> {
  constructor(prefix: string);
  readonly prefix: string;
  get(key: string): V | undefined;
  set(key: string, value: V): void;
  delete(key: string): void;
  getMany(keys: string[]): Array<V | undefined>;
  setMany(pairs: Array<[string, V]>): void;
  /** The `[key, value]` entries under `prefix` (after the map's), in key order. */
  scan(prefix?: string): Array<[string, V]>;
}
