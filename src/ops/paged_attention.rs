//! The paged KV cache (kernels/paged_attention.cu): appending new tokens, split-KV decode
//! attention on tensor cores, and merging attention states.
//!
//! ```
//! use llama_kernels::ops::paged_attention::{
//!     DecodeShape, KvScales, PagedDecodeOptions, PagedDecodeWorkspace, PagedKvCache, PagedKvConfig,
//! };
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (q_heads, kv_heads, d, page_size) = (8, 2, 64, 16);
//! let cache = PagedKvCache::new(&device, &PagedKvConfig {
//!     num_pages: 8, page_size, kv_heads, head_dim: d, dtype: DType::BF16, scales: KvScales::default(),
//! })?;
//! // Two sequences decoding one token each: the new k/v go to their slots, then attention runs
//! // over the whole cache of each sequence (20 and 3 keys).
//! let k = Tensor::zeros(&device, DType::BF16, &[2, kv_heads, d])?;
//! let v = Tensor::zeros(&device, DType::BF16, &[2, kv_heads, d])?;
//! let slots = Tensor::from_slice(&device, &[3 * 16 + 3i64, 2 * 16 + 2], &[2])?;
//! cache.append(&k, &v, &slots)?;
//! let block_table = Tensor::from_slice(&device, &[0i32, 3, 2, 0], &[2, 2])?;
//! let seq_lens = Tensor::from_slice(&device, &[20i32, 3], &[2])?;
//! let shape = DecodeShape { batch: 2, q_len: 1, q_heads, kv_heads, head_dim: d, max_seq_len: 32,
//!     dtype: DType::BF16, page_dtype: DType::BF16 };
//! let mut ws = PagedDecodeWorkspace::plan(&device, &shape)?;  // once per batch shape
//! let q = Tensor::zeros(&device, DType::BF16, &[2, q_heads, d])?;
//! let out = Tensor::zeros(&device, DType::BF16, &[2, q_heads, d])?;
//! ws.forward(&q, &cache, &block_table, &seq_lens, &out, None, &PagedDecodeOptions::default())?;
//! ws.check_errors()?;
//! cache.check_errors()?;
//! # Ok(())
//! # }
//! ```
//!
//! **The cache.** K and V page pools `[num_pages, page_size, kv_heads, head_dim]` (the NHD layout
//! of FlashInfer and FlashAttention; each page contiguous, pages any 16-byte-aligned stride apart,
//! so the `[num_pages, 2, page_size, ...]` layout's K and V views work), page size a power of two
//! (16, 32, 64, 128, ...; 16 is the usual), dtype bf16, f16, f32 or fp8 e4m3fn
//! ([`DType::F8E4M3`]: OCP, +-448). fp8 pages carry a scale per tensor or per KV head
//! ([`KvScales`]): stored = fp8(x / scale), read = fp8 * scale. A block table `[batch, max_pages]`
//! i32 lists each sequence's pages; `seq_lens` `[batch]` i32 its number of keys. Both live on the
//! device: a page id outside `[0, num_pages)` is never dereferenced. The kernels skip its keys
//! (they take no part in the softmax) and raise a device-side error flag
//! ([`PagedDecodeWorkspace::check_errors`], [`PagedKvCache::check_errors`], or [`ErrorFlag`] at
//! the view level). A sequence length below 0 or past its block-table row is clamped and flagged
//! the same way.
//!
//! **Append** ([`kv_append_on`]) writes new tokens' k and v (`[tokens, kv_heads, head_dim]`, any
//! token and head strides: views of a fused QKV buffer after RoPE) to their slots (an i64 slot
//! mapping, `page * page_size + row`; -1 skips a token), converting or quantizing (f32 math,
//! round to nearest even, saturating at +-448 for fp8) with 16-byte loads and stores. Slots must
//! be distinct; one outside the pool is skipped and flagged.
//!
//! **Decode** ([`PagedDecodeWorkspace`]): q `[batch * q_len, q_heads, head_dim]`, q_len 1..=8 new
//! tokens per sequence (speculative decoding and multi-token prediction verify several at once),
//! already appended: token i of sequence b sits at position `seq_len - q_len + i` and attends the
//! keys up to it (causal among the new tokens). The q heads of one KV group share the mma rows,
//! so GQA decode runs on tensor cores. The planner ([`PagedDecodeWorkspace::plan`]) runs once per
//! batch shape: it picks the number of splits of each sequence's keys from batch x kv_heads
//! against the SM count and the longest context, and allocates the partial outputs; a call then
//! allocates nothing, copies nothing from the host and never waits (CUDA-graph capturable). With
//! more than one split, each split writes a partial output and its log-sum-exp and a merge kernel
//! combines them in split order: for one plan the output is deterministic.
//! Options ([`PagedDecodeOptions`]): softmax scale, Llama 4 chunked local attention, Llama 4
//! temperature tuning, LSE output. bf16 and f16 (pages of the same dtype or fp8) run on tensor
//! cores; f32 (f32 pages) on a SIMT path for testing. head_dim 32, 64, 96, 128, 256.
//!
//! **Merge** ([`merge_attention_states_on`]): `lse = log(e^lse_a + e^lse_b)`,
//! `o = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b`: the split merge as a public op, for cascade
//! attention over a shared prefix.

