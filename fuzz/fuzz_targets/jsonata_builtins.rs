#![no_main]

// The allocation budget counts what the evaluator allocates, as in the server.
#[global_allocator]
static ALLOCATOR: streamhost::jsonata::memory::Counting = streamhost::jsonata::memory::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| streamhost::fuzzing::jsonata_builtins(data));
