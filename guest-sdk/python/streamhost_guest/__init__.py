"""streamhost-guest: write a streamhost processor or reactor in Python.

The SDK wraps the bindings that componentize-py generates from `wit/` (the
world `stream-processor` or `stream-reactor`): no private ABI, so a guest
built without it works the same. An app module defines `Processor` (or
`Reactor`), which componentize-py exports::

    from streamhost_guest import define_processor

    def fold(state, event, ctx):
        state["events"] += 1

    Processor = define_processor(
        slug="counter", version="1.0.0",
        initial_state=lambda: {"events": 0},
        fold=fold,
    )

Build it with ``python -m streamhost_guest build app -o app.wasm``.
"""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Optional

#: The prefix of the platform's own event types.
PLATFORM_TYPE_PREFIX = "events.iterate.com/"

#: The WIT the SDK is built against (a copy of the repository's `wit/`).
WIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wit")


class Failure(Exception):
    """A failed fold or reaction.

    Retryable failures are retried with backoff; others halt the
    subscription (a reactor's fail the append). Any other exception a fold
    raises is a fatal failure whose message is the exception and its
    traceback.
    """

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.message = message
        self.retryable = retryable

    @classmethod
    def retry(cls, message: str) -> "Failure":
        """A failure worth retrying (a passing condition)."""
        return cls(message, retryable=True)

    @classmethod
    def fatal(cls, message: str) -> "Failure":
        """A failure retrying cannot cure (bad data, a bug): the subscription halts."""
        return cls(message, retryable=False)


@dataclass(slots=True)
class Event:
    """One committed event, as the HTTP API serves it, its payload parsed."""

    offset: int
    type: str
    payload: Any
    created_at: str = ""
    metadata: Any = None
    idempotency_key: Optional[str] = None
    source: Any = None
    # Set when its payload and metadata were erased (`:redact`):
    # {"at", "reason"}; its payload is then None.
    redacted: Optional[dict] = None

    @property
    def is_redacted(self) -> bool:
        """Whether its payload and metadata were erased (`:redact`)."""
        return self.redacted is not None

    @property
    def created_ms(self) -> int:
        """When it was committed, in milliseconds since the epoch (0 if not a time)."""
        return _created_ms(self.created_at)

    @property
    def effect_key(self) -> Optional[str]:
        """The key of the effect that appended it (a timer's, say), if an effect did."""
        effect = (self.source or {}).get("effect") if isinstance(self.source, dict) else None
        return effect.get("key") if isinstance(effect, dict) else None

    @staticmethod
    def of(raw: dict) -> "Event":
        return Event(
            offset=raw["offset"],
            type=raw["type"],
            payload=raw.get("payload"),
            created_at=raw.get("createdAt", ""),
            metadata=raw.get("metadata"),
            idempotency_key=raw.get("idempotencyKey"),
            source=raw.get("source"),
            redacted=raw.get("redacted"),
        )


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _created_ms(created_at: str) -> int:
    try:
        return (datetime.fromisoformat(created_at.replace("Z", "+00:00")) - _EPOCH) // timedelta(milliseconds=1)
    except (ValueError, TypeError, AttributeError):
        return 0


def _millis(ms: Any, what: str) -> int:
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms < 0:
        raise Failure.fatal(f"{what} must be a non-negative number of milliseconds, not {ms!r}")
    return int(ms)


