//! The ops, one file each: forward as a candle `CustomOp`, backward from the backward kernels.

pub mod rms_norm;

pub use rms_norm::rms_norm;
