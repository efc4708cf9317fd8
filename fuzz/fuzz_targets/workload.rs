#![no_main]
//! `cargo fuzz run workload`: see `tollgate_fuzz::workload`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz::workload(data));
