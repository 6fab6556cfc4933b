//! Reference softmax cross-entropy (the spec of kernels/cross_entropy.cu), in f64.
//!
//! For a row t with label `y != ignore_index`: `loss_t = log sum_v exp(x_tv) - x_ty`, gradient
//! `(softmax(x_t) - onehot(y)) * scale`; an ignored row has loss 0 and a zero gradient. The loss
//! is the sum over rows, divided by the number of rows with `y != ignore_index` for the mean
//! (NaN when there are none); `scale` is `grad_scale / n` for the mean and `grad_scale` for the
//! sum. A label outside `[0, vocab)` that is not ignored counts, has a NaN loss and a zero
//! gradient.

use super::check_len;
use crate::error::Result;

/// The losses and the gradient of one call.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossEntropyResult {
    /// The reduced loss.
    pub loss: f64,
    /// `[rows]`.
    pub row_loss: Vec<f64>,
    /// `[rows, vocab]`.
    pub grad: Vec<f64>,
}

/// `logits` `[rows, vocab]`, `labels` `[rows]`; `mean`: the mean over the counted rows, else
/// the sum.
pub fn cross_entropy(
    logits: &[f64],
    labels: &[i64],
    vocab: usize,
    ignore_index: i64,
    mean: bool,
    grad_scale: f64,
) -> Result<CrossEntropyResult> {
    check_len("logits", logits.len(), labels.len() * vocab)?;
    let n = labels.iter().filter(|&&y| y != ignore_index).count() as f64;
    let scale = if mean { grad_scale / n } else { grad_scale };
    let mut row_loss = vec![0.0; labels.len()];
    let mut grad = vec![0.0; logits.len()];
    for (t, &y) in labels.iter().enumerate() {
        if y == ignore_index {
            continue;
        }
        if y < 0 || y as usize >= vocab {
            row_loss[t] = f64::NAN;
            continue;
        }
        let x = &logits[t * vocab..(t + 1) * vocab];
        let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        row_loss[t] = lse - x[y as usize];
        for (v, g) in grad[t * vocab..(t + 1) * vocab].iter_mut().enumerate() {
            *g = ((x[v] - lse).exp() - if v == y as usize { 1.0 } else { 0.0 }) * scale;
        }
    }
    let sum: f64 = row_loss.iter().sum();
    Ok(CrossEntropyResult { loss: if mean { sum / n } else { sum }, row_loss, grad })
}
