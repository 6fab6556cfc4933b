//! The specification: plain Rust, f64 arithmetic, obvious algorithms.
//!
//! Every kernel is checked against these functions, on every target. They take and return flat
//! row-major `f64` slices (inputs already rounded to the storage dtype, as the kernels see them),
//! and they are written for clarity, not speed.

pub mod attention;
pub mod block;
pub mod cross_entropy;
pub mod dropout;
pub mod embedding;
pub mod linear;
pub mod lora;
pub mod moe;
pub mod optimizer;
pub mod paged_attention;
pub mod rms_norm;
pub mod rope;
pub mod sampling;
pub mod swiglu;

use crate::error::{Error, Result};

/// Fails when a reference input has the wrong length (the references never panic).
pub(crate) fn check_len(what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got != expected {
        return Err(Error::Reference { what, why: format!("{got} values, expected {expected}") });
    }
    Ok(())
}
