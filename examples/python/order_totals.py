"""The order-totals processor: folds `events.example/order-created` events
into per-region order counts and totals, kept in keyed state (one key per
region, so a wake touches only the regions its orders name), and acts on
each order after the fold commits:

- an `append` effect confirms the order on `/orders/confirmed`
  (`events.example/order-confirmed` with the region's running total);
- a `webhook` effect POSTs the order to the URL set by the last
  `events.example/order-webhook-set` `{"url": ...}` event, if any.

Effects are keyed by the order's `orderId`, so a refold, a retry or a
backfill never confirms or notifies an order twice."""

from streamhost_guest import Failure, define_processor
from streamhost_guest.keyed import KeyedMap

ORDER_CREATED = "events.example/order-created"
WEBHOOK_SET = "events.example/order-webhook-set"

regions = KeyedMap("region/")


def order(event):
    p = event.payload if isinstance(event.payload, dict) else {}
    region, total = p.get("region"), p.get("total")
    if not isinstance(region, str) or isinstance(total, bool) or not isinstance(total, (int, float)):
        raise Failure.fatal(f"the order at offset {event.offset} needs a string region and a numeric total")
    return region, total, p.get("orderId")


def prefetch(event):
    # Every region a batch's orders name is read in one call to the host.
    region = event.payload.get("region") if isinstance(event.payload, dict) else None
    return [f"region/{region}"] if event.type == ORDER_CREATED and isinstance(region, str) else []


def fold(state, event, ctx):
    if event.type == WEBHOOK_SET:
        url = event.payload.get("url") if isinstance(event.payload, dict) else None
        if isinstance(url, str):
            state["webhook"] = url
        else:
            state.pop("webhook", None)
        return
    region_name, total, order_id = order(event)
    region = regions.get(region_name) or {"orders": 0, "total": 0}
    region["orders"] += 1
    region["total"] += total
    regions.set(region_name, region)
    state["orders"] += 1
    if order_id is not None:
        confirmed = {"orderId": order_id, "region": region_name, "total": total, "regionTotal": region["total"]}
        ctx.append(f"confirm:{order_id}", "/orders/confirmed", "events.example/order-confirmed", confirmed)
        if "webhook" in state:
            ctx.webhook(f"notify:{order_id}", state["webhook"], confirmed)


Processor = define_processor(
    slug="order-totals",
    version="1.1.0",
    consumes=[ORDER_CREATED, WEBHOOK_SET],
    initial_state=lambda: {"orders": 0},
    prefetch=prefetch,
    fold=fold,
)
