// A processor in plain JavaScript whose fold has bugs: an event with
// `payload.boom` makes it read a property of undefined (a TypeError), one
// with `payload.shapeless` makes it return a function as the new state.
import { defineProcessor } from "@streamhost/guest";

export const processor = defineProcessor({
  slug: "throws",
  version: "1.0.0",
  initialState: () => ({ seen: [] }),
  fold(state, event) {
    if (event.payload.boom) {
      state.missing.deeper = event.offset;
    }
    if (event.payload.shapeless) {
      return () => event.offset;
    }
    state.seen.push(event.offset);
  },
});