use crate::backend::{Device, KernelArgs, KernelRef, LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::attention::Llama4Temperature;
use crate::ops::{Heads, KernelTable, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::params::{
    Fp8ConvertParams, KvAppendParams, LLK_DECODE_KEYS, LLK_DECODE_MAX_Q_LEN, LLK_DECODE_MAX_SPLITS,
    LLK_DECODE_ROWS_MMA, LLK_DECODE_ROWS_SIMT, LLK_DECODE_THREADS, LLK_KV_MAX_SCALES, LlkAttnMask, LlkAttnTemperature,
    LlkDeviceError, MergeStatesParams, PagedDecodeParams,
};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

const APPEND: &str = "kv_append";
const DECODE: &str = "paged_decode_attention";
const MERGE: &str = "merge_attention_states";

/// Head dims with decode (and prefill) kernels.
pub const SUPPORTED_HEAD_DIMS: [usize; 5] = [32, 64, 96, 128, 256];
/// Most query tokens per sequence in one decode call.
pub const MAX_Q_LEN: usize = LLK_DECODE_MAX_Q_LEN as usize;
/// Most KV heads of an fp8 cache (its scales travel in the kernel parameters).
pub const MAX_SCALED_KV_HEADS: usize = LLK_KV_MAX_SCALES as usize;
/// Most splits per sequence.
pub const MAX_SPLITS: usize = LLK_DECODE_MAX_SPLITS as usize;
const KEYS_PER_TILE: usize = LLK_DECODE_KEYS as usize;
const THREADS: u32 = LLK_DECODE_THREADS;

// ----------------------------------------------------------------------------- kernels
static APPEND_KERNELS: KernelTable<(DType, DType)> = KernelTable {
    module: "paged_attention",
    entries: &[
        ((DType::F32, DType::F32), "kv_append_f32_f32"),
        ((DType::F32, DType::F16), "kv_append_f32_f16"),
        ((DType::F32, DType::BF16), "kv_append_f32_bf16"),
        ((DType::F32, DType::F8E4M3), "kv_append_f32_fp8"),
        ((DType::F16, DType::F32), "kv_append_f16_f32"),
        ((DType::F16, DType::F16), "kv_append_f16_f16"),
        ((DType::F16, DType::BF16), "kv_append_f16_bf16"),
        ((DType::F16, DType::F8E4M3), "kv_append_f16_fp8"),
        ((DType::BF16, DType::F32), "kv_append_bf16_f32"),
        ((DType::BF16, DType::F16), "kv_append_bf16_f16"),
        ((DType::BF16, DType::BF16), "kv_append_bf16_bf16"),
        ((DType::BF16, DType::F8E4M3), "kv_append_bf16_fp8"),
    ],
};

macro_rules! decode_entries {
    ($($d:literal),*) => {
        &[$(
            ((DType::BF16, DType::BF16, $d), concat!("paged_decode_hd", $d, "_bf16")),
            ((DType::BF16, DType::F8E4M3, $d), concat!("paged_decode_hd", $d, "_bf16_fp8")),
            ((DType::F16, DType::F16, $d), concat!("paged_decode_hd", $d, "_f16")),
            ((DType::F16, DType::F8E4M3, $d), concat!("paged_decode_hd", $d, "_f16_fp8")),
            ((DType::F32, DType::F32, $d), concat!("paged_decode_hd", $d, "_f32")),
        )*]
    };
}

/// Decode kernels by (q dtype, page dtype, head_dim).
static DECODE_KERNELS: KernelTable<(DType, DType, usize)> =
    KernelTable { module: "paged_attention", entries: decode_entries!(32, 64, 96, 128, 256) };

/// Merge kernels by (split variant, dtype).
static MERGE_KERNELS: KernelTable<(bool, DType)> = KernelTable {
    module: "paged_attention",
    entries: &[
        ((true, DType::F32), "paged_decode_merge_f32"),
        ((true, DType::F16), "paged_decode_merge_f16"),
        ((true, DType::BF16), "paged_decode_merge_bf16"),
        ((false, DType::F32), "merge_states_f32"),
        ((false, DType::F16), "merge_states_f16"),
        ((false, DType::BF16), "merge_states_bf16"),
    ],
};

const FP8_CONVERT: KernelRef = KernelRef { module: "paged_attention", symbol: "fp8_e4m3_convert" };

/// The symbols of this family, for static checks.
pub fn kernel_symbols() -> impl Iterator<Item = KernelRef> {
    APPEND_KERNELS
        .symbols()
        .chain(DECODE_KERNELS.symbols())
        .chain(MERGE_KERNELS.symbols())
        .chain(std::iter::once(FP8_CONVERT))
}

/// Dynamic shared memory of a tensor-core decode kernel (DecodeLayout in
/// kernels/paged_attention.cu): Q rows, and 2 or 3 stages of K and V tiles plus a byte per key.
pub fn decode_smem_bytes(head_dim: usize, page_elem: usize) -> usize {
    let pitch = |chunks: usize| {
        if chunks <= 8 {
            8
        } else if chunks <= 16 {
            16
        } else {
            32
        }
    };
    let rows = LLK_DECODE_ROWS_MMA as usize;
    let q = rows * pitch(head_dim / 8) * 16;
    let tile = KEYS_PER_TILE * pitch(head_dim * page_elem / 16) * 16;
    let stages = if q + 3 * 2 * tile + 3 * KEYS_PER_TILE <= 131072 { 3 } else { 2 };
    q + stages * (2 * tile + KEYS_PER_TILE)
}

// ----------------------------------------------------------------------------- scales and flags
/// The scale of one fp8 pool: stored = fp8(x / scale), read = fp8 * scale.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum KvScale {
    /// 1 (the only choice for bf16, f16 and f32 pages).
    #[default]
    None,
    /// One scale for the whole tensor (vLLM's `k_scale` / `v_scale`).
    PerTensor(f32),
    /// One scale per KV head (`kv_heads` values).
    PerHead(Vec<f32>),
}

/// The scales of a cache's K and V pools.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct KvScales {
    pub k: KvScale,
    pub v: KvScale,
}

impl KvScales {
    /// One scale per tensor for K and for V.
    pub fn per_tensor(k: f32, v: f32) -> KvScales {
        KvScales { k: KvScale::PerTensor(k), v: KvScale::PerTensor(v) }
    }
    /// Checks the scales for a pool of `page_dtype` with `kv_heads` heads and returns them per
    /// head, as the kernels take them.
    pub(crate) fn per_head(
        &self,
        op: &'static str,
        page_dtype: DType,
        kv_heads: usize,
    ) -> Result<([f32; MAX_SCALED_KV_HEADS], [f32; MAX_SCALED_KV_HEADS])> {
        let mut out = [[1f32; MAX_SCALED_KV_HEADS]; 2];
        for (i, (name, s)) in [("k_scale", &self.k), ("v_scale", &self.v)].into_iter().enumerate() {
            if *s == KvScale::None {
                continue;
            }
            if page_dtype != DType::F8E4M3 {
                return Err(Error::invalid(
                    op,
                    name,
                    format!("{s:?}"),
                    format!("scales apply to fp8 pages only, not {page_dtype}"),
                ));
            }
            if kv_heads > MAX_SCALED_KV_HEADS {
                return Err(Error::invalid(
                    op,
                    "kv_heads",
                    kv_heads,
                    format!("an fp8 cache supports at most {MAX_SCALED_KV_HEADS} KV heads"),
                ));
            }
            let values: Vec<f32> = match s {
                KvScale::None => continue,
                KvScale::PerTensor(x) => vec![*x; kv_heads],
                KvScale::PerHead(v) => {
                    if v.len() != kv_heads {
                        return Err(Error::invalid(
                            op,
                            name,
                            format!("{} values", v.len()),
                            format!("needs one per KV head ({kv_heads})"),
                        ));
                    }
                    v.clone()
                }
            };
            if let Some(bad) = values.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
                return Err(Error::invalid(op, name, bad, "must be finite and > 0"));
            }
            out[i][..kv_heads].copy_from_slice(&values);
        }
        Ok((out[0], out[1]))
    }
}

/// A device-side error flag (one i32) that kernels raise on invalid device-resident input (page
/// ids, slots, sequence lengths). Allocated once; [`ErrorFlag::check`] reads and clears it.
#[derive(Debug)]
pub struct ErrorFlag {
    flag: Tensor,
}

impl ErrorFlag {
    pub fn new(device: &Device) -> Result<ErrorFlag> {
        Ok(ErrorFlag { flag: Tensor::zeros(device, DType::I32, &[1])? })
    }
    pub fn device(&self) -> &Device {
        self.flag.device()
    }
    pub(crate) fn tensor(&self) -> &Tensor {
        &self.flag
    }
    /// Reads and clears the flag (waits for the device): `Err` names what the kernels found.
    pub fn check(&self, op: &'static str) -> Result<()> {
        check_flag(op, &self.flag)
    }
}

/// Reads and clears an i32 error flag, naming its bits.
pub(crate) fn check_flag(op: &'static str, flag: &Tensor) -> Result<()> {
    let bits = flag.to_vec::<i32>()?[0];
    if bits == 0 {
        return Ok(());
    }
    flag.copy_from_slice(&[0i32])?;
    let mut what = Vec::new();
    if bits & LlkDeviceError::LLK_DEVICE_BAD_SEQLENS as i32 != 0 {
        what.push("sequence lengths or offsets (negative, decreasing, or past the block table)");
    }
    if bits & LlkDeviceError::LLK_DEVICE_BAD_PAGE as i32 != 0 {
        what.push("a page id or slot outside the page pool (its keys were skipped)");
    }
    if what.is_empty() {
        what.push("unknown error bits");
    }
    Err(Error::DeviceReported { op, what: format!("{} [flag {bits:#x}]", what.join("; ")) })
}

