#![no_main]
//! `cargo fuzz run wire`: see `tollgate_fuzz::wire`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::wire(data));
