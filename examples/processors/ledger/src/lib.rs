//! A ledger: a balance per account, kept in keyed state (one key per
//! account, `balance/<account>`), so a wake costs the accounts its events
//! touch, however many accounts there are. The JSON state keeps only the
//! totals.
//!
//! Events:
//! - `deposited {account, cents}` and `withdrawn {account, cents}`; a
//!   withdrawal past the balance fails the fold (not retryable), and
//!   nothing the batch wrote is kept;
//! - `imported {from, count, cents}`: accounts `acct-<from>` ..
//!   `acct-<from+count-1>` opened with `cents` each, in one call to the
//!   host (a migration; also how the benchmarks grow a ledger);
//! - `noted {account, memo}`: a memo kept under `memo/<account>`;
//! - `audited {prefix}`: the sum of the balances whose account starts with
//!   `prefix` kept in the state (a scan of the bucket).

use serde::{Deserialize, Serialize};
use streamhost_guest::keyed::Map;
use streamhost_guest::{Context, Event, Failure, Processor};

/// Balances in cents, per account.
const BALANCES: Map<i64> = Map::new("balance/");
/// Memos, per account.
const MEMOS: Map<String> = Map::new("memo/");

#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub events: u64,
    pub accounts: u64,
    pub total_cents: i64,
    pub audited: Option<i64>,
}

#[derive(Deserialize)]
struct Movement {
    account: String,
    cents: i64,
}

#[derive(Deserialize)]
struct Import {
    from: u64,
    count: u64,
    cents: i64,
}

#[derive(Deserialize)]
struct Note {
    account: String,
    memo: String,
}

#[derive(Deserialize)]
struct Audit {
    prefix: String,
}

pub struct Ledger;

impl Processor for Ledger {
    type State = Totals;
    const SLUG: &'static str = "ledger";
    const VERSION: &'static str = "1.0.0";
    const CONSUMES: &'static [&'static str] =
        &["deposited", "withdrawn", "imported", "noted", "audited"];

    /// A movement reads its account's balance: the batch's are read at once.
    fn prefetch(event: &Event) -> Vec<String> {
        match (event.event_type.as_str(), event.payload["account"].as_str()) {
            ("deposited" | "withdrawn", Some(account)) => vec![format!("balance/{account}")],
            _ => Vec::new(),
        }
    }

    fn fold(t: &mut Totals, event: &Event, _ctx: &mut Context) -> Result<(), Failure> {
        t.events += 1;
        match event.event_type.as_str() {
            "deposited" | "withdrawn" => {
                let m: Movement = event.payload_as()?;
                let before = BALANCES.get(&m.account)?;
                let delta = if event.event_type == "deposited" {
                    m.cents
                } else {
                    -m.cents
                };
                let after = before.unwrap_or(0) + delta;
                if after < 0 {
                    return Err(Failure::fatal(format!(
                        "withdrawing {} cents from account {:?} at offset {} leaves {after}",
                        m.cents, m.account, event.offset
                    )));
                }
                if before.is_none() {
                    t.accounts += 1;
                }
                t.total_cents += delta;
                BALANCES.set(&m.account, &after)?;
            }
            "imported" => {
                let i: Import = event.payload_as()?;
                let names: Vec<String> = (i.from..i.from + i.count)
                    .map(|n| format!("acct-{n}"))
                    .collect();
                let pairs: Vec<(&str, i64)> = names.iter().map(|n| (n.as_str(), i.cents)).collect();
                BALANCES.set_many(&pairs)?;
                t.accounts += i.count;
                t.total_cents += i.cents * i.count as i64;
            }
            "noted" => {
                let n: Note = event.payload_as()?;
                MEMOS.set(&n.account, &n.memo)?;
            }
            "audited" => {
                let a: Audit = event.payload_as()?;
                let sum = BALANCES.scan(&a.prefix)?.into_iter().map(|(_, c)| c).sum();
                t.audited = Some(sum);
            }
            _ => {}
        }
        Ok(())
    }
}

streamhost_guest::processor!(Ledger);