// ----------------------------------------------------------------------------- pools
/// Borrowed K and V page pools of one layer, with their scales (the view-level cache).
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'r, 'a> {
    /// `[num_pages, page_size, kv_heads, head_dim]`, each page contiguous.
    pub k_pages: &'r TensorView<'a>,
    /// Like `k_pages`.
    pub v_pages: &'r TensorView<'a>,
    pub scales: &'r KvScales,
}

/// A page pool as the kernels address it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pool {
    pub addr: u64,
    pub dtype: DType,
    pub num_pages: usize,
    pub page_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub page_stride: usize,
}

impl Pool {
    pub fn of(op: &'static str, what: &'static str, b: &crate::backend::args::Bound) -> Result<Pool> {
        let (shape, strides) = (b.shape(), b.strides());
        if shape.len() != 4 {
            return Err(Error::ShapeMismatch {
                op,
                what,
                got: shape.to_vec(),
                expected: "[num_pages, page_size, kv_heads, head_dim]".into(),
            });
        }
        let (num_pages, page_size, kv_heads, head_dim) = (shape[0], shape[1], shape[2], shape[3]);
        let page_elems = page_size
            .checked_mul(kv_heads)
            .and_then(|x| x.checked_mul(head_dim))
            .ok_or_else(|| Error::TooLarge { what, shape: shape.to_vec() })?;
        if page_elems >= 1 << 31 {
            return Err(Error::invalid(op, "page elements", page_elems, "must be < 2^31"));
        }
        if !page_size.is_power_of_two() {
            return Err(Error::invalid(op, "page_size", page_size, "must be a power of two (16, 32, 64, 128, ...)"));
        }
        let bad = |why| Error::BadLayout { op, what, shape: shape.to_vec(), strides: strides.to_vec(), why };
        // Each page [page_size, kv_heads, head_dim] contiguous (unit dims may have any stride).
        let mut expect = 1usize;
        for d in (1..4).rev() {
            if shape[d] > 1 && strides[d] != expect {
                return Err(bad("each page [page_size, kv_heads, head_dim] must be contiguous"));
            }
            expect *= shape[d];
        }
        let page_stride = if num_pages > 1 { strides[0] } else { page_elems };
        if num_pages > 1 && page_stride < page_elems && page_elems > 0 {
            return Err(bad("pages overlap (page stride smaller than a page)"));
        }
        Ok(Pool { addr: b.addr, dtype: b.dtype, num_pages, page_size, kv_heads, head_dim, page_stride })
    }
    pub fn rows(&self) -> Rows {
        let cols = self.page_size * self.kv_heads * self.head_dim;
        Rows {
            addr: self.addr,
            elem: self.dtype.size(),
            rows: self.num_pages,
            cols,
            row_stride: self.page_stride.max(cols),
        }
    }
    pub fn check_aligned(&self, op: &'static str, what: &'static str) -> Result<()> {
        let e = self.dtype.size();
        if self.addr % 16 != 0 || (self.page_stride * e) % 16 != 0 || (self.head_dim * e) % 16 != 0 {
            return Err(Error::BadLayout {
                op,
                what,
                shape: vec![self.num_pages, self.page_size, self.kv_heads, self.head_dim],
                strides: vec![self.page_stride, self.kv_heads * self.head_dim, self.head_dim, 1],
                why: "pages and rows must be 16-byte aligned (address, page stride, head_dim bytes)",
            });
        }
        Ok(())
    }
}

/// Checks that K and V pools match and returns K's.
pub(crate) fn check_pools(op: &'static str, k: &Pool, v: &Pool) -> Result<()> {
    if v.dtype != k.dtype {
        return Err(Error::DTypeMismatch { op, what: "v_pages", got: v.dtype, expected: k.dtype });
    }
    if (v.num_pages, v.page_size, v.kv_heads, v.head_dim) != (k.num_pages, k.page_size, k.kv_heads, k.head_dim) {
        return Err(Error::ShapeMismatch {
            op,
            what: "v_pages",
            got: vec![v.num_pages, v.page_size, v.kv_heads, v.head_dim],
            expected: format!("{:?} like k_pages", [k.num_pages, k.page_size, k.kv_heads, k.head_dim]),
        });
    }
    if k.kv_heads == 0 {
        return Err(Error::invalid(op, "kv_heads", 0, "must be > 0"));
    }
    check_disjoint(op, ("k_pages", k.rows()), ("v_pages", v.rows()))
}

/// Checks a block table `[batch, max_pages]` i32 (last dim contiguous) and returns
/// `(max_pages, row stride)`.
pub(crate) fn check_block_table(
    op: &'static str,
    b: &crate::backend::args::Bound,
    batch: usize,
) -> Result<(usize, usize)> {
    check_dtype(op, "block_table", b.dtype, DType::I32)?;
    let shape = b.shape();
    if shape.len() != 2 || shape[0] != batch {
        return Err(Error::ShapeMismatch {
            op,
            what: "block_table",
            got: shape.to_vec(),
            expected: format!("[{batch}, max_pages] (batch, pages per sequence)"),
        });
    }
    let strides = b.strides();
    if shape[1] > 1 && strides[1] != 1 {
        return Err(Error::BadLayout {
            op,
            what: "block_table",
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why: "rows must be contiguous",
        });
    }
    let row_stride = if batch > 1 { strides[0] } else { shape[1] };
    Ok((shape[1], row_stride))
}

fn table_rows(b: &crate::backend::args::Bound, max_pages: usize, stride: usize) -> Rows {
    Rows { addr: b.addr, elem: 4, rows: b.shape()[0], cols: max_pages, row_stride: stride.max(max_pages) }
}

