//! Flash-style grouped-query attention for prefill (kernels/attention.cu).
//!
//! `O = softmax(scale * Q K^T + mask) V`, tile by tile with an online softmax: the score matrix is
//! never stored and the only workspace is `3 * (batch + 1)` i32 values.
//!
//! ```
//! use llama_kernels::ops::attention::{AttentionMask, AttentionOptions, AttentionWorkspace};
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (q_heads, kv_heads, d) = (8, 2, 64);
//! // Two sequences: 5 new tokens after a 3-token cached prefix, and 4 fresh tokens.
//! let (cu_q, cu_k) = ([0, 5, 9], [0, 8, 12]);
//! let q = Tensor::zeros(&device, DType::BF16, &[9, q_heads, d])?;
//! let k = Tensor::zeros(&device, DType::BF16, &[12, kv_heads, d])?;
//! let v = Tensor::zeros(&device, DType::BF16, &[12, kv_heads, d])?;
//! let out = Tensor::zeros(&device, DType::BF16, &[9, q_heads, d])?;
//! let mut ws = AttentionWorkspace::new(&device);
//! let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
//! ws.forward(&q, &k, &v, &cu_q, &cu_k, &out, None, &opts)?;
//! # Ok(())
//! # }
//! ```
//!
//! Shapes: q and out `[total_q, q_heads, head_dim]`, k and v `[total_k, kv_heads, head_dim]`, each
//! with its own token and head strides (views into a fused QKV buffer work), `head_dim`
//! contiguous, one dtype; the optional log-sum-exp output is f32 `[q_heads, total_q]`, contiguous.
//! `cu_seqlens_q` / `cu_seqlens_k` are the cumulative sequence offsets (i32, `batch + 1` values,
//! from 0, non-decreasing); a single sequence is `[0, total_q]`, `[0, total_k]`.
//!
//! Supported: bf16 and f16 on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async), f32 on a SIMT
//! path; head_dim 64, 96 and 128. Queries align to the end of their keys (chunked prefill after a
//! cached prefix). Fully masked rows and queries of sequences without keys write zeros with
//! `lse = -inf`.

use crate::backend::{Device, KernelArgs, KernelRef, LaunchDims};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{
    Heads, KernelTable, Rows, check_disjoint, check_dtype, check_float, check_same_device, grid_x, to_i64,
};
use crate::params::{AttentionParams, LlkAttnMask, LlkAttnTemperature};
use crate::tensor::Tensor;

const OP: &str = "gqa_attention";
/// Head dims with kernels.
pub const SUPPORTED_HEAD_DIMS: [usize; 3] = [64, 96, 128];
/// Rows (query token x q head) per block: kBlockM (tensor cores) and kSimtRows (f32) in
/// kernels/attention.cu.
const ROWS_MMA: usize = 64;
const ROWS_SIMT: usize = 32;
const THREADS: u32 = 128;
/// Largest GQA pack (q heads sharing one block's K/V tiles).
pub const MAX_PACK: usize = 16;

/// Which keys a query may attend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionMask {
    /// Every key of its sequence.
    #[default]
    None,
    /// Keys up to the query's position, aligned bottom-right (`k_len - q_len + i`).
    Causal,
    /// Llama 4's chunked local attention: causal, and only keys in the query's chunk
    /// `floor(position / chunk_size)` (Llama 4 uses 8192 on its RoPE layers).
    ChunkedCausal { chunk_size: usize },
}

/// Llama 4's attention temperature tuning (`attn_temperature_tuning`, NoPE layers): the query at
/// position p is scaled by `ln(floor((p + 1) / floor_scale) + 1) * attn_scale + 1`, as in Hugging
/// Face's `Llama4TextAttention` (`torch.log1p(torch.floor((cache_position + 1) / floor_scale)) *
/// attn_scale + 1`). The kernel scales the f32 scores; Hugging Face rounds the scaled q to the
/// model dtype first, which differs by one rounding of q.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama4Temperature {
    pub floor_scale: f32,
    pub attn_scale: f32,
}

impl Default for Llama4Temperature {
    /// Llama 4's configuration defaults: floor_scale 8192, attn_scale 0.1.
    fn default() -> Self {
        Llama4Temperature { floor_scale: 8192.0, attn_scale: 0.1 }
    }
}

/// Options of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct AttentionOptions {
    pub mask: AttentionMask,
    /// Softmax scale, finite and > 0; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    pub temperature: Option<Llama4Temperature>,
    /// q heads of one KV group that share a block (and so every K/V tile it loads). `None`
    /// picks the largest divisor of the group size up to 16. Must divide q_heads / kv_heads.
    pub gqa_pack: Option<usize>,
}

