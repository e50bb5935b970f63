//! JSONata benchmark: `cargo bench -p streamhost --bench jsonata`.
//!
//! What the bounds cost: each expression evaluated as the host evaluates
//! subscription filters, transforms and conditions (`streamhost::jsonata`:
//! under a CPU-time bound, a depth bound and a byte budget) and by the
//! engine alone with no bound (`jsonata_core` with default options, the
//! floor), in turns, in the same run. Reported: nanoseconds per evaluation
//! (the median of `--runs` runs, each the mean of a fixed count) and the
//! ratio of bounded to floor.
//!
//! Options (after `--`): `--runs N` (5).

mod common;
use common::arg;

use std::hint::black_box;
use std::time::Instant;

use jsonata_core::evaluator::{Context, Evaluator, EvaluatorOptions};
use jsonata_core::value::JValue;
use serde_json::json;
use streamhost::jsonata::{compile, Input, Limits};

/// (name, expression, evaluations per run).
const EXPRESSIONS: &[(&str, &str, usize)] = &[
    (
        "filter",
        r#"type = "orders.example/created" and payload.total > 100 and payload.region in ["eu", "us"]"#,
        100_000,
    ),
    (
        "transform",
        r#"{"type": "orders.example/summary", "payload": {"order": payload.id, "lines": $count(payload.items), "total": $sum(payload.items.price)}}"#,
        50_000,
    ),
    ("loop", r#"$sum([1..2000].($ * 2))"#, 500),
];

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let runs = arg("--runs", 5.0).max(1.0) as usize;
    let event = json!({
        "type": "orders.example/created",
        "offset": 7,
        "payload": {"id": "o-7", "total": 250, "region": "eu",
                    "items": [{"sku": "a", "price": 100}, {"sku": "b", "price": 150}]}
    });
    println!("JSONata: ns per evaluation, medians of {runs} runs");
    println!(
        "{:<12} {:>12} {:>12} {:>9}",
        "expression", "bounded", "no bound", "ratio"
    );
    for (name, text, n) in EXPRESSIONS {
        let bounded = compile(text, Limits::default()).expect("compiles");
        let input = Input::new(&event);
        let ast = jsonata_core::parser::parse(text).expect("parses");
        let data = JValue::from(event.clone());
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let started = Instant::now();
            for _ in 0..*n {
                // A filter as subscriptions run one: its truth only.
                if *name == "filter" {
                    black_box(bounded.matches(&input).expect("evaluates"));
                } else {
                    black_box(bounded.evaluate(&input).expect("evaluates"));
                }
            }
            with.push(started.elapsed().as_secs_f64() * 1e9 / *n as f64);
            let started = Instant::now();
            for _ in 0..*n {
                let mut evaluator =
                    Evaluator::with_options(Context::new(), EvaluatorOptions::default());
                black_box(evaluator.evaluate(&ast, &data).expect("evaluates"));
            }
            without.push(started.elapsed().as_secs_f64() * 1e9 / *n as f64);
        }
        let (with, without) = (median(with), median(without));
        println!(
            "{name:<12} {with:>12.0} {without:>12.0} {:>9.2}",
            with / without
        );
    }
}