// ----------------------------------------------------------------------------- append
/// Writes `k` and `v` (`[tokens, kv_heads, head_dim]`, f32/f16/bf16, any token and head strides,
/// 16-byte aligned rows) into the pools at `slot_mapping` (`[tokens]` i64: `page * page_size +
/// row`, -1 skips the token), converting to the pools' dtype (fp8: `x / scale`, rounded to nearest
/// even, saturating). A slot outside the pool (or below -1) is skipped and raises `errors`.
#[allow(clippy::too_many_arguments)]
pub fn kv_append_on(
    queue: &impl Queue,
    k: &TensorView<'_>,
    v: &TensorView<'_>,
    slot_mapping: &TensorView<'_>,
    k_pages: &mut TensorViewMut<'_>,
    v_pages: &mut TensorViewMut<'_>,
    scales: &KvScales,
    errors: &ErrorFlag,
) -> Result<()> {
    const OP: &str = APPEND;
    let device = queue.queue_device()?;
    if !device.same_context(errors.device()) {
        return Err(Error::DeviceMismatch { op: OP, what: "error flag" });
    }
    check_float(OP, "k", k.dtype())?;
    check_dtype(OP, "v", v.dtype(), k.dtype())?;
    check_dtype(OP, "slot_mapping", slot_mapping.dtype(), DType::I64)?;
    let mut args = KernelArgs::new(OP, &device);
    let (kpb, vpb) = (args.write("k_pages", k_pages)?, args.write("v_pages", v_pages)?);
    let (kb, vb, sb) = (args.read("k", k)?, args.read("v", v)?, args.read("slot_mapping", slot_mapping)?);
    let flag = args.write_tensor("error flag", errors.tensor())?;
    let (kp, vp) = (Pool::of(OP, "k_pages", &kpb)?, Pool::of(OP, "v_pages", &vpb)?);
    check_pools(OP, &kp, &vp)?;
    let (kh, vh) = (Heads::of(OP, "k", &kb)?, Heads::of(OP, "v", &vb)?);
    for (what, b, h) in [("k", &kb, &kh), ("v", &vb, &vh)] {
        if (h.heads, h.head_dim) != (kp.kv_heads, kp.head_dim) || h.tokens != kh.tokens {
            return Err(Error::ShapeMismatch {
                op: OP,
                what,
                got: b.shape().to_vec(),
                expected: format!(
                    "[{}, {}, {}] (tokens, the pool's kv_heads and head_dim)",
                    kh.tokens, kp.kv_heads, kp.head_dim
                ),
            });
        }
    }
    if sb.shape() != [kh.tokens] || !sb.dims.is_contiguous() {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "slot_mapping",
            got: sb.shape().to_vec(),
            expected: format!("contiguous [{}] (one slot per token)", kh.tokens),
        });
    }
    if kp.head_dim % 16 != 0 {
        return Err(Error::invalid(OP, "head_dim", kp.head_dim, "must be a multiple of 16"));
    }
    let (k_scale, v_scale) = scales.per_head(OP, kp.dtype, kp.kv_heads)?;
    // Output pools vs inputs.
    let slots = Rows { addr: sb.addr, elem: 8, rows: 1, cols: kh.tokens, row_stride: kh.tokens };
    for (pw, p) in [("k_pages", kp), ("v_pages", vp)] {
        check_disjoint(OP, (pw, p.rows()), ("k", kh))?;
        check_disjoint(OP, (pw, p.rows()), ("v", vh))?;
        check_disjoint(OP, (pw, p.rows()), ("slot_mapping", slots))?;
    }
    if kh.tokens == 0 {
        return Ok(());
    }
    // (An empty pool still launches: every slot but -1 is then outside it, which the flag says.)
    for (what, h) in [("k", &kh), ("v", &vh)] {
        h.check_rows_aligned(OP, what)?;
    }
    kp.check_aligned(OP, "k_pages")?;
    vp.check_aligned(OP, "v_pages")?;
    let elem = k.dtype().size().min(kp.dtype.size());
    let per_thread = 16 / elem;
    let threads = kh
        .tokens
        .checked_mul(2 * kp.kv_heads * (kp.head_dim / per_thread))
        .ok_or_else(|| Error::TooLarge { what: "k", shape: vec![kh.tokens, kp.kv_heads, kp.head_dim] })?;
    let params = KvAppendParams {
        k: kb.addr,
        v: vb.addr,
        slot_mapping: sb.addr,
        k_pages: kpb.addr,
        v_pages: vpb.addr,
        error_flag: flag,
        tokens: to_i64(OP, "tokens", kh.tokens)?,
        kv_heads: to_i64(OP, "kv_heads", kp.kv_heads)?,
        head_dim: to_i64(OP, "head_dim", kp.head_dim)?,
        num_pages: to_i64(OP, "num_pages", kp.num_pages)?,
        page_size: to_i64(OP, "page_size", kp.page_size)?,
        k_token_stride: to_i64(OP, "k token stride", kh.token_stride)?,
        k_head_stride: to_i64(OP, "k head stride", kh.head_stride)?,
        v_token_stride: to_i64(OP, "v token stride", vh.token_stride)?,
        v_head_stride: to_i64(OP, "v head stride", vh.head_stride)?,
        k_page_stride: to_i64(OP, "k page stride", kp.page_stride)?,
        v_page_stride: to_i64(OP, "v page stride", vp.page_stride)?,
        k_scale,
        v_scale,
    };
    let dims = LaunchDims { grid: (grid_x(OP, threads.div_ceil(256))?, 1, 1), block: (256, 1, 1), dyn_smem: 0 };
    let kernel = APPEND_KERNELS.find(OP, "k_pages", (k.dtype(), kp.dtype), kp.dtype)?;
    args.launch(kernel, dims, &params)
}

// ----------------------------------------------------------------------------- the cache (tensors)
/// The shape and dtype of a paged KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct PagedKvConfig {
    pub num_pages: usize,
    /// A power of two; 16 is the usual choice.
    pub page_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// bf16, f16, f32 or fp8 ([`DType::F8E4M3`]).
    pub dtype: DType,
    /// fp8 only; [`KvScales::default`] (no scale) otherwise.
    pub scales: KvScales,
}

/// A paged KV cache of one layer owned by this crate: K and V pools, their scales and an error
/// flag (the tensor-level convenience over [`PagedKv`] and [`kv_append_on`]).
#[derive(Debug)]
pub struct PagedKvCache {
    config: PagedKvConfig,
    k_pages: Tensor,
    v_pages: Tensor,
    errors: ErrorFlag,
}

impl PagedKvCache {
    /// Allocates zeroed pools (checks the configuration first).
    pub fn new(device: &Device, config: &PagedKvConfig) -> Result<PagedKvCache> {
        const OP: &str = "PagedKvCache";
        if !(config.dtype.is_float() || config.dtype == DType::F8E4M3) {
            return Err(Error::UnsupportedDType {
                op: OP,
                what: "pages",
                dtype: config.dtype,
                supported: "f32, f16, bf16, fp8",
            });
        }
        if !config.page_size.is_power_of_two() {
            return Err(Error::invalid(
                OP,
                "page_size",
                config.page_size,
                "must be a power of two (16, 32, 64, 128, ...)",
            ));
        }
        if config.kv_heads == 0 {
            return Err(Error::invalid(OP, "kv_heads", 0, "must be > 0"));
        }
        config.scales.per_head(OP, config.dtype, config.kv_heads)?;
        let shape = [config.num_pages, config.page_size, config.kv_heads, config.head_dim];
        Ok(PagedKvCache {
            config: config.clone(),
            k_pages: Tensor::zeros(device, config.dtype, &shape)?,
            v_pages: Tensor::zeros(device, config.dtype, &shape)?,
            errors: ErrorFlag::new(device)?,
        })
    }
    pub fn config(&self) -> &PagedKvConfig {
        &self.config
    }
    pub fn k_pages(&self) -> &Tensor {
        &self.k_pages
    }
    pub fn v_pages(&self) -> &Tensor {
        &self.v_pages
    }
    pub fn scales(&self) -> &KvScales {
        &self.config.scales
    }
    pub fn device(&self) -> &Device {
        self.k_pages.device()
    }
    /// The error flag appends raise (bad slots).
    pub fn error_flag(&self) -> &ErrorFlag {
        &self.errors
    }
    /// Appends new tokens (see [`kv_append_on`]); `slot_mapping` is an i64 tensor.
    pub fn append(&self, k: &Tensor, v: &Tensor, slot_mapping: &Tensor) -> Result<()> {
        let (mut kp, mut vp) = (TensorViewMut::of_tensor(&self.k_pages), TensorViewMut::of_tensor(&self.v_pages));
        kv_append_on(
            self.device(),
            &k.view(),
            &v.view(),
            &slot_mapping.view(),
            &mut kp,
            &mut vp,
            &self.config.scales,
            &self.errors,
        )
    }
    /// Reads and clears the cache's error flag (appends with a bad slot).
    pub fn check_errors(&self) -> Result<()> {
        self.errors.check(APPEND)
    }
}