/// Every kernel, by (dtype, head_dim).
static KERNELS: KernelTable<(DType, usize)> = KernelTable {
    module: "attention",
    entries: &[
        ((DType::BF16, 64), "attention_hd64_bf16"),
        ((DType::BF16, 96), "attention_hd96_bf16"),
        ((DType::BF16, 128), "attention_hd128_bf16"),
        ((DType::F16, 64), "attention_hd64_f16"),
        ((DType::F16, 96), "attention_hd96_f16"),
        ((DType::F16, 128), "attention_hd128_f16"),
        ((DType::F32, 64), "attention_hd64_f32"),
        ((DType::F32, 96), "attention_hd96_f32"),
        ((DType::F32, 128), "attention_hd128_f32"),
    ],
};

/// The symbols of this family, for static checks.
pub fn kernel_symbols() -> impl Iterator<Item = KernelRef> {
    KERNELS.symbols()
}

/// Dynamic shared memory of the tensor-core kernel: Q, and two stages of K and V, in rows padded
/// to a power of two of 16-byte chunks (kPitch in kernels/attention.cu).
fn mma_smem_bytes(head_dim: usize) -> u32 {
    let row = if head_dim <= 64 { 64 } else { 128 };
    ((ROWS_MMA + 4 * 64) * row * 2) as u32
}

/// Checks cumulative sequence offsets and returns the batch size.
fn check_cu_seqlens(name: &'static str, cu: &[i32], total: usize) -> Result<usize> {
    if cu.is_empty() {
        return Err(Error::invalid(OP, name, "[]", "needs batch + 1 >= 1 values"));
    }
    if cu[0] != 0 {
        return Err(Error::invalid(OP, name, cu[0], "must start at 0"));
    }
    if let Some(i) = cu.windows(2).position(|w| w[1] < w[0]) {
        return Err(Error::invalid(
            OP,
            name,
            format!("{:?}", &cu[i..i + 2]),
            format!("must be non-decreasing (at index {i})"),
        ));
    }
    let last = cu[cu.len() - 1];
    if last as usize != total {
        return Err(Error::invalid(OP, name, last, format!("must end at the tensor's {total} tokens")));
    }
    Ok(cu.len() - 1)
}

/// Reusable per-call state: a small device buffer for the sequence offsets and the tile map.
/// Create it once (it grows to the largest batch seen, the only allocation) and reuse it.
#[derive(Debug)]
pub struct AttentionWorkspace {
    device: Device,
    buf: Option<Tensor>,
    host: Vec<i32>,
}

impl AttentionWorkspace {
    pub fn new(device: &Device) -> AttentionWorkspace {
        AttentionWorkspace { device: device.clone(), buf: None, host: Vec::new() }
    }
    /// Preallocates room for batches of up to `max_batch` sequences.
    pub fn with_capacity(device: &Device, max_batch: usize) -> Result<AttentionWorkspace> {
        let mut ws = Self::new(device);
        ws.reserve(max_batch)?;
        Ok(ws)
    }
    fn reserve(&mut self, batch: usize) -> Result<()> {
        let need = 3 * (batch + 1);
        if self.buf.as_ref().is_none_or(|b| b.numel() < need) {
            self.buf = Some(Tensor::zeros(&self.device, DType::I32, &[need.next_power_of_two()])?);
        }
        Ok(())
    }

