//! Reminder: an order not paid within its time gets a reminder, and a
//! payment cancels it. A timer is a delayed `append` to the processor's own
//! stream; its event arrives at or after its time, exactly once, and this
//! fold acts on it. The time is counted from the order's `createdAt`, so a
//! refold, `verify` or a shadow computes the same timers.
//!
//! - `orders.example/order-placed` `{"orderId", "remindAfterMs"?}` (default
//!   30 minutes) sets the timer `reminder:<orderId>`;
//! - `orders.example/order-paid` `{"orderId"}` cancels it;
//! - `orders.example/payment-reminder-due` `{"orderId"}` is the timer's
//!   event: an order still unpaid counts as reminded.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use streamhost_guest::{Context, Event, Failure, Processor};

/// An order's reminder, when none is asked for.
pub const REMIND_AFTER: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Orders {
    /// Unpaid orders: when each was placed (ms since the epoch).
    pub unpaid: BTreeMap<String, u64>,
    /// Orders paid.
    pub paid: u64,
    /// Orders reminded, in the order their reminders came due.
    pub reminded: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Order {
    order_id: String,
    remind_after_ms: Option<u64>,
}

pub struct Reminder;

impl Processor for Reminder {
    type State = Orders;
    const SLUG: &'static str = "reminder";
    const VERSION: &'static str = "1.0.0";
    const CONSUMES: &'static [&'static str] = &[
        "orders.example/order-placed",
        "orders.example/order-paid",
        "orders.example/payment-reminder-due",
    ];

    fn fold(state: &mut Orders, event: &Event, ctx: &mut Context) -> Result<(), Failure> {
        let order: Order = event.payload_as()?;
        let timer = format!("reminder:{}", order.order_id);
        match event.event_type.as_str() {
            "orders.example/order-placed" => {
                state
                    .unpaid
                    .insert(order.order_id.clone(), event.created_ms());
                let after = order
                    .remind_after_ms
                    .map_or(REMIND_AFTER, Duration::from_millis);
                let own = ctx.stream.path.clone();
                ctx.append(
                    timer,
                    &own,
                    "orders.example/payment-reminder-due",
                    &serde_json::json!({"orderId": order.order_id}),
                )
                .after(after)
                .typed("PaymentReminder");
            }
            "orders.example/order-paid" => {
                if state.unpaid.remove(&order.order_id).is_some() {
                    state.paid += 1;
                }
                ctx.cancel(timer);
            }
            _ => {
                // The timer's own event (`source.effect` names it): acted on
                // only if the order is still unpaid.
                if event.effect_key() == Some(timer.as_str())
                    && state.unpaid.contains_key(&order.order_id)
                {
                    state.reminded.push(order.order_id);
                }
            }
        }
        Ok(())
    }
}

streamhost_guest::processor!(Reminder);
