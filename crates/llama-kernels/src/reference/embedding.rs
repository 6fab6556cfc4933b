//! Reference token embedding (the spec of kernels/embedding.cu): `out[t] = table[ids[t]]`, a
//! row gather. An id outside `[0, vocab)` gives a row of zeros and is reported.

use super::check_len;
use crate::error::Result;

/// Rows `ids` of `table` (`[vocab, hidden]` row-major), and whether any id was outside
/// `[0, vocab)` (those rows are zeros).
pub fn embedding(table: &[f64], hidden: usize, ids: &[i64]) -> Result<(Vec<f64>, bool)> {
    let vocab = if hidden == 0 { 0 } else { table.len() / hidden };
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
