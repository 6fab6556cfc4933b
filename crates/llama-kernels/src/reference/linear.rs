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

/// The backward of [`linear`]: from `dy` `[tokens, d_out]`, the input gradient `dx = dy w`
/// `[tokens, d_in]` and the weight gradient `dw = dyᵀ x` `[d_out, d_in]`.
pub fn linear_backward(dy: &[f64], x: &[f64], w: &[f64], d_in: usize, d_out: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let dx = linear_backward_input(dy, w, d_in, d_out)?;
    let tokens = dy.len().checked_div(d_out).unwrap_or(0);
    check_len("x", x.len(), tokens * d_in)?;
    let mut dw = vec![0.0; d_out * d_in];
    for t in 0..tokens {
        for o in 0..d_out {
            let g = dy[t * d_out + o];
            for i in 0..d_in {
                dw[o * d_in + i] += g * x[t * d_in + i];
            }
        }
    }
    Ok((dx, dw))
}

/// The input gradient alone, `dx = dy w` `[tokens, d_in]`, from `dy` `[tokens, d_out]` (with
/// `d_out == 0`, `dy` must be empty and there are no tokens).
pub fn linear_backward_input(dy: &[f64], w: &[f64], d_in: usize, d_out: usize) -> Result<Vec<f64>> {
    check_len("w", w.len(), d_out * d_in)?;
    let tokens = dy.len().checked_div(d_out).unwrap_or(0);
    check_len("dy", dy.len(), tokens * d_out)?;
    let mut dx = vec![0.0; tokens * d_in];
    for t in 0..tokens {
        for o in 0..d_out {
            let g = dy[t * d_out + o];
            for i in 0..d_in {
                dx[t * d_in + i] += g * w[o * d_in + i];
            }
        }
    }
    Ok(dx)
}