def _json_text(value: Any, what: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise Failure.fatal(f"{what} is not a JSON value: {e}") from None


@dataclass(slots=True)
class AskedEffect:
    """The effect just asked for: give it a time and an envelope."""

    key: str
    target: tuple
    created_at: str = ""
    not_before: Optional[int] = None
    type: Optional[str] = None
    metadata: Optional[str] = None
    group: Optional[str] = None

    def after(self, ms: int) -> "AskedEffect":
        """Not before `ms` milliseconds after the event being folded (its
        `createdAt`: refolds and shadows compute the same time). A delayed
        `append` to the processor's own stream is a timer."""
        self.not_before = _created_ms(self.created_at) + _millis(ms, "after()")
        return self

    def at(self, ms: int) -> "AskedEffect":
        """Not before `ms` milliseconds since the epoch (in the past: at once)."""
        self.not_before = _millis(ms, "at()")
        return self

    def in_group(self, group: str) -> "AskedEffect":
        """Its ordering group (kept and served with the effect)."""
        self.group = str(group)
        return self

    def typed(self, effect_type: str) -> "AskedEffect":
        """Its type (`SendWelcome`)."""
        self.type = str(effect_type)
        return self

    def with_metadata(self, metadata: dict) -> "AskedEffect":
        """Its metadata, a JSON object."""
        self.metadata = _json_text(metadata, "an effect's metadata")
        return self


@dataclass
class Effects:
    """Effects to run after the commit, each with a key that makes it idempotent."""

    asked: list = field(default_factory=list)
    #: The `createdAt` of the event being folded (read only when asked).
    created_at: str = ""

    @property
    def now_ms(self) -> int:
        """The time of the event being folded (ms since the epoch, its `createdAt`)."""
        return _created_ms(self.created_at)

    def _ask(self, key: str, target: tuple) -> AskedEffect:
        if not isinstance(key, str) or not key:
            raise Failure.fatal(f"an effect's key must be a non-empty string, not {key!r}")
        asked = AskedEffect(key, target, self.created_at)
        self.asked.append(asked)
        return asked

    def cancel(self, key: str) -> AskedEffect:
        """Cancel this processor's (or reactor's) effect `key` on this stream if
        it is still pending (a timer not yet due, say); of a running, settled
        or unknown one it does nothing. Its own key is `cancel:<key>`."""
        return self._ask(f"cancel:{key}", ("cancel", str(key)))

    def append(self, key: str, stream_path: str, type: str, payload: Any) -> AskedEffect:
        """Append an event to a stream of the same project after the commit."""
        return self._ask(key, ("append", stream_path, type, _json_text(payload, "an append effect's payload")))

    def webhook(self, key: str, url: str, body: Any) -> AskedEffect:
        """POST a JSON body to a URL after the commit."""
        return self._ask(key, ("webhook", url, _json_text(body, "a webhook effect's body")))

    def itx(self, key: str, expression: Any, args: Any) -> AskedEffect:
        """Call an ITX expression (`["components", ["get", NAME], FUNCTION]`) after the commit."""
        return self._ask(
            key,
            ("itx", _json_text(expression, "an ITX effect's expression"), _json_text(args, "an ITX effect's arguments")),
        )

    def __len__(self) -> int:
        return len(self.asked)


@dataclass
class Context(Effects):
    """What a fold may use besides the state: the stream, and effects."""

    stream: Any = None


def failure_text(e: BaseException) -> tuple[str, bool]:
    """The message and retryability of anything a fold or reaction raised."""
    if isinstance(e, Failure):
        return e.message, e.retryable
    # A bug: the same events raise the same way, so retrying cannot cure it.
    # The message leads with the exception and where it was raised.
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if os.path.dirname(os.path.abspath(f.filename)) != os.path.dirname(WIT)]
    where = ours[-1] if ours else (frames[-1] if frames else None)
    head = f"{type(e).__name__}: {e}"
    if where is not None:
        head += f" (at {os.path.basename(where.filename)}:{where.lineno})"
    shown = ours or frames
    trace = "Traceback (most recent call last):\n" + "".join(traceback.format_list(shown))
    trace += "".join(traceback.format_exception_only(e)).rstrip()
    return f"{head}\n{trace}", False


def _wit_target(w, target: tuple):
    kind = target[0]
    if kind == "append":
        return w.EffectTarget_Append(w.AppendEffect(stream_path=target[1], type=target[2], payload=target[3], metadata=None))
    if kind == "webhook":
        return w.EffectTarget_Webhook(w.WebhookEffect(url=target[1], body=target[2]))
    if kind == "cancel":
        return w.EffectTarget_Cancel(target[1])
    return w.EffectTarget_Itx(w.ItxEffect(expression=target[1], args=target[2]))


