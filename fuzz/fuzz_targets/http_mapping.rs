#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| streamhost::fuzzing::http_mapping(data));
