//! The order-totals processor: folds `events.example/order-created` events
//! into per-region order counts and totals.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use streamhost_guest::{Context, Event, Failure, Processor};

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Totals {
    pub regions: BTreeMap<String, RegionTotal>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RegionTotal {
    pub orders: u64,
    pub total: f64,
}

#[derive(Deserialize)]
struct OrderCreated {
    region: String,
    total: f64,
}

pub struct OrderTotals;

impl Processor for OrderTotals {
    type State = Totals;
    const SLUG: &'static str = "order-totals";
    const VERSION: &'static str = "1.0.0";
    const CONSUMES: &'static [&'static str] = &["events.example/order-created"];

    fn fold(state: &mut Totals, event: &Event, _ctx: &mut Context) -> Result<(), Failure> {
        let order: OrderCreated = event.payload_as()?;
        let region = state.regions.entry(order.region).or_default();
        region.orders += 1;
        region.total += order.total;
        Ok(())
    }
}

streamhost_guest::processor!(OrderTotals);
