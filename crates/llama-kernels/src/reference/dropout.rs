//! Reference dropout (the spec of `ops::dropout`): which elements a mask keeps, and the scaled
//! product.

use super::check_len;
use super::sampling::philox4x32_10;
use crate::error::Result;
use crate::spec::dropout::Dropout;

/// Whether the mask `d` keeps element `(t, i)` (row `t`, column `i`): word `i % 4` of
/// Philox-4x32-10 at counter `{i / 4, t, stream lo, stream hi}` with key `{seed lo, seed hi}` is at
/// least [`Dropout::drop_threshold`]. Rows and columns count from the tensor's first element,
/// whatever its strides.
pub fn keeps(d: &Dropout, t: usize, i: usize) -> bool {
    let counter = [(i / 4) as u32, t as u32, d.stream as u32, (d.stream >> 32) as u32];
    philox4x32_10(counter, [d.seed as u32, (d.seed >> 32) as u32])[i % 4] >= d.drop_threshold()
}

/// `x` `[tokens, cols]`: `x * scale / (1 - p)` where [`keeps`], 0 elsewhere.
pub fn dropout(x: &[f64], cols: usize, d: &Dropout, scale: f64) -> Result<Vec<f64>> {
    let tokens = x.len().checked_div(cols).unwrap_or(0);
    check_len("x", x.len(), tokens * cols)?;
    let k = scale * d.keep_scale();
    Ok(x.iter().enumerate().map(|(e, &v)| if keeps(d, e / cols, e % cols) { v * k } else { 0.0 }).collect())
}