// ----------------------------------------------------------------------------- decode
/// The batch shape a decode plan is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    /// Largest batch (sequences) of the calls.
    pub batch: usize,
    /// New tokens per sequence (1..=8).
    pub q_len: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Longest context (keys, the new tokens included) the calls may have: it sizes the split
    /// count, and every call's block table must hold at least `ceil(max_seq_len / page_size)`
    /// pages per row. A longer sequence on the device is clamped to its block-table row and
    /// flagged.
    pub max_seq_len: usize,
    /// q and output dtype.
    pub dtype: DType,
    /// Page dtype: the q dtype or fp8 for bf16/f16, f32 for f32.
    pub page_dtype: DType,
}

/// Options of one decode call.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct PagedDecodeOptions {
    /// Softmax scale, finite and > 0; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Llama 4 chunked local attention: only keys in the query's chunk `floor(pos / chunk_size)`.
    pub chunk_size: Option<usize>,
    /// Llama 4 temperature tuning, from each query's absolute position.
    pub temperature: Option<Llama4Temperature>,
}

/// The split count the planner picks: enough (sequence, kv head, split) blocks for about two per
/// SM, at least 4 tiles (256 keys) per split, at most [`MAX_SPLITS`]. Deterministic in its inputs.
pub fn plan_splits(sm_count: usize, blocks_per_split: usize, max_seq_len: usize) -> usize {
    let target = 2 * sm_count.max(1);
    let by_fill = (target / blocks_per_split.max(1)).max(1);
    let tiles = max_seq_len.div_ceil(KEYS_PER_TILE).max(1);
    let by_length = tiles.div_ceil(4).max(1);
    by_fill.min(by_length).min(MAX_SPLITS)
}

/// A planned decode: the split count for one batch shape, the partial outputs of the splits and
/// an error flag. Plan once per batch shape; calls then allocate nothing.
#[derive(Debug)]
pub struct PagedDecodeWorkspace {
    device: Device,
    shape: DecodeShape,
    num_splits: usize,
    rows_per_block: usize,
    /// `[num_splits, batch * q_len, q_heads, head_dim]` and `[num_splits, batch * q_len, q_heads]`
    /// f32 (num_splits > 1).
    partial: Option<(Tensor, Tensor)>,
    errors: ErrorFlag,
}

impl PagedDecodeWorkspace {
    /// Plans a decode for `shape` on `device`, picking the split count ([`plan_splits`]).
    pub fn plan(device: &Device, shape: &DecodeShape) -> Result<PagedDecodeWorkspace> {
        Self::plan_with_splits(device, shape, None)
    }

    /// [`PagedDecodeWorkspace::plan`] with an explicit split count (1..=[`MAX_SPLITS`]).
    pub fn plan_with_splits(
        device: &Device,
        shape: &DecodeShape,
        num_splits: Option<usize>,
    ) -> Result<PagedDecodeWorkspace> {
        const OP: &str = DECODE;
        let s = *shape;
        check_float(OP, "q", s.dtype)?;
        let pages_ok = match s.dtype {
            DType::F32 => s.page_dtype == DType::F32,
            _ => s.page_dtype == s.dtype || s.page_dtype == DType::F8E4M3,
        };
        if !pages_ok {
            return Err(Error::UnsupportedDType {
                op: OP,
                what: "pages",
                dtype: s.page_dtype,
                supported: "the q dtype, or fp8 with bf16/f16 q",
            });
        }
        if !SUPPORTED_HEAD_DIMS.contains(&s.head_dim) {
            return Err(Error::invalid(
                OP,
                "head_dim",
                s.head_dim,
                format!("unsupported (supported: {SUPPORTED_HEAD_DIMS:?})"),
            ));
        }
        if s.kv_heads == 0 {
            return Err(Error::invalid(OP, "kv_heads", 0, "must be > 0"));
        }
        if s.q_heads % s.kv_heads != 0 {
            return Err(Error::invalid(OP, "q_heads", s.q_heads, format!("not divisible by kv_heads {}", s.kv_heads)));
        }
        if !(1..=MAX_Q_LEN).contains(&s.q_len) {
            return Err(Error::invalid(OP, "q_len", s.q_len, format!("must be 1..={MAX_Q_LEN}")));
        }
        if s.max_seq_len > i32::MAX as usize {
            return Err(Error::invalid(OP, "max_seq_len", s.max_seq_len, "must fit in i32"));
        }
        let rows_per_block = if s.dtype == DType::F32 { LLK_DECODE_ROWS_SIMT } else { LLK_DECODE_ROWS_MMA } as usize;
        let group = s.q_heads / s.kv_heads;
        let row_blocks = (group * s.q_len).div_ceil(rows_per_block).max(1);
        let num_splits = match num_splits {
            Some(n) if n == 0 || n > MAX_SPLITS => {
                return Err(Error::invalid(OP, "num_splits", n, format!("must be 1..={MAX_SPLITS}")));
            }
            Some(n) => n,
            None => plan_splits(device.sm_count(), s.batch.max(1) * s.kv_heads * row_blocks, s.max_seq_len),
        };
        let tokens = s.batch.checked_mul(s.q_len).ok_or_else(|| Error::invalid(OP, "batch", s.batch, "too large"))?;
        let partial = if num_splits > 1 {
            let too_large =
                || Error::TooLarge { what: "decode workspace", shape: vec![num_splits, tokens, s.q_heads, s.head_dim] };
            let rows = num_splits.checked_mul(tokens).and_then(|n| n.checked_mul(s.q_heads)).ok_or_else(too_large)?;
            let elems = rows.checked_mul(s.head_dim).ok_or_else(too_large)?;
            Some((
                Tensor::zeros(device, DType::F32, &[elems.max(1)])?,
                Tensor::zeros(device, DType::F32, &[rows.max(1)])?,
            ))
        } else {
            None
        };
        Ok(PagedDecodeWorkspace {
            device: device.clone(),
            shape: s,
            num_splits,
            rows_per_block,
            partial,
            errors: ErrorFlag::new(device)?,
        })
    }

    /// The planned split count.
    pub fn num_splits(&self) -> usize {
        self.num_splits
    }
    /// The shape this workspace was planned for.
    pub fn shape(&self) -> &DecodeShape {
        &self.shape
    }
    /// Reads and clears the device-side error flag (waits for the device).
    pub fn check_errors(&self) -> Result<()> {
        self.errors.check(DECODE)
    }

