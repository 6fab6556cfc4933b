//! Row helpers the MoE ops share.

use crate::error::{Error, Result};
use crate::launch::{Arg, Rows};

pub(crate) fn contiguous_rows(op: &'static str, what: &'static str, b: &Arg) -> Result<Rows> {
    let r = Rows::of(op, what, b, 1)?;
    if r.rows > 1 && r.row_stride != r.cols {
        return Err(Error::BadLayout {
            op,
            what,
            shape: b.shape().to_vec(),
            strides: b.strides().to_vec(),
            why: "must be contiguous",
        });
    }
    Ok(r)
}

pub(crate) fn to_i32(op: &'static str, what: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(op, what, v, "exceeds 2^31 - 1 (expert rows are i32)"))
}
