// The counter processor: counts every event of its stream and sums the
// numeric `payload.n` fields (the Rust counter's port: same states).
import { defineProcessor } from "@streamhost/guest";

interface Count {
  events: number;
  sum: number;
  last_offset: number;
}

export const processor = defineProcessor<Count>({
  slug: "counter",
  version: "1.0.0",
  // Every event of the stream, the platform's included.
  platformEvents: true,
  initialState: () => ({ events: 0, sum: 0, last_offset: 0 }),
  fold(state, event) {
    state.events += 1;
    const n = event.payload?.n;
    state.sum += Number.isInteger(n) ? n : 0;
    state.last_offset = event.offset;
  },
});