    /// Decode over a [`PagedKvCache`] (see the module docs); `block_table` `[batch, max_pages]`
    /// i32, `seq_lens` `[batch]` i32, `out` like q, `lse` `[q_heads, batch * q_len]` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        q: &Tensor,
        cache: &PagedKvCache,
        block_table: &Tensor,
        seq_lens: &Tensor,
        out: &Tensor,
        lse: Option<&Tensor>,
        opts: &PagedDecodeOptions,
    ) -> Result<()> {
        let (kv, vv) = (cache.k_pages.view(), cache.v_pages.view());
        let kv = PagedKv { k_pages: &kv, v_pages: &vv, scales: &cache.config.scales };
        let mut lse = lse.map(TensorViewMut::of_tensor);
        self.forward_on(
            q.device(),
            &q.view(),
            &kv,
            &block_table.view(),
            &seq_lens.view(),
            &mut TensorViewMut::of_tensor(out),
            lse.as_mut(),
            opts,
        )
    }

    /// Decode on borrowed views, queued on `queue`. `seq_lens.len()` is the batch (at most the
    /// planned one), q has `batch * q_len` tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_on(
        &mut self,
        queue: &impl Queue,
        q: &TensorView<'_>,
        kv: &PagedKv<'_, '_>,
        block_table: &TensorView<'_>,
        seq_lens: &TensorView<'_>,
        out: &mut TensorViewMut<'_>,
        lse: Option<&mut TensorViewMut<'_>>,
        opts: &PagedDecodeOptions,
    ) -> Result<()> {
        const OP: &str = DECODE;
        let mut lse = lse;
        let device = queue.queue_device()?;
        if !device.same_context(&self.device) {
            return Err(Error::DeviceMismatch { op: OP, what: "workspace" });
        }
        let plan = self.shape;
        check_dtype(OP, "q", q.dtype(), plan.dtype)?;
        check_dtype(OP, "out", out.dtype(), plan.dtype)?;
        check_dtype(OP, "k_pages", kv.k_pages.dtype(), plan.page_dtype)?;
        check_dtype(OP, "seq_lens", seq_lens.dtype(), DType::I32)?;
        if let Some(l) = &lse {
            check_dtype(OP, "lse", l.dtype(), DType::F32)?;
        }
        let mut args = KernelArgs::new(OP, &device);
        let ob = args.write("out", out)?;
        let lb = match lse.as_deref_mut() {
            Some(l) => Some(args.write("lse", l)?),
            None => None,
        };
        let qb = args.read("q", q)?;
        let (kpb, vpb) = (args.read("k_pages", kv.k_pages)?, args.read("v_pages", kv.v_pages)?);
        let (tb, sb) = (args.read("block_table", block_table)?, args.read("seq_lens", seq_lens)?);
        let flag = args.write_tensor("error flag", self.errors.tensor())?;
        let (kp, vp) = (Pool::of(OP, "k_pages", &kpb)?, Pool::of(OP, "v_pages", &vpb)?);
        check_pools(OP, &kp, &vp)?;
        if (kp.kv_heads, kp.head_dim) != (plan.kv_heads, plan.head_dim) {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "k_pages",
                got: kpb.shape().to_vec(),
                expected: format!(
                    "[pages, page_size, {}, {}] (the planned kv_heads and head_dim)",
                    plan.kv_heads, plan.head_dim
                ),
            });
        }
        // Batch from seq_lens.
        if sb.shape().len() != 1 || !sb.dims.is_contiguous() {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "seq_lens",
                got: sb.shape().to_vec(),
                expected: "a contiguous [batch] vector".into(),
            });
        }
        let batch = sb.shape()[0];
        if batch > plan.batch {
            return Err(Error::invalid(OP, "batch", batch, format!("exceeds the planned batch {}", plan.batch)));
        }
        let tokens = batch * plan.q_len;
        let (qh, oh) = (Heads::of(OP, "q", &qb)?, Heads::of(OP, "out", &ob)?);
        for (what, b, h) in [("q", &qb, &qh), ("out", &ob, &oh)] {
            if (h.tokens, h.heads, h.head_dim) != (tokens, plan.q_heads, plan.head_dim) {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what,
                    got: b.shape().to_vec(),
                    expected: format!(
                        "[{tokens}, {}, {}] (batch {batch} x q_len {}, q_heads, head_dim)",
                        plan.q_heads, plan.head_dim, plan.q_len
                    ),
                });
            }
        }
        let (max_pages, table_stride) = check_block_table(OP, &tb, batch)?;
        let needed = plan.max_seq_len.div_ceil(kp.page_size);
        if max_pages < needed {
            return Err(Error::invalid(
                OP,
                "block_table",
                format!("{max_pages} pages per row"),
                format!("too narrow: max_seq_len {} needs {needed} pages of {}", plan.max_seq_len, kp.page_size),
            ));
        }
        if let Some(l) = &lb {
            if l.shape() != [plan.q_heads, tokens] || !l.dims.is_contiguous() {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what: "lse",
                    got: l.shape().to_vec(),
                    expected: format!("contiguous [{}, {tokens}] (q_heads, batch * q_len)", plan.q_heads),
                });
            }
        }
        let (k_scale, v_scale) = kv.scales.per_head(OP, kp.dtype, kp.kv_heads)?;
        // Options.
        let scale = opts.scale.unwrap_or(1.0 / (plan.head_dim as f32).sqrt());
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::invalid(OP, "scale", scale, "must be finite and > 0"));
        }
        let (mask, chunk_size) = match opts.chunk_size {
            None => (LlkAttnMask::LLK_ATTN_CAUSAL, 0),
            Some(0) => return Err(Error::invalid(OP, "chunk_size", 0, "must be > 0")),
            Some(c) => (LlkAttnMask::LLK_ATTN_CHUNKED_CAUSAL, c),
        };
        check_temperature(OP, opts.temperature)?;
        // Aliasing: out and lse are written.
        let tables = table_rows(&tb, max_pages, table_stride);
        let lens = Rows { addr: sb.addr, elem: 4, rows: 1, cols: batch, row_stride: batch };
        check_disjoint(OP, ("out", oh), ("q", qh))?;
        for (what, r) in [("k_pages", kp.rows()), ("v_pages", vp.rows()), ("block_table", tables), ("seq_lens", lens)] {
            check_disjoint(OP, ("out", oh), (what, r))?;
        }
        if let Some(l) = &lb {
            let lrows =
                Rows { addr: l.addr, elem: 4, rows: 1, cols: plan.q_heads * tokens, row_stride: plan.q_heads * tokens };
            check_disjoint(OP, ("lse", lrows), ("q", qh))?;
            check_disjoint(OP, ("lse", lrows), ("out", oh))?;
            for (what, r) in
                [("k_pages", kp.rows()), ("v_pages", vp.rows()), ("block_table", tables), ("seq_lens", lens)]
            {
                check_disjoint(OP, ("lse", lrows), (what, r))?;
            }
        }
        // Layout: 16-byte rows for the vector and cp.async paths.
        for (what, h) in [("q", &qh), ("out", &oh)] {
            h.check_rows_aligned(OP, what)?;
        }
        kp.check_aligned(OP, "k_pages")?;
        vp.check_aligned(OP, "v_pages")?;
        if batch == 0 || plan.q_heads == 0 {
            return Ok(());
        }

        let group = plan.q_heads / plan.kv_heads;
        let row_blocks = (group * plan.q_len).div_ceil(self.rows_per_block);
        let splits = self.num_splits;
        let grid_y = u32::try_from(plan.kv_heads * row_blocks)
            .ok()
            .filter(|&y| y <= 65535)
            .ok_or_else(|| Error::invalid(OP, "kv_heads", plan.kv_heads, "too many head blocks for grid.y (65535)"))?;
        let (po, pl) = match &self.partial {
            Some((o, l)) => (args.write_tensor("workspace", o)?, args.write_tensor("workspace", l)?),
            None => (0, 0),
        };
        let params = PagedDecodeParams {
            q: qb.addr,
            k_pages: kpb.addr,
            v_pages: vpb.addr,
            block_table: tb.addr,
            seq_lens: sb.addr,
            out: if splits == 1 { ob.addr } else { 0 },
            lse: if splits == 1 { lb.map_or(0, |l| l.addr) } else { 0 },
            partial_out: po,
            partial_lse: pl,
            error_flag: flag,
            batch: to_i64(OP, "batch", batch)?,
            q_len: to_i64(OP, "q_len", plan.q_len)?,
            q_heads: to_i64(OP, "q_heads", plan.q_heads)?,
            kv_heads: to_i64(OP, "kv_heads", plan.kv_heads)?,
            head_dim: to_i64(OP, "head_dim", plan.head_dim)?,
            num_pages: to_i64(OP, "num_pages", kp.num_pages)?,
            page_size: to_i64(OP, "page_size", kp.page_size)?,
            max_pages: to_i64(OP, "max_pages", max_pages)?,
            block_table_stride: to_i64(OP, "block table stride", table_stride)?,
            q_token_stride: to_i64(OP, "q token stride", qh.token_stride)?,
            q_head_stride: to_i64(OP, "q head stride", qh.head_stride)?,
            out_token_stride: to_i64(OP, "out token stride", oh.token_stride)?,
            out_head_stride: to_i64(OP, "out head stride", oh.head_stride)?,
            k_page_stride: to_i64(OP, "k page stride", kp.page_stride)?,
            v_page_stride: to_i64(OP, "v page stride", vp.page_stride)?,
            num_splits: to_i64(OP, "num_splits", splits)?,
            row_blocks: to_i64(OP, "row blocks", row_blocks)?,
            chunk_size: to_i64(OP, "chunk_size", chunk_size)?,
            mask,
            temperature: temperature_kind(opts.temperature),
            scale,
            temp_floor_scale: opts.temperature.map_or(1.0, |t| t.floor_scale),
            temp_attn_scale: opts.temperature.map_or(0.0, |t| t.attn_scale),
            k_scale,
            v_scale,
        };
        let mma = plan.dtype != DType::F32;
        let dims = LaunchDims {
            grid: (grid_x(OP, batch * splits)?, grid_y, 1),
            block: (THREADS, 1, 1),
            dyn_smem: if mma { decode_smem_bytes(plan.head_dim, kp.dtype.size()) as u32 } else { 0 },
        };
        let kernel = DECODE_KERNELS.find(OP, "q", (plan.dtype, kp.dtype, plan.head_dim), plan.dtype)?;
        if splits == 1 {
            return args.launch(kernel, dims, &params);
        }
        // The splits, then their merge into out (and lse), in a second launch.
        args.launch(kernel, dims, &params)?;
        let Some((po_t, pl_t)) = &self.partial else {
            return Err(Error::InvalidView { what: OP, why: "workspace not planned".into() });
        };
        let mut margs = KernelArgs::new(OP, &device);
        let ob = margs.write("out", out)?;
        let lb = match lse {
            Some(l) => Some(margs.write("lse", l)?),
            None => None,
        };
        let merge = MergeStatesParams {
            v_a: margs.read_tensor("workspace", po_t)?,
            lse_a: margs.read_tensor("workspace", pl_t)?,
            v_b: 0,
            lse_b: 0,
            out: ob.addr,
            lse_out: lb.map_or(0, |l| l.addr),
            tokens: to_i64(OP, "tokens", tokens)?,
            heads: to_i64(OP, "q_heads", plan.q_heads)?,
            head_dim: to_i64(OP, "head_dim", plan.head_dim)?,
            num_states: to_i64(OP, "num_splits", splits)?,
            a_token_stride: 0,
            a_head_stride: 0,
            b_token_stride: 0,
            b_head_stride: 0,
            out_token_stride: to_i64(OP, "out token stride", oh.token_stride)?,
            out_head_stride: to_i64(OP, "out head stride", oh.head_stride)?,
            lse_a_token_stride: 0,
            lse_a_head_stride: 0,
            lse_b_token_stride: 0,
            lse_b_head_stride: 0,
            lse_out_token_stride: 1,
            lse_out_head_stride: to_i64(OP, "tokens", tokens)?,
        };
        let rows = tokens * plan.q_heads;
        let mdims = LaunchDims { grid: (grid_x(OP, rows.div_ceil(4))?, 1, 1), block: (THREADS, 1, 1), dyn_smem: 0 };
        margs.launch(MERGE_KERNELS.find(OP, "out", (true, plan.dtype), plan.dtype)?, mdims, &merge)
    }
}

