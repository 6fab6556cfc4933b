//! bitsandbytes NF4 weights in Hugging Face checkpoints (`load_in_4bit=True`,
//! `bnb_4bit_quant_type="nf4"`, saved by transformers' `save_pretrained`), read packed.
//!
//! bitsandbytes' `Linear4bit` saves its weight as these tensors (`QuantState.as_dict(packed=True)`
//! under the weight's name, `model.layers.0.self_attn.q_proj.weight` below as `W`):
//!
//! | tensor | dtype, shape | what |
//! | --- | --- | --- |
//! | `W` | U8 `[n / 2, 1]` | the flattened `[rows, cols]` weight's 4-bit codes, element `2j` in the high nibble of byte `j` |
//! | `W.absmax` | F32 `[n / blocksize]`, or U8 with double quantization | each block's absmax, or its 8-bit code |
//! | `W.quant_map` | F32 `[16]` | the NF4 code book |
//! | `W.nested_absmax` | F32 `[ceil(blocks / 256)]` | double quantization only: the absmax codes' scales |
//! | `W.nested_quant_map` | F32 `[256]` | double quantization only: the dynamic map of the codes |
//! | `W.quant_state.bitsandbytes__nf4` | U8 `[len]` | UTF-8 JSON: `quant_type`, `blocksize`, `dtype`, `shape`, and with double quantization `nested_blocksize`, `nested_dtype`, `nested_offset` |
//!
//! [`load_nf4`] finds a weight by that last companion, checks every field and tensor (dtypes,
//! shapes, counts, the code book) before allocating anything, resolves double-quantized absmax
//! values as bitsandbytes does ([`resolve_nested_absmax`]), and repacks the weight into the
//! kernels' layout ([`PackedWeight::from_nf4`]): its [`PackedWeight::dequantize`] equals
//! bitsandbytes' `dequantize_4bit` in f32 bit for bit (`tests/nf4.rs`, on fixtures made by
//! bitsandbytes 0.49.2).
//!
//! Refused by name: FP4 weights ([`Error::Unsupported`]); a column count that is not a multiple
//! of the block size (bitsandbytes quantizes the flattened weight, so its blocks would run across
//! rows, and the layout needs whole blocks in each row); block sizes the layout does not take (a
//! power of two from 32 to 4096); a `quant_map` other than bitsandbytes' NF4 table (bitsandbytes
//! itself dequantizes with its built-in table whatever the file says); non-f32 nested statistics;
//! and any count, shape, dtype or JSON field that disagrees ([`Error::Checkpoint`]).

use safetensors::tensor::Dtype;
use serde_json::Value;

use super::checkpoint::{Checkpoint, RawTensor};
use crate::error::{Error, Result};
use llama_kernels::dtype::DType;
use llama_kernels::spec::quant::{NF4_CODE, PackedWeight, QuantFormat, QuantLayout};
use llama_kernels::spec::quant_nf4::resolve_nested_absmax;

/// The suffix of the companion that marks a bitsandbytes NF4 weight:
/// `{weight}.quant_state.bitsandbytes__nf4`.
pub const NF4_STATE_SUFFIX: &str = "quant_state.bitsandbytes__nf4";
/// The same for bitsandbytes FP4 weights (refused: [`Error::Unsupported`]).
pub const FP4_STATE_SUFFIX: &str = "quant_state.bitsandbytes__fp4";
/// The longest quant-state JSON read (bitsandbytes writes under 200 bytes).
pub const MAX_STATE_JSON_BYTES: usize = 1 << 16;

/// The JSON fields bitsandbytes' `QuantState.from_dict` takes (any other is refused, as there).
const FIELDS: [&str; 7] =
    ["quant_type", "blocksize", "dtype", "shape", "nested_blocksize", "nested_dtype", "nested_offset"];

/// Double quantization of the absmax values (`compress_statistics=True`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NestedState {
    /// Absmax codes per nested block (`nested_blocksize`; bitsandbytes writes 256).
    pub blocksize: usize,
    /// The mean subtracted before the nested quantization (`nested_offset`), as the f32
    /// bitsandbytes rebuilds from the JSON number (`torch.tensor(float(...))`).
    pub offset: f32,
}

