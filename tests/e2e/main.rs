//! End-to-end tests: each starts the real `streamhost` binary on a loopback
//! port with a temp data dir and talks to it over HTTP.

/// The fuzz corpus replay evaluates JSONata in this process: count
/// allocations for its budget, as the server does.
#[global_allocator]
static ALLOCATOR: streamhost::CountingAllocator = streamhost::CountingAllocator;

mod adversarial;
mod auth;
mod backup;
mod bad_input;
mod chaos;
mod cli;
mod cluster;
mod cluster_ingest;
mod concurrency;
mod connections;
mod console;
mod copy_chains;
mod copy_crash;
mod crash;
mod determinism;
mod durable_streams;
mod effects;
mod failures;
mod fence;
mod fuzz_corpus;
mod group_commit;
mod hostile;
mod ingest;
mod isolation;
mod itx;
mod keyed;
mod languages;
mod memory;
mod migrations;
mod openapi;
mod processors;
mod reactors;
mod readme;
mod redaction;
mod retention;
mod scaffold;
mod shadows;
mod signatures;
mod storage_bound;
mod storage_failures;
mod streams;
mod subscription_bad_input;
mod subscriptions;
mod support;
mod timers;
mod traces;
mod webhooks;