pub(crate) fn check_temperature(op: &'static str, t: Option<Llama4Temperature>) -> Result<()> {
    if let Some(t) = &t {
        if !(t.floor_scale.is_finite() && t.floor_scale > 0.0) {
            return Err(Error::invalid(op, "temperature floor_scale", t.floor_scale, "must be finite and > 0"));
        }
        if !(t.attn_scale.is_finite() && t.attn_scale >= 0.0) {
            return Err(Error::invalid(op, "temperature attn_scale", t.attn_scale, "must be finite and >= 0"));
        }
    }
    Ok(())
}

fn temperature_kind(t: Option<Llama4Temperature>) -> LlkAttnTemperature {
    if t.is_some() {
        LlkAttnTemperature::LLK_ATTN_LLAMA4_TEMPERATURE
    } else {
        LlkAttnTemperature::LLK_ATTN_NO_TEMPERATURE
    }
}

// ----------------------------------------------------------------------------- merge
/// A `[heads, tokens]` (or any 2-D) f32 LSE view as `(addr, token stride, head stride)`.
fn lse_layout(
    op: &'static str,
    what: &'static str,
    b: &crate::backend::args::Bound,
    heads: usize,
    tokens: usize,
) -> Result<(u64, usize, usize)> {
    check_dtype(op, what, b.dtype, DType::F32)?;
    if b.shape() != [heads, tokens] {
        return Err(Error::ShapeMismatch {
            op,
            what,
            got: b.shape().to_vec(),
            expected: format!("[{heads}, {tokens}] (heads, tokens)"),
        });
    }
    let s = b.strides();
    Ok((b.addr, s[1], s[0]))
}

