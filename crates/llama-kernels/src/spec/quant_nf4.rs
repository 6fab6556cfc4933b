//! bitsandbytes' double quantization of NF4 statistics (`compress_statistics=True`), resolved to
//! the f32 absmax values a [`PackedWeight`](super::quant::PackedWeight) holds.
//!
//! `bitsandbytes.functional.quantize_4bit` with `compress_statistics=True` stores the per-block
//! absmax values not as f32 but as one byte each: it takes their mean (`offset`), subtracts it,
//! and quantizes the differences with `quantize_blockwise` (the 256-entry signed dynamic map, in
//! blocks of [`BNB_NESTED_BLOCK`] absmax values, each with its own f32 `nested_absmax`). Its
//! `dequantize_4bit` undoes that first, in two f32 steps:
//!
//! ```text
//! absmax = dequantize_blockwise(codes, state2)  # nested_code[codes[i]] * nested_absmax[i // nested_block]
//! absmax += offset
//! ```
//!
//! [`resolve_nested_absmax`] evaluates exactly those operations (one f32 product, then one f32
//! sum, each rounded, never fused), so its values equal bitsandbytes' bit for bit
//! (`tests/nf4.rs` checks them against bitsandbytes' own output), and the weight then
//! dequantizes as bitsandbytes does.

use crate::error::{Error, Result};

/// The block size bitsandbytes' `quantize_4bit` uses for the nested quantization of the absmax
/// values (`quantize_blockwise(absmax - offset, blocksize=256)`).
pub const BNB_NESTED_BLOCK: usize = 256;

/// The f32 absmax of each 4-bit block from bitsandbytes' double-quantized statistics:
/// `nested_code[codes[i]] * nested_absmax[i / nested_block] + offset`, the product rounded to
/// f32 and then the sum (bitsandbytes' `dequantize_blockwise` followed by `absmax += offset`).
///
/// `codes` are the stored `absmax` bytes (one per 4-bit block), `nested_absmax` one f32 per
/// `nested_block` codes (the last block may be partial), `nested_code` the stored
/// `nested_quant_map`, `offset` the stored `nested_offset`. A zero `nested_block` or a
/// `nested_absmax` of the wrong length is an [`Error::InvalidArgument`]; nothing is read out of
/// bounds.
pub fn resolve_nested_absmax(
    codes: &[u8],
    nested_absmax: &[f32],
    nested_code: &[f32; 256],
    nested_block: usize,
    offset: f32,
) -> Result<Vec<f32>> {
    if nested_block == 0 {
        return Err(Error::invalid("nf4", "nested block", nested_block, "must be positive"));
    }
    let blocks = codes.len().div_ceil(nested_block);
    if nested_absmax.len() != blocks {
        return Err(Error::invalid(
            "nf4",
            "nested absmax",
            nested_absmax.len(),
            format!("expected {blocks} (one per {nested_block} of {} absmax codes)", codes.len()),
        ));
    }
    let mut out = Vec::with_capacity(codes.len());
    for (chunk, &scale) in codes.chunks(nested_block).zip(nested_absmax) {
        for &q in chunk {
            // Two statements, two roundings: the product is an f32 before the sum (no FMA).
            let v: f32 = nested_code[usize::from(q)] * scale;
            out.push(v + offset);
        }
    }
    Ok(out)
}
