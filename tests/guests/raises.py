"""A processor whose fold has a bug: an event with `payload.boom` makes it
read a key the state does not have (a KeyError)."""

from streamhost_guest import define_processor


def fold(state, event, ctx):
    if event.payload.get("boom"):
        state["missing"] += event.offset
    state["seen"].append(event.offset)


Processor = define_processor(slug="raises", version="1.0.0", initial_state=lambda: {"seen": []}, fold=fold)
