//! What the `tollgate` binary is built on and other programs use too: the
//! configuration of `tollgate serve` (defaults, file, variables and flags
//! laid over each other and validated), where its store is, and how
//! results are printed. The fuzz targets (`fuzz/`) parse configuration
//! through it.

pub mod config;
pub mod output;
pub mod store;
