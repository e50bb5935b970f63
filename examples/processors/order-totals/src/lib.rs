//! The order-totals processor: folds `events.example/order-created` events
//! into per-region order counts and totals, and acts on each order after
//! the fold commits (effects):
//!
//! - an `append` effect confirms the order on `/orders/confirmed`
//!   (`events.example/order-confirmed` with the region's running total);
//! - a `webhook` effect POSTs the order to the URL set by the last
//!   `events.example/order-webhook-set` `{"url": ...}` event, if any.
//!
//! Effects are keyed by the order's `orderId`, so a refold, a retry or a
//! backfill never confirms or notifies an order twice. An order without an
//! `orderId` is counted and has no effects.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::json;
use streamhost_guest::{Context, Event, Failure, Processor};

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Totals {
    pub regions: BTreeMap<String, RegionTotal>,
    /// Where orders are POSTed (`events.example/order-webhook-set`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RegionTotal {
    pub orders: u64,
    pub total: f64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OrderCreated {
    region: String,
    total: f64,
    #[serde(default)]
    order_id: Option<String>,
}

#[derive(Deserialize)]
struct WebhookSet {
    url: Option<String>,
}

pub const ORDER_CREATED: &str = "events.example/order-created";
pub const WEBHOOK_SET: &str = "events.example/order-webhook-set";

pub struct OrderTotals;

impl Processor for OrderTotals {
    type State = Totals;
    const SLUG: &'static str = "order-totals";
    const VERSION: &'static str = "1.1.0";
    const CONSUMES: &'static [&'static str] = &[ORDER_CREATED, WEBHOOK_SET];

    fn fold(state: &mut Totals, event: &Event, ctx: &mut Context) -> Result<(), Failure> {
        if event.event_type == WEBHOOK_SET {
            state.webhook = event.payload_as::<WebhookSet>()?.url;
            return Ok(());
        }
        let order: OrderCreated = event.payload_as()?;
        let region = state.regions.entry(order.region.clone()).or_default();
        region.orders += 1;
        region.total += order.total;
        if let Some(id) = order.order_id {
            let confirmed = json!({"orderId": id, "region": order.region,
                "total": order.total, "regionTotal": region.total});
            ctx.append(
                format!("confirm:{id}"),
                "/orders/confirmed",
                "events.example/order-confirmed",
                &confirmed,
            );
            if let Some(url) = &state.webhook {
                ctx.webhook(format!("notify:{id}"), url, &confirmed);
            }
        }
        Ok(())
    }
}

streamhost_guest::processor!(OrderTotals);
