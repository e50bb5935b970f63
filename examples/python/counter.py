"""The counter processor: counts every event of its stream and sums the
numeric `payload.n` fields (the Rust counter's port: same states)."""

from streamhost_guest import define_processor


def fold(state, event, ctx):
    state["events"] += 1
    n = event.payload.get("n") if isinstance(event.payload, dict) else None
    state["sum"] += n if isinstance(n, int) and not isinstance(n, bool) else 0
    state["last_offset"] = event.offset


Processor = define_processor(
    slug="counter",
    version="1.0.0",
    # Every event of the stream, the platform's included.
    platform_events=True,
    initial_state=lambda: {"events": 0, "sum": 0, "last_offset": 0},
    fold=fold,
)
