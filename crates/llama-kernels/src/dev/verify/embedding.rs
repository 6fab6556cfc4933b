//! The embedding lookup's `verify` cases: a Llama-sized table (the 16-byte path), an odd width
//! (the scalar path), strided output rows whose gaps must keep their poison, and one id outside
//! the vocabulary (a zero row, flagged on the device); and a packed table of every format, whose
//! rows must be the dequantized rows rounded to the dtype, exactly.

use std::time::Instant;

use super::common::*;
use crate::backend::Device;
use crate::dev::testing::{Rng, Tolerance, compare};
use crate::dtype::DType;
use crate::dtype::round_to;
use crate::error::{Error, Result};
use crate::ops::ErrorFlag;
use crate::ops::embedding::EmbeddingTable;
use crate::ops::qlinear::QWeight;
use crate::reference;
use crate::spec::quant::QuantFormat;
use crate::tensor::Tensor;

use super::qlinear::random_packed;

/// One case: a `[vocab, hidden]` table, `tokens` ids (the last outside the vocabulary when
/// `bad_id`), output rows `pad` elements apart beyond `hidden`; the table dense, or packed in
/// `packed`.
#[derive(Clone, Copy, Debug)]
pub struct EmbeddingCase {
    pub dtype: DType,
    pub packed: Option<QuantFormat>,
    pub vocab: usize,
    pub hidden: usize,
    pub tokens: usize,
    pub pad: usize,
    pub bad_id: bool,
}

/// Runs `case` on `device` against the reference (rows are copied, so the tolerance is exact).
pub fn embedding_case(device: &Device, case: EmbeddingCase) -> Result<CaseResult> {
    let EmbeddingCase { dtype, packed, vocab, hidden, tokens, pad, bad_id } = case;
    let mut rng = Rng::new((vocab as u64) << 20 ^ hidden as u64);
    // The table's values as the lookup must return them, and the table on the device.
    let (values, table) = match packed {
        None => {
            let values = rng.normal_vec(vocab * hidden, 1.0, dtype);
            let table = Tensor::from_f64(device, dtype, &values, &[vocab, hidden])?;
            (values, EmbeddingTable::Dense(table))
        }
        Some(format) => {
            let w = random_packed(&mut rng, format, vocab, hidden)?;
            let values = w.dequantize().iter().map(|&v| round_to(dtype, f64::from(v))).collect();
            (values, EmbeddingTable::Packed(QWeight::new(device, &w)?))
        }
    };
    let mut ids: Vec<i32> = (0..tokens).map(|_| rng.below(vocab as u64) as i32).collect();
    if bad_id {
        if let Some(last) = ids.last_mut() {
            *last = vocab as i32;
        }
    }
    let ids_t = Tensor::from_slice(device, &ids, &[tokens])?;
    let full = Tensor::poisoned(device, dtype, &[tokens, hidden + pad])?;
    let out = full.narrow(1, 0, hidden)?;
    let errors = ErrorFlag::new(device)?;
    let start = Instant::now();
    table.lookup(&ids_t, &out, &errors)?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let ids64: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    let (expected, want_flag) = reference::embedding::embedding(&values, hidden, &ids64)?;
    let got = out.to_f64_vec()?;
    let flagged = matches!(errors.check("embedding"), Err(Error::DeviceReported { .. }));
    let gaps = gaps_poisoned(&full, hidden)?;
    let comparison = compare(&got, &expected, Tolerance { atol: 0.0, rtol: 0.0 });
    Ok(CaseResult {
        op: match packed {
            None => "embedding".into(),
            Some(format) => format!("embedding {format}"),
        },
        dtype,
        shape: format!(
            "{tokens} ids of {vocab}x{hidden}{}{}",
            if pad > 0 { " strided" } else { "" },
            if bad_id { " +bad id" } else { "" }
        ),
        pass: comparison.pass && gaps && flagged == want_flag,
        comparison,
        worst_shape: vec![tokens, hidden],
        gaps_untouched: gaps,
        millis,
        outputs: vec![got],
    })
}

/// The embedding cases `verify` runs (Llama 3 8B's table is 128256 x 4096).
pub fn embedding_cases(quick: bool) -> Vec<EmbeddingCase> {
    let (vocab, hidden, tokens) = if quick { (1000, 576, 16) } else { (128_256, 4096, 512) };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        v.push(EmbeddingCase { dtype, packed: None, vocab, hidden, tokens, pad: 0, bad_id: false });
        v.push(EmbeddingCase { dtype, packed: None, vocab: 97, hidden: 37, tokens, pad: 3, bad_id: true });
    }
    // Packed tables: every format, each dtype in turn, aligned and odd-strided output rows.
    for (i, format) in QuantFormat::ALL.into_iter().enumerate() {
        let dtype = DType::FLOATS[i % 3];
        let hidden = if format.default_block() == 32 { 576 } else { 768 };
        let (pad, bad_id) = if i % 2 == 0 { (0, false) } else { (3, true) };
        v.push(EmbeddingCase { dtype, packed: Some(format), vocab: 97, hidden, tokens, pad, bad_id });
    }
    v
}
