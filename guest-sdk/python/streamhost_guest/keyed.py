"""Keyed state: per-key entries beside the JSON state.

For processors whose state outgrows one JSON text (a balance per account, a
record per order): a wake reads and writes only the keys it touches. The
entries live in the processor's bucket (`wasi:keyvalue`, opened with
`open("")`): as of the checkpoint, plus this fold's own writes, which commit
with the new checkpoint and state, or not at all. A `KeyedMap` is a typed
view of the keys under one prefix, its values JSON. Keys are at most 1 KiB
(prefix included), values at most 1 MiB::

    from streamhost_guest.keyed import KeyedMap

    balances = KeyedMap("balance/")
    balances.set("acct-1", (balances.get("acct-1") or 0) + 250)
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional

from componentize_py_types import Err
from wit_world.imports import batch, store

from . import Failure

# The bucket, opened once per guest call (the host gives each call a fresh
# instance), and the values read ahead for this call, kept up to date by
# its writes.
_bucket = None
_read: dict[str, Optional[bytes]] = {}


def _failure(what: str, key: str, e: BaseException) -> Failure:
    value = getattr(e, "value", e)
    if isinstance(value, store.Error_NoSuchStore):
        return Failure.fatal("the host has no keyed state for this call")
    if isinstance(value, store.Error_AccessDenied):
        return Failure.fatal("the keyed state is open only during fold")
    message = getattr(value, "value", value)
    # A bound (key or value size): the same events give the same error.
    return Failure.fatal(f"{what} {json.dumps(key)}: {message}")


def _the_bucket():
    global _bucket
    if _bucket is None:
        try:
            _bucket = store.open("")
        except Err as e:
            raise _failure("open", "", e) from None
    return _bucket


def _remember(key: str, value: Optional[bytes]) -> None:
    if key in _read:
        _read[key] = value


class raw:
    """Raw access to the bucket: bytes under full keys."""

    @staticmethod
    def get(key: str) -> Optional[bytes]:

        if key in _read:
            return _read[key]
        try:
            return _the_bucket().get(key)
        except Err as e:
            raise _failure("get", key, e) from None

    @staticmethod
    def set(key: str, value: bytes) -> None:

        try:
            _the_bucket().set(key, value)
        except Err as e:
            raise _failure("set", key, e) from None
        _remember(key, value)

    @staticmethod
    def delete(key: str) -> None:

        try:
            _the_bucket().delete(key)
        except Err as e:
            raise _failure("delete", key, e) from None
        _remember(key, None)

    @staticmethod
    def get_many(keys: list[str]) -> list[Optional[bytes]]:

        try:
            found = batch.get_many(_the_bucket(), keys)
        except Err as e:
            raise _failure("get-many", "", e) from None
        return [None if kv is None else kv[1] for kv in found]

    @staticmethod
    def set_many(pairs: list[tuple[str, bytes]]) -> None:

        try:
            batch.set_many(_the_bucket(), pairs)
        except Err as e:
            raise _failure("set-many", "", e) from None
        for k, v in pairs:
            _remember(k, v)

    @staticmethod
    def keys_with_prefix(prefix: str) -> list[str]:
        """Every key that starts with `prefix`, in byte order.

        The bucket has no prefix index: this pages through all its keys, so
        its cost is the bucket's size.
        """

        out: list[str] = []
        cursor = None
        while True:
            try:
                page = _the_bucket().list_keys(cursor)
            except Err as e:
                raise _failure("list-keys", prefix, e) from None
            out.extend(k for k in page.keys if k.startswith(prefix))
            if page.cursor is None:
                break
            cursor = page.cursor
        return sorted(out, key=lambda k: k.encode())


def prefetch(keys: list[str]) -> None:
    """Reads `keys` in one call to the host and keeps them for this call's gets."""
    if keys:
        _read.update(zip(keys, raw.get_many(keys)))


class KeyedMap:
    """A typed map over the keys that start with `prefix`: values are JSON."""

    def __init__(self, prefix: str):
        self.prefix = str(prefix)

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _decode(self, key: str, data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError as e:
            raise Failure.fatal(f"the value of key {json.dumps(self._key(key))} does not fit this map: {e}") from None

    def _encode(self, key: str, value: Any) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise Failure.fatal(f"the value of key {json.dumps(self._key(key))} is not a JSON value: {e}") from None

    def get(self, key: str) -> Any:
        """The value of `key`, or None."""
        data = raw.get(self._key(key))
        return None if data is None else self._decode(key, data)

    def set(self, key: str, value: Any) -> None:
        """Sets `key` to `value`."""
        raw.set(self._key(key), self._encode(key, value))

    def delete(self, key: str) -> None:
        """Deletes `key` (nothing if absent)."""
        raw.delete(self._key(key))

    def get_many(self, keys: list[str]) -> list[Any]:
        """The values of `keys`, in order, in one call to the host."""
        values = raw.get_many([self._key(k) for k in keys])
        return [None if v is None else self._decode(k, v) for k, v in zip(keys, values)]

    def set_many(self, pairs: Iterable[tuple[str, Any]]) -> None:
        """Sets many `(key, value)` pairs in one call to the host."""
        raw.set_many([(self._key(k), self._encode(k, v)) for k, v in pairs])

    def scan(self, prefix: str = "") -> list[tuple[str, Any]]:
        """The `(key, value)` entries under `prefix` (after the map's), in key order."""
        keys = raw.keys_with_prefix(self._key(prefix))
        values = raw.get_many(keys)
        out = []
        for k, v in zip(keys, values):
            if v is not None:
                short = k[len(self.prefix) :]
                out.append((short, self._decode(short, v)))
        return out
