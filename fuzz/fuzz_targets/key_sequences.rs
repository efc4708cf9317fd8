#![no_main]
//! `cargo fuzz run key_sequences`: see `tollgate_fuzz::key_sequences`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::key_sequences(data));