/// Merges two attention states over disjoint key sets: `lse = log(e^lse_a + e^lse_b)`,
/// `out = e^(lse_a - lse) v_a + e^(lse_b - lse) v_b` (FlashInfer's `merge_state`, vLLM's
/// `merge_attn_states`). `v_a`, `v_b`, `out`: `[tokens, heads, head_dim]` of one float dtype, any
/// token/head strides; `lse_a`, `lse_b`, `lse_out`: f32 `[heads, tokens]` (the layout attention's
/// LSE output has), any strides. A state with `lse = -inf` (no keys) contributes nothing; both
/// empty give zeros and `-inf`. f32 math. Outputs must not overlap the inputs.
#[allow(clippy::too_many_arguments)]
pub fn merge_attention_states_on(
    queue: &impl Queue,
    v_a: &TensorView<'_>,
    lse_a: &TensorView<'_>,
    v_b: &TensorView<'_>,
    lse_b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    lse_out: Option<&mut TensorViewMut<'_>>,
) -> Result<()> {
    const OP: &str = MERGE;
    let device = queue.queue_device()?;
    let dtype = v_a.dtype();
    check_float(OP, "v_a", dtype)?;
    check_dtype(OP, "v_b", v_b.dtype(), dtype)?;
    check_dtype(OP, "out", out.dtype(), dtype)?;
    let mut args = KernelArgs::new(OP, &device);
    let ob = args.write("out", out)?;
    let lob = match lse_out {
        Some(l) => Some(args.write("lse_out", l)?),
        None => None,
    };
    let (ab, bb) = (args.read("v_a", v_a)?, args.read("v_b", v_b)?);
    let (lab, lbb) = (args.read("lse_a", lse_a)?, args.read("lse_b", lse_b)?);
    let (ah, bh, oh) = (Heads::of(OP, "v_a", &ab)?, Heads::of(OP, "v_b", &bb)?, Heads::of(OP, "out", &ob)?);
    for (what, b, h) in [("v_b", &bb, &bh), ("out", &ob, &oh)] {
        if (h.tokens, h.heads, h.head_dim) != (ah.tokens, ah.heads, ah.head_dim) {
            return Err(Error::ShapeMismatch {
                op: OP,
                what,
                got: b.shape().to_vec(),
                expected: format!("{:?} like v_a", ab.shape()),
            });
        }
    }
    let (tokens, heads) = (ah.tokens, ah.heads);
    let la = lse_layout(OP, "lse_a", &lab, heads, tokens)?;
    let lbl = lse_layout(OP, "lse_b", &lbb, heads, tokens)?;
    let lo = match &lob {
        Some(l) => Some(lse_layout(OP, "lse_out", l, heads, tokens)?),
        None => None,
    };
    // Overlaps: outputs against every input (LSE views as their spans).
    let span = |addr: u64, ts: usize, hs: usize| {
        let last = tokens.saturating_sub(1) * ts + heads.saturating_sub(1) * hs + 1;
        Rows { addr, elem: 4, rows: 1, cols: if tokens * heads == 0 { 0 } else { last }, row_stride: last }
    };
    for (what, h) in [("v_a", ah), ("v_b", bh)] {
        check_disjoint(OP, ("out", oh), (what, h))?;
    }
    for (what, l) in [("lse_a", la), ("lse_b", lbl)] {
        check_disjoint(OP, ("out", oh), (what, span(l.0, l.1, l.2)))?;
    }
    if let Some(l) = lo {
        let r = span(l.0, l.1, l.2);
        for (what, h) in [("v_a", ah), ("v_b", bh), ("out", oh)] {
            check_disjoint(OP, ("lse_out", r), (what, h))?;
        }
        for (what, x) in [("lse_a", la), ("lse_b", lbl)] {
            check_disjoint(OP, ("lse_out", r), (what, span(x.0, x.1, x.2)))?;
        }
    }
    if tokens == 0 || heads == 0 || ah.head_dim == 0 {
        return Ok(());
    }
    let params = MergeStatesParams {
        v_a: ab.addr,
        lse_a: la.0,
        v_b: bb.addr,
        lse_b: lbl.0,
        out: ob.addr,
        lse_out: lo.map_or(0, |l| l.0),
        tokens: to_i64(OP, "tokens", tokens)?,
        heads: to_i64(OP, "heads", heads)?,
        head_dim: to_i64(OP, "head_dim", ah.head_dim)?,
        num_states: 2,
        a_token_stride: to_i64(OP, "v_a token stride", ah.token_stride)?,
        a_head_stride: to_i64(OP, "v_a head stride", ah.head_stride)?,
        b_token_stride: to_i64(OP, "v_b token stride", bh.token_stride)?,
        b_head_stride: to_i64(OP, "v_b head stride", bh.head_stride)?,
        out_token_stride: to_i64(OP, "out token stride", oh.token_stride)?,
        out_head_stride: to_i64(OP, "out head stride", oh.head_stride)?,
        lse_a_token_stride: to_i64(OP, "lse_a stride", la.1)?,
        lse_a_head_stride: to_i64(OP, "lse_a stride", la.2)?,
        lse_b_token_stride: to_i64(OP, "lse_b stride", lbl.1)?,
        lse_b_head_stride: to_i64(OP, "lse_b stride", lbl.2)?,
        lse_out_token_stride: to_i64(OP, "lse_out stride", lo.map_or(0, |l| l.1))?,
        lse_out_head_stride: to_i64(OP, "lse_out stride", lo.map_or(0, |l| l.2))?,
    };
    let rows = tokens * heads;
    let dims = LaunchDims { grid: (grid_x(OP, rows.div_ceil(4))?, 1, 1), block: (THREADS, 1, 1), dyn_smem: 0 };
    args.launch(MERGE_KERNELS.find(OP, "v_a", (false, dtype), dtype)?, dims, &params)
}

/// [`merge_attention_states_on`] on tensors.
pub fn merge_attention_states(
    v_a: &Tensor,
    lse_a: &Tensor,
    v_b: &Tensor,
    lse_b: &Tensor,
    out: &Tensor,
    lse_out: Option<&Tensor>,
) -> Result<()> {
    let mut lo = lse_out.map(TensorViewMut::of_tensor);
    merge_attention_states_on(
        v_a.device(),
        &v_a.view(),
        &lse_a.view(),
        &v_b.view(),
        &lse_b.view(),
        &mut TensorViewMut::of_tensor(out),
        lo.as_mut(),
    )
}

// ----------------------------------------------------------------------------- fp8 test support
/// The kernels' own e4m3fn conversions, run on `device`: the code of every input value (f32 ->
/// e4m3fn as kv_append rounds), and the value of every code by the scalar decode and by the four
/// packed paths of the decode kernel (`[5][256]`, see `Fp8ConvertParams` in kernels/params.h).
/// For tests that compare them with [`crate::dtype::f8e4m3_encode`] and
/// [`crate::dtype::f8e4m3_decode`].
pub fn fp8_kernel_conversions(device: &Device, input: &[f32]) -> Result<(Vec<u8>, Vec<f32>)> {
    const OP: &str = "fp8_e4m3_convert";
    let n = input.len();
    let inp = Tensor::from_slice(device, input, &[n.max(1)].map(|x| if n == 0 { 0 } else { x }))?;
    let codes = Tensor::zeros(device, DType::F8E4M3, &[n])?;
    let decoded = Tensor::zeros(device, DType::F32, &[5 * 256])?;
    let mut args = KernelArgs::new(OP, device);
    let params = Fp8ConvertParams {
        input: args.read_tensor("input", &inp)?,
        codes: args.write_tensor("codes", &codes)?,
        decoded: args.write_tensor("decoded", &decoded)?,
        n: to_i64(OP, "n", n)?,
    };
    let dims = LaunchDims { grid: (grid_x(OP, n.max(256).div_ceil(256))?, 1, 1), block: (256, 1, 1), dyn_smem: 0 };
    args.launch(FP8_CONVERT, dims, &params)?;
    let codes = codes.to_vec::<crate::dtype::F8E4M3>()?.into_iter().map(|c| c.0).collect();
    Ok((codes, decoded.to_vec::<f32>()?))
}

/// The number of 64-key tiles a context of `len` keys spans (the split granularity).
pub fn tiles_of(len: usize) -> usize {
    len.div_ceil(KEYS_PER_TILE)
}
