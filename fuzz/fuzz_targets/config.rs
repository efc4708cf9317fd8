#![no_main]
//! `cargo fuzz run config`: see `tollgate_fuzz::config`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::config(data));
