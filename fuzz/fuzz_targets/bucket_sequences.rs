#![no_main]
//! `cargo fuzz run bucket_sequences`: see `tollgate_fuzz::bucket_sequences`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::bucket_sequences(data));
