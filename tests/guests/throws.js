// A processor in plain JavaScript whose fold has bugs: an event with
// `payload.boom` makes it read a property of undefined (a TypeError), one
// with `payload.shapeless` makes it return a function as the new state.
// One with `payload.remindAfterMs` sets a timer, `payload.cancel` cancels one.
import { defineProcessor } from "@streamhost/guest";

export const processor = defineProcessor({
  slug: "throws",
  version: "1.0.0",
  initialState: () => ({ seen: [] }),
  fold(state, event, ctx) {
    if (event.payload.boom) {
      state.missing.deeper = event.offset;
    }
    if (event.payload.shapeless) {
      return () => event.offset;
    }
    state.seen.push(event.offset);
    if (event.payload.remindAfterMs !== undefined) {
      ctx.append(`remind:${event.offset}`, ctx.stream.path, "x.y/reminded", { of: event.offset })
        .after(event.payload.remindAfterMs)
        .typed("Remind")
        .inGroup("g");
    }
    if (event.payload.cancel !== undefined) ctx.cancel(event.payload.cancel);
  },
});
