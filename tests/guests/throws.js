// A processor in plain JavaScript whose fold has a bug: an event with
// `payload.boom` makes it read a property of undefined (a TypeError).
import { defineProcessor } from "@streamhost/guest";

export const processor = defineProcessor({
  slug: "throws",
  version: "1.0.0",
  initialState: () => ({ seen: [] }),
  fold(state, event) {
    if (event.payload.boom) {
      state.missing.deeper = event.offset;
    }
    state.seen.push(event.offset);
  },
});
