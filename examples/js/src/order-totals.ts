// The order-totals processor: folds `events.example/order-created` events
// into per-region order counts and totals, kept in keyed state (one key per
// region, so a wake touches only the regions its orders name), and acts on
// each order after the fold commits:
//
// - an `append` effect confirms the order on `/orders/confirmed`
//   (`events.example/order-confirmed` with the region's running total);
// - a `webhook` effect POSTs the order to the URL set by the last
//   `events.example/order-webhook-set` `{"url": ...}` event, if any.
//
// Effects are keyed by the order's `orderId`, so a refold, a retry or a
// backfill never confirms or notifies an order twice.
import { defineProcessor, Failure, type Event } from "@streamhost/guest";
import { KeyedMap } from "@streamhost/guest/keyed";

export const ORDER_CREATED = "events.example/order-created";
export const WEBHOOK_SET = "events.example/order-webhook-set";

interface State {
  orders: number;
  webhook?: string;
}

interface RegionTotal {
  orders: number;
  total: number;
}

interface OrderCreated {
  region: string;
  total: number;
  orderId?: string;
}

const regions = new KeyedMap<RegionTotal>("region/");

function order(event: Event): OrderCreated {
  const p = event.payload;
  if (typeof p?.region !== "string" || typeof p?.total !== "number") {
    throw Failure.fatal(`the order at offset ${event.offset} needs a string region and a numeric total`);
  }
  return p;
}

export const processor = defineProcessor<State>({
  slug: "order-totals",
  version: "1.1.0",
  consumes: [ORDER_CREATED, WEBHOOK_SET],
  initialState: () => ({ orders: 0 }),
  // Every region a batch's orders name is read in one call to the host.
  prefetch: (event) => (event.type === ORDER_CREATED && typeof event.payload?.region === "string" ? [`region/${event.payload.region}`] : []),
  fold(state, event, ctx) {
    if (event.type === WEBHOOK_SET) {
      state.webhook = typeof event.payload?.url === "string" ? event.payload.url : undefined;
      return;
    }
    const o = order(event);
    const region = regions.get(o.region) ?? { orders: 0, total: 0 };
    region.orders += 1;
    region.total += o.total;
    regions.set(o.region, region);
    state.orders += 1;
    if (o.orderId !== undefined) {
      const confirmed = { orderId: o.orderId, region: o.region, total: o.total, regionTotal: region.total };
      ctx.append(`confirm:${o.orderId}`, "/orders/confirmed", "events.example/order-confirmed", confirmed);
      if (state.webhook !== undefined) {
        ctx.webhook(`notify:${o.orderId}`, state.webhook, confirmed);
      }
    }
  },
});
