"""A processor whose fold has a bug: an event with `payload.boom` makes it
read a key the state does not have (a KeyError). One with
`payload.remindAfterMs` sets a timer, `payload.cancel` cancels one."""

from streamhost_guest import define_processor


def fold(state, event, ctx):
    if event.payload.get("boom"):
        state["missing"] += event.offset
    state["seen"].append(event.offset)
    if "remindAfterMs" in event.payload:
        ctx.append(f"remind:{event.offset}", ctx.stream.path, "x.y/reminded", {"of": event.offset}).after(
            event.payload["remindAfterMs"]
        ).typed("Remind").in_group("g")
    if "cancel" in event.payload:
        ctx.cancel(event.payload["cancel"])


Processor = define_processor(slug="raises", version="1.0.0", initial_state=lambda: {"seen": []}, fold=fold)