def _wit_effect(w, a: AskedEffect):
    return w.Effect(
        key=a.key,
        target=_wit_target(w, a.target),
        not_before=a.not_before,
        type=a.type,
        metadata=a.metadata,
        group=a.group,
    )


def _err(w, e: BaseException):
    from componentize_py_types import Err

    message, retryable = failure_text(e)
    return Err(w.Failure(message=message, retryable=retryable))


def _parse(text: str, what: str):
    try:
        return json.loads(text)
    except ValueError as e:
        raise Failure.fatal(f"{what}: {e}") from None


def _bindings(world: str):
    """The generated bindings of export `world`, imported now: at build
    time, when the component's initial memory is snapshotted, so that no
    call of a fresh instance imports them (creating their classes costs
    each call about a millisecond otherwise). None outside a component."""
    try:
        if world == "processor":
            from wit_world.exports import processor as w
        else:
            from wit_world.exports import reactor as w
        return w
    except ImportError:
        return None


def define_processor(
    *,
    slug: str,
    version: str,
    initial_state: Callable[[], Any],
    fold: Callable[[Any, Event, Context], Any],
    consumes: Iterable[str] = (),
    platform_events: bool = False,
    prefetch: Optional[Callable[[Event], Iterable[str]]] = None,
):
    """The `Processor` class componentize-py exports (world `stream-processor`).

    `fold(state, event, ctx)` returns the new state, or changes `state` in
    place and returns None. `consumes` names the event types to fold (empty:
    all but the platform's); `platform_events` folds the platform's too;
    `prefetch(event)` names the keyed-state keys folding `event` will read.
    """
    consumes = [str(c) for c in consumes]
    if not callable(fold) or not callable(initial_state):
        raise TypeError("define_processor needs callables for initial_state and fold")

    def folds(e: Event) -> bool:
        return platform_events or not e.type.startswith(PLATFORM_TYPE_PREFIX) or e.type in consumes

    _bindings("processor")
    if prefetch is not None:
        from . import keyed  # noqa: F401  (in the snapshot too)

    class Processor:
        def describe(self):
            from wit_world.exports import processor as w

            return w.Announcement(slug=slug, version=version, consumes=consumes)

        def initial_state(self) -> str:
            return _json_text(initial_state(), "the initial state")

        def fold(self, state_text: str, batch):
            from wit_world.exports import processor as w

            try:
                state = _parse(state_text, "the stored state is not JSON")
                raw = _parse(batch.events, "the batch's events are not the JSON array the host sends")
                events = [e for e in map(Event.of, raw) if folds(e)]
                if prefetch is not None:
                    keys = sorted({str(k) for e in events for k in (prefetch(e) or ())})
                    if keys:
                        from . import keyed

                        keyed.prefetch(keys)
                ctx = Context(stream=batch.stream)
                for event in events:
                    ctx.created_at = event.created_at
                    new = fold(state, event, ctx)
                    if new is not None:
                        state = new
                effects = [_wit_effect(w, a) for a in ctx.asked]
                return w.Folded(state=_json_text(state, "the state"), effects=effects)
            except Exception as e:
                raise _err(w, e) from None

    return Processor


def define_reactor(*, react: Callable[[Event, Effects], None]):
    """The `Reactor` class componentize-py exports (world `stream-reactor`).

    `react(event, effects)`: the effects of one appended event, committed
    with it; an exception fails the append (`422 reactor-failed`).
    """
    if not callable(react):
        raise TypeError("define_reactor needs a callable react")
    _bindings("reactor")

    class Reactor:
        def react(self, event_text: str):
            from wit_world.exports import reactor as w

            try:
                event = Event.of(_parse(event_text, "the event is not the JSON object the host sends"))
                effects = Effects(created_at=event.created_at)
                react(event, effects)
                return [_wit_effect(w, a) for a in effects.asked]
            except Exception as e:
                raise _err(w, e) from None

    return Reactor