/// The non-tensor fields of a bitsandbytes NF4 quant state (its JSON), checked.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantState {
    /// Elements per absmax block.
    pub blocksize: usize,
    /// The weight's dtype before quantization (what bitsandbytes dequantizes to): f32, f16 or
    /// bf16.
    pub dtype: DType,
    /// Rows (`shape[0]`, output features).
    pub rows: usize,
    /// Columns (`shape[1]`, input features), a multiple of `blocksize`.
    pub cols: usize,
    /// Present when the absmax values are double-quantized.
    pub nested: Option<NestedState>,
}

/// An NF4 weight read from a checkpoint: the packed weight and its quant state.
#[derive(Clone, Debug, PartialEq)]
pub struct Nf4Weight {
    /// The weight in the kernels' layout (absmax resolved to f32, bitsandbytes' code book).
    pub packed: PackedWeight,
    /// The JSON fields it was read with.
    pub state: QuantState,
}

fn bad(tensor: &str, why: impl Into<String>) -> Error {
    Error::Checkpoint { tensor: tensor.to_string(), why: why.into() }
}

/// A block size the packed layout takes for NF4 (a power of two from 32 to 4096).
fn layout_block(b: usize) -> bool {
    b.is_power_of_two() && (32..=4096).contains(&b)
}

fn field_usize(obj: &serde_json::Map<String, Value>, key: &str, tensor: &str) -> Result<Option<usize>> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| bad(tensor, format!("`{key}` is {v}, not a non-negative integer"))),
    }
}

fn field_str<'a>(obj: &'a serde_json::Map<String, Value>, key: &str, tensor: &str) -> Result<Option<&'a str>> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or_else(|| bad(tensor, format!("`{key}` is {v}, not a string"))),
    }
}

impl QuantState {
    /// Parses the bytes of a `quant_state.bitsandbytes__nf4` tensor (UTF-8 JSON) and checks every
    /// field; `tensor` names it in errors. FP4 is [`Error::Unsupported`]; everything else wrong
    /// is an [`Error::Checkpoint`].
    pub fn parse(bytes: &[u8], tensor: &str) -> Result<QuantState> {
        if bytes.len() > MAX_STATE_JSON_BYTES {
            return Err(bad(
                tensor,
                format!("{} bytes of quant-state JSON (at most {MAX_STATE_JSON_BYTES})", bytes.len()),
            ));
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|e| bad(tensor, format!("the quant state is not UTF-8 (invalid byte at {})", e.valid_up_to())))?;
        let value: Value =
            serde_json::from_str(text).map_err(|e| bad(tensor, format!("the quant state is not JSON: {e}")))?;
        let obj = value.as_object().ok_or_else(|| bad(tensor, "the quant state is not a JSON object"))?;
        if let Some(k) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(bad(tensor, format!("unknown quant-state field `{k}` (bitsandbytes knows {FIELDS:?})")));
        }
        let missing = |key: &str| bad(tensor, format!("the quant state has no `{key}`"));
        match field_str(obj, "quant_type", tensor)?.ok_or_else(|| missing("quant_type"))? {
            "nf4" => {}
            "fp4" => {
                return Err(Error::Unsupported {
                    what: format!("bitsandbytes FP4 weights (`{tensor}` says quant_type fp4): only NF4 is read"),
                });
            }
            other => return Err(bad(tensor, format!("quant_type `{other}` is not nf4"))),
        }
        let blocksize = field_usize(obj, "blocksize", tensor)?.ok_or_else(|| missing("blocksize"))?;
        if !layout_block(blocksize) {
            return Err(bad(
                tensor,
                format!("blocksize {blocksize} is not one the packed layout takes (a power of two from 32 to 4096)"),
            ));
        }
        let dtype = match field_str(obj, "dtype", tensor)?.ok_or_else(|| missing("dtype"))? {
            "float32" => DType::F32,
            "float16" => DType::F16,
            "bfloat16" => DType::BF16,
            other => return Err(bad(tensor, format!("dtype `{other}` is not float32, float16 or bfloat16"))),
        };
        let shape = obj.get("shape").ok_or_else(|| missing("shape"))?;
        let dims: Option<Vec<usize>> = shape
            .as_array()
            .map(|a| a.iter().map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok())).collect::<Option<Vec<_>>>())
            .unwrap_or(None);
        let [rows, cols] = match dims.as_deref() {
            Some(&[r, c]) if r > 0 && c > 0 => [r, c],
            _ => return Err(bad(tensor, format!("shape {shape} is not [rows, cols] of positive integers"))),
        };
        if cols % blocksize != 0 {
            return Err(bad(
                tensor,
                format!(
                    "shape [{rows}, {cols}]: {cols} columns are not a whole number of blocks of {blocksize}, so \
                     bitsandbytes' blocks (over the flattened weight) run across rows; the packed layout needs \
                     whole blocks in each row"
                ),
            ));
        }
        let nested = match (
            field_usize(obj, "nested_blocksize", tensor)?,
            field_str(obj, "nested_dtype", tensor)?,
            obj.get("nested_offset"),
        ) {
            (None, None, None) => None,
            (Some(b), Some(d), Some(off)) => {
                if !(b.is_power_of_two() && (64..=4096).contains(&b)) {
                    return Err(bad(
                        tensor,
                        format!(
                            "nested_blocksize {b} is not a bitsandbytes block size (a power of two from 64 to 4096)"
                        ),
                    ));
                }
                if d != "float32" {
                    return Err(bad(
                        tensor,
                        format!("nested_dtype `{d}`: only float32 (what quantize_4bit writes) is read"),
                    ));
                }
                // The JSON number is the f64 of an f32 (`offset.item()`): any f64 within an ulp of
                // it rounds back to that f32, as bitsandbytes' `torch.tensor(float(...))` does.
                let offset = off
                    .as_f64()
                    .map(|v| v as f32)
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| bad(tensor, format!("nested_offset {off} is not a finite f32")))?;
                Some(NestedState { blocksize: b, offset })
            }
            _ => {
                return Err(bad(tensor, "nested_blocksize, nested_dtype and nested_offset must come together"));
            }
        };
        Ok(QuantState { blocksize, dtype, rows, cols, nested })
    }
}

