//! The fuzz targets' committed seed corpus (`fuzz/corpus/<target>/`) run
//! through the entry points the fuzzers drive, then a short seeded mutation
//! run of each (about a second per target), so the normal suite exercises
//! every target. The long runs are `cargo +nightly fuzz run <target>`
//! (RELIABILITY.md).

use std::path::Path;
use std::time::{Duration, Instant};

use streamhost::fuzzing::{self, WitTypes, TARGETS};

use crate::support::guest;

/// Tokens mutations insert: JSON structure, the field names the parsers look
/// for, path pieces and edge numbers.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "null",
    "true",
    "-1",
    "1e999",
    "0.5",
    "\"\\u0000\"",
    "\"type\"",
    "\"payload\"",
    "\"offset\"",
    "\"receiver\"",
    "\"action\"",
    "\"expression\"",
    "/",
    "..",
    "%2F",
    "$",
    "(",
    ")",
    "*",
    "\n",
];

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        // xorshift64*: enough to pick mutations.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n.max(1)
    }
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut data = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(data.len() + 1);
        match rng.below(4) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let token = TOKENS[rng.below(TOKENS.len())].as_bytes();
                data.splice(at..at, token.iter().copied());
            }
            2 if at < data.len() => {
                let end = (at + 1 + rng.below(8)).min(data.len());
                data.drain(at..end);
            }
            _ => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len());
                data.splice(at..at, other[from..].iter().copied());
            }
        }
    }
    data
}

#[test]
fn every_fuzz_target_survives_its_seed_corpus_and_a_short_mutation_run() {
    if crate::support::skipped_on_postgres("the fuzz targets run in this process, with no server") {
        return;
    }
    let types = WitTypes::of_component(&guest("kinds")).expect("the kinds component's types");
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for target in TARGETS {
        let run = |data: &[u8]| match *target {
            "event_input" => fuzzing::event_input(data),
            "subscription_config" => fuzzing::subscription_config(data),
            "stream_path" => fuzzing::stream_path(data),
            "itx_expression" => fuzzing::itx_expression(data),
            "jsonata" => fuzzing::jsonata(data),
            "jsonata_builtins" => fuzzing::jsonata_builtins(data),
            "wit_value" => fuzzing::wit_value(&types, data),
            "http_mapping" => fuzzing::http_mapping(data),
            other => panic!("no entry point for fuzz target {other:?}"),
        };
        let dir = corpus.join(target);
        let seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| std::fs::read(entry.unwrap().path()).unwrap())
            .collect();
        assert!(
            seeds.len() >= 5,
            "{target}: a seed corpus of {}",
            seeds.len()
        );
        for seed in &seeds {
            run(seed);
        }
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ target.len() as u64);
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut runs = 0;
        while Instant::now() < deadline {
            run(&mutate(&mut rng, &seeds));
            runs += 1;
        }
        println!(
            "fuzz target {target}: {} seeds, {runs} mutations",
            seeds.len()
        );
    }
}
