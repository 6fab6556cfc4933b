//! Reference dense product (the spec of `ops::linear`), in f64:
//! `y[t, o] = sum_i x[t, i] * w[o, i] + bias[o]` with `w` in the `nn.Linear` layout `[out, in]`.

use super::check_len;
use crate::error::Result;

/// `x` `[tokens, d_in]`, `w` `[d_out, d_in]`, `bias` `[d_out]`: returns `[tokens, d_out]`.
pub fn linear(x: &[f64], w: &[f64], bias: Option<&[f64]>, d_in: usize, d_out: usize) -> Result<Vec<f64>> {
    check_len("w", w.len(), d_out * d_in)?;
    let tokens = x.len().checked_div(d_in).unwrap_or(0);
    check_len("x", x.len(), tokens * d_in)?;
    if let Some(b) = bias {
        check_len("bias", b.len(), d_out)?;
    }
    let mut y = vec![0.0; tokens * d_out];
    for t in 0..tokens {
        let xr = &x[t * d_in..(t + 1) * d_in];
        for o in 0..d_out {
            let wr = &w[o * d_in..(o + 1) * d_in];
            let mut acc = 0.0;
            for i in 0..d_in {
                acc += xr[i] * wr[i];
            }
            y[t * d_out + o] = acc + bias.map_or(0.0, |b| b[o]);
        }
    }
    Ok(y)
}
