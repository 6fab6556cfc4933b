//! Reference token embedding (the spec of kernels/embedding.cu): `out[t] = table[ids[t]]`, a
//! row gather. An id outside `[0, vocab)` gives a row of zeros and is reported.

use super::check_len;
use crate::error::Result;

/// Rows `ids` of `table` (`[vocab, hidden]` row-major), and whether any id was outside
/// `[0, vocab)` (those rows are zeros).
pub fn embedding(table: &[f64], hidden: usize, ids: &[i64]) -> Result<(Vec<f64>, bool)> {
    let vocab = table.len().checked_div(hidden).unwrap_or(0);
    check_len("table", table.len(), vocab * hidden)?;
    let mut out = Vec::with_capacity(ids.len() * hidden);
    let mut bad = false;
    for &id in ids {
        match usize::try_from(id).ok().filter(|&i| i < vocab) {
            Some(i) => out.extend_from_slice(&table[i * hidden..(i + 1) * hidden]),
            None => {
                bad = true;
                out.extend(std::iter::repeat_n(0.0, hidden));
            }
        }
    }
    Ok((out, bad))
}

/// The backward of the lookup: `d_table[v] = sum of d_out[t] over the tokens with ids[t] == v`
/// (`[vocab, hidden]`; ids outside `[0, vocab)` add nothing).
pub fn embedding_backward(d_out: &[f64], ids: &[i32], vocab: usize, hidden: usize) -> Result<Vec<f64>> {
    check_len("d_out", d_out.len(), ids.len() * hidden)?;
    let mut d_table = vec![0.0; vocab * hidden];
    for (t, &id) in ids.iter().enumerate() {
        if let Ok(v) = usize::try_from(id) {
            if v < vocab {
                for (g, d) in d_table[v * hidden..(v + 1) * hidden].iter_mut().zip(&d_out[t * hidden..(t + 1) * hidden])
                {
                    *g += d;
                }
            }
        }
    }
    Ok(d_table)
}
