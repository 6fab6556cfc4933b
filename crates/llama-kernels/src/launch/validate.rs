//! The checks every op shares: dtypes, shapes, disjoint outputs, and grid and index limits.

use super::layout::Region;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Fails unless the two regions are disjoint in memory.
pub(crate) fn check_disjoint(
    op: &'static str,
    a: (&'static str, impl Into<Region>),
    b: (&'static str, impl Into<Region>),
) -> Result<()> {
    if a.1.into().overlaps(&b.1.into()) {
        return Err(Error::Overlap { op, a: a.0, b: b.0 });
    }
    Ok(())
}

pub(crate) fn check_float(op: &'static str, what: &'static str, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType { op, what, dtype, supported: "f32, f16, bf16".into() });
    }
    Ok(())
}

pub(crate) fn check_dtype(op: &'static str, what: &'static str, got: DType, expected: DType) -> Result<()> {
    if got != expected {
        return Err(Error::DTypeMismatch { op, what, got, expected });
    }
    Ok(())
}

pub(crate) fn check_shape(op: &'static str, what: &'static str, got: &[usize], expected: &[usize]) -> Result<()> {
    if got != expected {
        return Err(Error::ShapeMismatch { op, what, got: got.to_vec(), expected: format!("{expected:?}") });
    }
    Ok(())
}

/// Grid dimension x for `n` blocks, checked against CUDA's limit.
pub(crate) fn grid_x(op: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n.max(1))
        .ok()
        .filter(|&g| g <= i32::MAX as u32)
        .ok_or_else(|| Error::invalid(op, "grid size", n, "exceeds 2^31-1 blocks"))
}

/// Grid dimension y (or z) for `n` blocks of `what`, checked against CUDA's limit of 65535.
pub(crate) fn grid_y(op: &'static str, what: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n.max(1))
        .ok()
        .filter(|&g| g <= 65535)
        .ok_or_else(|| Error::invalid(op, what, n, "needs more than 65535 blocks in grid.y"))
}

pub(crate) fn to_i64(op: &'static str, name: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(op, name, v, "does not fit in i64"))
}