    /// Runs attention; `out` (and `lse`) are written. See the module docs.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cu_seqlens_q: &[i32],
        cu_seqlens_k: &[i32],
        out: &Tensor,
        lse: Option<&Tensor>,
        opts: &AttentionOptions,
    ) -> Result<()> {
        // Dtypes, devices, shapes.
        check_float(OP, "q", q)?;
        let dtype = q.dtype();
        for (what, t) in [("k", k), ("v", v), ("out", out)] {
            check_dtype(OP, what, t, dtype)?;
        }
        check_same_device(OP, q, &[("k", k), ("v", v), ("out", out)])?;
        if !q.device().same(&self.device) {
            return Err(Error::DeviceMismatch { op: OP, what: "workspace" });
        }
        let (qh, kh, vh, oh) =
            (Heads::of(OP, "q", q)?, Heads::of(OP, "k", k)?, Heads::of(OP, "v", v)?, Heads::of(OP, "out", out)?);
        let d = qh.head_dim;
        for (what, t, h) in [("k", k, &kh), ("v", v, &vh), ("out", out, &oh)] {
            if h.head_dim != d {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what,
                    got: t.shape().to_vec(),
                    expected: format!("head_dim {d} like q"),
                });
            }
        }
        if !SUPPORTED_HEAD_DIMS.contains(&d) {
            return Err(Error::invalid(OP, "head_dim", d, format!("unsupported (supported: {SUPPORTED_HEAD_DIMS:?})")));
        }
        if kh.heads == 0 || qh.heads % kh.heads != 0 {
            return Err(Error::invalid(OP, "q_heads", qh.heads, format!("not divisible by kv_heads {}", kh.heads)));
        }
        if vh.heads != kh.heads || vh.tokens != kh.tokens {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "v",
                got: v.shape().to_vec(),
                expected: format!("{:?} like k", k.shape()),
            });
        }
        if oh.tokens != qh.tokens || oh.heads != qh.heads {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "out",
                got: out.shape().to_vec(),
                expected: format!("{:?} like q", q.shape()),
            });
        }
        let batch = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, qh.tokens)?;
        if check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, kh.tokens)? != batch {
            return Err(Error::invalid(
                OP,
                "cu_seqlens_k",
                format!("{} values", cu_seqlens_k.len()),
                format!("must have as many values as cu_seqlens_q ({})", cu_seqlens_q.len()),
            ));
        }
        if let Some(l) = lse {
            check_dtype(OP, "lse", l, DType::F32)?;
            check_same_device(OP, q, &[("lse", l)])?;
            if l.shape() != [qh.heads, qh.tokens] || !l.is_contiguous() {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what: "lse",
                    got: l.shape().to_vec(),
                    expected: format!("contiguous [{}, {}] (q_heads, total_q)", qh.heads, qh.tokens),
                });
            }
        }
        // Options.
        let scale = opts.scale.unwrap_or(1.0 / (d as f32).sqrt());
        // Positive: the kernel takes row maxima of raw scores and scales them (and a softmax
        // with a negative scale is not something a model asks for).
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::invalid(OP, "scale", scale, "must be finite and > 0"));
        }
        let (mask, chunk_size) = match opts.mask {
            AttentionMask::None => (LlkAttnMask::LLK_ATTN_NONE, 0),
            AttentionMask::Causal => (LlkAttnMask::LLK_ATTN_CAUSAL, 0),
            AttentionMask::ChunkedCausal { chunk_size: 0 } => {
                return Err(Error::invalid(OP, "chunk_size", 0, "must be > 0"));
            }
            AttentionMask::ChunkedCausal { chunk_size } => (LlkAttnMask::LLK_ATTN_CHUNKED_CAUSAL, chunk_size),
        };
        if let Some(t) = &opts.temperature {
            if !(t.floor_scale.is_finite() && t.floor_scale > 0.0) {
                return Err(Error::invalid(OP, "temperature floor_scale", t.floor_scale, "must be finite and > 0"));
            }
            if !(t.attn_scale.is_finite() && t.attn_scale >= 0.0) {
                return Err(Error::invalid(OP, "temperature attn_scale", t.attn_scale, "must be finite and >= 0"));
            }
        }
        let group = qh.heads / kh.heads;
        let pack = match opts.gqa_pack {
            Some(p) if p == 0 || p > MAX_PACK || group % p != 0 => {
                return Err(Error::invalid(
                    OP,
                    "gqa_pack",
                    p,
                    format!("must divide the group size {group} and be 1..={MAX_PACK}"),
                ));
            }
            Some(p) => p,
            None => (1..=group.min(MAX_PACK)).rev().find(|p| group % p == 0).unwrap_or(1),
        };
        // Aliasing: out and lse are written, q, k and v read.
        let orows = oh.rows();
        for (what, t, h) in [("q", q, &qh), ("k", k, &kh), ("v", v, &vh)] {
            check_disjoint(OP, ("out", out, &orows), (what, t, &h.rows()))?;
        }
        if let Some(l) = lse {
            let lrows = Rows::of(OP, "lse", l, 1)?;
            for (what, t, h) in [("q", q, &qh), ("k", k, &kh), ("v", v, &vh), ("out", out, &oh)] {
                check_disjoint(OP, ("lse", l, &lrows), (what, t, &h.rows()))?;
            }
        }

        // Tiles: each sequence's queries in blocks of rows / pack tokens.
        let rows_per_block = if dtype == DType::F32 { ROWS_SIMT } else { ROWS_MMA };
        let tokens_per_block = rows_per_block / pack;
        self.host.clear();
        self.host.extend_from_slice(cu_seqlens_q);
        self.host.extend_from_slice(cu_seqlens_k);
        let mut tiles = 0usize;
        self.host.push(0);
        for w in cu_seqlens_q.windows(2) {
            tiles +=
                (w[1] - w[0]) as usize / tokens_per_block + usize::from((w[1] - w[0]) as usize % tokens_per_block != 0);
            self.host
                .push(i32::try_from(tiles).map_err(|_| Error::invalid(OP, "total_q", qh.tokens, "too many tiles"))?);
        }
        if tiles == 0 || qh.heads == 0 {
            return Ok(()); // empty batch: nothing to write
        }
        let grid_y = u32::try_from(kh.heads * (group / pack))
            .ok()
            .filter(|&y| y <= 65535)
            .ok_or_else(|| Error::invalid(OP, "heads", qh.heads, "too many head blocks for grid.y (65535)"))?;
        self.reserve(batch)?;
        let buf = self.buf.as_ref().ok_or_else(|| Error::Host("attention workspace missing".into()))?;
        buf.upload_ordered(&self.host)?;
        let n = batch + 1;
        let (cu_q_t, cu_k_t, cu_tiles_t) = (buf.narrow(0, 0, n)?, buf.narrow(0, n, n)?, buf.narrow(0, 2 * n, n)?);

        let mut args = KernelArgs::new(OP, q.device());
        let params = AttentionParams {
            q: args.ptr("q", q)?,
            k: args.ptr("k", k)?,
            v: args.ptr("v", v)?,
            out: args.ptr("out", out)?,
            lse: args.opt_ptr("lse", lse)?,
            cu_seqlens_q: args.ptr("workspace", &cu_q_t)?,
            cu_seqlens_k: args.ptr("workspace", &cu_k_t)?,
            cu_tiles: args.ptr("workspace", &cu_tiles_t)?,
            batch: to_i64(OP, "batch", batch)?,
            q_heads: to_i64(OP, "q_heads", qh.heads)?,
            kv_heads: to_i64(OP, "kv_heads", kh.heads)?,
            head_dim: to_i64(OP, "head_dim", d)?,
            total_q: to_i64(OP, "total_q", qh.tokens)?,
            q_token_stride: to_i64(OP, "q token stride", qh.token_stride)?,
            q_head_stride: to_i64(OP, "q head stride", qh.head_stride)?,
            k_token_stride: to_i64(OP, "k token stride", kh.token_stride)?,
            k_head_stride: to_i64(OP, "k head stride", kh.head_stride)?,
            v_token_stride: to_i64(OP, "v token stride", vh.token_stride)?,
            v_head_stride: to_i64(OP, "v head stride", vh.head_stride)?,
            out_token_stride: to_i64(OP, "out token stride", oh.token_stride)?,
            out_head_stride: to_i64(OP, "out head stride", oh.head_stride)?,
            pack: to_i64(OP, "gqa_pack", pack)?,
            chunk_size: to_i64(OP, "chunk_size", chunk_size)?,
            mask,
            temperature: if opts.temperature.is_some() {
                LlkAttnTemperature::LLK_ATTN_LLAMA4_TEMPERATURE
            } else {
                LlkAttnTemperature::LLK_ATTN_NO_TEMPERATURE
            },
            scale,
            temp_floor_scale: opts.temperature.map_or(1.0, |t| t.floor_scale),
            temp_attn_scale: opts.temperature.map_or(0.0, |t| t.attn_scale),
        };
        // The tensor-core path copies 16-byte chunks: every row must start 16-byte aligned.
        if dtype != DType::F32 {
            let v16 = dtype.vec16();
            for (what, addr, h) in
                [("q", params.q, &qh), ("k", params.k, &kh), ("v", params.v, &vh), ("out", params.out, &oh)]
            {
                if addr % 16 != 0 || h.token_stride % v16 != 0 || h.head_stride % v16 != 0 {
                    return Err(Error::BadLayout {
                        op: OP,
                        what,
                        shape: vec![h.tokens, h.heads, h.head_dim],
                        strides: vec![h.token_stride, h.head_stride, 1],
                        why: "rows must be 16-byte aligned (address and strides)",
                    });
                }
            }
        }
        let dims = LaunchDims {
            grid: (grid_x(OP, tiles)?, grid_y, 1),
            block: (THREADS, 1, 1),
            dyn_smem: if dtype == DType::F32 { 0 } else { mma_smem_bytes(d) },
        };
        args.launch(KERNELS.find(OP, "q", (dtype, d), dtype)?, dims, &params)
    }
}

/// One-shot attention with a temporary workspace (allocates; engines should keep an
/// [`AttentionWorkspace`]).
#[allow(clippy::too_many_arguments)]
pub fn gqa_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    out: &Tensor,
    lse: Option<&Tensor>,
    opts: &AttentionOptions,
) -> Result<()> {
    AttentionWorkspace::new(q.device()).forward(q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, opts)
}