/// Tensor `name` as `count` f32 values (dtype F32, shape `[count]`).
fn f32_tensor(ckpt: &Checkpoint, name: &str, count: usize) -> Result<Vec<f32>> {
    let raw = ckpt.raw(name)?;
    if raw.dtype != Dtype::F32 || raw.shape != [count] {
        return Err(bad(name, format!("{:?} {:?}, expected F32 [{count}]", raw.dtype, raw.shape)));
    }
    // `raw` checked its bytes against the shape: exactly 4 * count of them.
    Ok(raw.bytes().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Tensor `name` as bytes of dtype U8 and shape `[count]`.
fn u8_tensor(ckpt: &Checkpoint, name: &str, count: usize) -> Result<RawTensor> {
    let raw = ckpt.raw(name)?;
    if raw.dtype != Dtype::U8 || raw.shape != [count] {
        return Err(bad(name, format!("{:?} {:?}, expected U8 [{count}]", raw.dtype, raw.shape)));
    }
    Ok(raw)
}

/// Reads weight `name` (full name, `model.layers.0.self_attn.q_proj.weight`) if the checkpoint
/// stores it as a bitsandbytes NF4 weight (its `{name}.quant_state.bitsandbytes__nf4` is
/// listed): checks the quant state and every companion tensor, resolves double-quantized
/// absmax values and repacks the codes. `Ok(None)` when `name` has no bitsandbytes companions.
/// An FP4 weight is [`Error::Unsupported`]; an `{name}.absmax` without its quant state, a
/// missing companion or any disagreement is an [`Error::Checkpoint`] naming the tensor.
pub fn load_nf4(ckpt: &Checkpoint, name: &str) -> Result<Option<Nf4Weight>> {
    let state_name = format!("{name}.{NF4_STATE_SUFFIX}");
    let fp4_name = format!("{name}.{FP4_STATE_SUFFIX}");
    let absmax_name = format!("{name}.absmax");
    if ckpt.lists(&fp4_name) {
        return Err(Error::Unsupported { what: format!("bitsandbytes FP4 weights (`{fp4_name}`): only NF4 is read") });
    }
    if !ckpt.lists(&state_name) {
        if ckpt.lists(&absmax_name) {
            return Err(bad(&state_name, format!("missing, but `{absmax_name}` is listed: a bitsandbytes weight")));
        }
        return Ok(None);
    }
    let raw_state = ckpt.raw(&state_name)?;
    if raw_state.dtype != Dtype::U8 || raw_state.shape.len() != 1 {
        return Err(bad(
            &state_name,
            format!("{:?} {:?}, expected U8 bytes of JSON", raw_state.dtype, raw_state.shape),
        ));
    }
    let state = QuantState::parse(raw_state.bytes(), &state_name)?;
    let (rows, cols, block) = (state.rows, state.cols, state.blocksize);
    // Bounds every count below (no allocation yet): rows * cols / 2 < 2^62.
    QuantLayout::new(QuantFormat::NF4, block, rows, cols).map_err(|e| bad(&state_name, e.to_string()))?;
    let n = rows.checked_mul(cols).ok_or_else(|| bad(&state_name, "shape too large"))?;
    let blocks = n / block;

    // The codes: bitsandbytes views any storage dtype as bytes (`A.view(torch.uint8)`).
    let weight = ckpt.raw(name)?;
    let storage_ok = matches!(weight.dtype, Dtype::U8 | Dtype::I8 | Dtype::F16 | Dtype::BF16 | Dtype::F32);
    let shape_ok = matches!(weight.shape.as_slice(), [_] | [_, 1]);
    if !storage_ok || !shape_ok || weight.bytes().len() != n / 2 {
        return Err(bad(
            name,
            format!(
                "{:?} {:?} ({} bytes): expected U8 [{}, 1], the 4-bit codes of [{rows}, {cols}]",
                weight.dtype,
                weight.shape,
                weight.bytes().len(),
                n / 2
            ),
        ));
    }

    let map_name = format!("{name}.quant_map");
    let map = f32_tensor(ckpt, &map_name, 16)?;
    if let Some((i, (got, want))) = map.iter().zip(NF4_CODE).enumerate().find(|(_, (g, w))| g.to_bits() != w.to_bits())
    {
        return Err(bad(
            &map_name,
            format!(
                "code {i} is {got} where bitsandbytes' NF4 table has {want} (bitsandbytes dequantizes with its \
                 built-in table, so this is not the NF4 weight it claims to be)"
            ),
        ));
    }

    let nested_absmax_name = format!("{name}.nested_absmax");
    let nested_map_name = format!("{name}.nested_quant_map");
    let absmax = match state.nested {
        None => {
            if ckpt.lists(&nested_absmax_name) {
                return Err(bad(&nested_absmax_name, format!("listed, but `{state_name}` has no nested_* fields")));
            }
            f32_tensor(ckpt, &absmax_name, blocks)?
        }
        Some(nest) => {
            let codes = u8_tensor(ckpt, &absmax_name, blocks)?;
            let scales = f32_tensor(ckpt, &nested_absmax_name, blocks.div_ceil(nest.blocksize))?;
            let nested_map = f32_tensor(ckpt, &nested_map_name, 256)?;
            let code = <[f32; 256]>::try_from(nested_map.as_slice())
                .map_err(|_| bad(&nested_map_name, "expected 256 values"))?;
            resolve_nested_absmax(codes.bytes(), &scales, &code, nest.blocksize, nest.offset)
                .map_err(|e| bad(&absmax_name, e.to_string()))?
        }
    };
    if let Some(i) = absmax.iter().position(|v| !v.is_finite()) {
        return Err(bad(&absmax_name, format!("block {i}'s absmax is {} (not finite)", absmax[i])));
    }
    let packed = PackedWeight::from_nf4(rows, cols, block, weight.bytes(), &absmax, NF4_CODE)
        .map_err(|e| bad(name, e.to_string()))?;
    Ok(Some(Nf4Weight { packed, state }))
}

// Defined here rather than in checkpoint.rs, so that the checkpoint module does not import this
// one (which reads the checkpoint's raw tensors).
impl Checkpoint {
    /// Weight `name` (a full name: `model.layers.0.self_attn.q_proj.weight`) kept packed, when the
    /// checkpoint stores it quantized: a bitsandbytes NF4 weight (with or without double
    /// quantization) is recognized by its `{name}.quant_state.bitsandbytes__nf4` companion, checked
    /// and repacked into the kernels' layout ([`load_nf4`]). `Ok(None)` when `name` has
    /// no quantization companions (a dense tensor, read with [`Checkpoint::tensor`], or an absent
    /// one). A bitsandbytes FP4 weight is [`Error::Unsupported`]; anything malformed is an
    /// [`Error::Checkpoint`] naming the tensor.
    pub fn packed(&self, name: &str) -> Result<Option<PackedWeight>> {
        Ok(load_nf4(self, name)?.map(|w| w.packed))
    }
}
