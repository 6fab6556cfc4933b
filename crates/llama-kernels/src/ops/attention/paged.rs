//! The paged KV cache (kernels/paged_attention.cu): fp8 scales ([`KvScales`]), the borrowed
//! pools of one layer ([`PagedKvView`]), appending new tokens ([`kv_append_on`]) and the owned
//! cache of one layer ([`PagedKvCache`]). See [`crate::ops::attention`] for the layout.

use crate::backend::{Device, LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{KvAppendParams, LLK_KV_MAX_SCALES};
use crate::kernels::paged_attention::APPEND_KERNELS;
use crate::launch::KernelArgs;
use crate::launch::pool::{Pool, check_pools};
use crate::launch::{Heads, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

use crate::ops::error_flag::ErrorFlag;

const APPEND: &str = "kv_append";
/// Most KV heads of an fp8 cache (its scales travel in the kernel parameters). Pools of other
/// dtypes take any number of KV heads.
pub const MAX_SCALED_KV_HEADS: usize = LLK_KV_MAX_SCALES as usize;

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
    /// The scale of the K pool.
    pub k: KvScale,
    /// The scale of the V pool.
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
        // fp8 kernels read a scale per KV head from the parameters (1 when none is given), so the
        // bound holds for every fp8 pool; 16-bit and f32 pages never read them.
        if page_dtype == DType::F8E4M3 && kv_heads > MAX_SCALED_KV_HEADS {
            return Err(Error::invalid(
                op,
                "kv_heads",
                kv_heads,
                format!("an fp8 cache supports at most {MAX_SCALED_KV_HEADS} KV heads"),
            ));
        }
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

/// Borrowed K and V page pools of one layer, with their scales (the view-level cache).
#[derive(Clone, Copy, Debug)]
pub struct PagedKvView<'r, 'a> {
    /// `[num_pages, page_size, kv_heads, head_dim]`, each page contiguous.
    pub k_pages: &'r TensorView<'a>,
    /// Like `k_pages`.
    pub v_pages: &'r TensorView<'a>,
    /// The scales of the two pools.
    pub scales: &'r KvScales,
}

/// One append of new tokens into a layer's page pools ([`kv_append_on`]).
#[derive(Debug)]
pub struct KvAppendArgs<'r, 'a> {
    /// New keys, `[tokens, kv_heads, head_dim]` f32/f16/bf16, any token and head strides, 16-byte
    /// aligned rows.
    pub k: &'r TensorView<'a>,
    /// New values, shaped as `k`.
    pub v: &'r TensorView<'a>,
    /// `[tokens]` i64: each token's slot `page * page_size + row`; -1 skips the token.
    pub slot_mapping: &'r TensorView<'a>,
    /// The key pool, `[num_pages, page_size, kv_heads, head_dim]`.
    pub k_pages: &'r mut TensorViewMut<'a>,
    /// The value pool, shaped as the key pool.
    pub v_pages: &'r mut TensorViewMut<'a>,
    /// The pools' scales (fp8 pages).
    pub scales: &'r KvScales,
}

/// Writes the new `k` and `v` into the pools at `slot_mapping` (see [`KvAppendArgs`]),
/// converting to the pools' dtype (fp8: `x / scale`, rounded to nearest even, saturating). A
/// slot outside the pool (or below -1) is skipped and raises `errors`.
pub fn kv_append_on(queue: &impl Queue, call: KvAppendArgs<'_, '_>, errors: &ErrorFlag) -> Result<()> {
    let KvAppendArgs { k, v, slot_mapping, k_pages, v_pages, scales } = call;
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
        return Err(Error::shape(
            OP,
            "slot_mapping",
            sb.shape().to_vec(),
            format!("contiguous [{}] (one slot per token)", kh.tokens),
        ));
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
    let dims = LaunchDims { grid: (grid_x(OP, threads.div_ceil(256))?, 1, 1), block: (256, 1, 1), smem_at_launch: 0 };
    let kernel = APPEND_KERNELS.find(OP, "k_pages", (k.dtype(), kp.dtype))?;
    args.launch(kernel, dims, &params)
}

/// The shape and dtype of a paged KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct PagedKvConfig {
    /// Pages in each pool (K and V).
    pub num_pages: usize,
    /// A power of two; 16 is the usual choice.
    pub page_size: usize,
    /// KV heads (> 0; at most [`MAX_SCALED_KV_HEADS`] for fp8 pages).
    pub kv_heads: usize,
    /// Elements per head ([`kv_append_on`] needs a multiple of 16).
    pub head_dim: usize,
    /// bf16, f16, f32 or fp8 ([`DType::F8E4M3`]).
    pub dtype: DType,
    /// fp8 only; [`KvScales::default`] (no scale) otherwise.
    pub scales: KvScales,
}

/// A paged KV cache of one layer owned by this crate: K and V pools, their scales and an error
/// flag (the tensor-level convenience over [`PagedKvView`] and [`kv_append_on`]).
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
                supported: "f32, f16, bf16, fp8".into(),
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
    /// The shape, dtype and scales the cache was made with.
    pub fn config(&self) -> &PagedKvConfig {
        &self.config
    }
    /// The K pool, `[num_pages, page_size, kv_heads, head_dim]`.
    pub fn k_pages(&self) -> &Tensor {
        &self.k_pages
    }
    /// The V pool, shaped like the K pool.
    pub fn v_pages(&self) -> &Tensor {
        &self.v_pages
    }
    /// The scales of the K and V pools.
    pub fn scales(&self) -> &KvScales {
        &self.config.scales
    }
    /// The device whose memory holds the pools.
    pub fn device(&self) -> &Device {
        self.k_pages.device()
    }
    /// The error flag appends raise (bad slots).
    pub fn error_flag(&self) -> &ErrorFlag {
        &self.errors
    }
    /// Appends new tokens (see [`kv_append_on`]); `slot_mapping` is an i64 tensor.
    pub fn append(&self, k: &Tensor, v: &Tensor, slot_mapping: &Tensor) -> Result<()> {
        let (mut k_pages, mut v_pages) = (self.k_pages.view_mut(), self.v_pages.view_mut());
        let (k, v, slot_mapping) = (k.view(), v.view(), slot_mapping.view());
        let call = KvAppendArgs {
            k: &k,
            v: &v,
            slot_mapping: &slot_mapping,
            k_pages: &mut k_pages,
            v_pages: &mut v_pages,
            scales: &self.config.scales,
        };
        kv_append_on(self.device(), call, &self.errors)
    }
    /// Reads and clears the cache's error flag (appends with a bad slot).
    pub fn check_errors(&self) -> Result<()> {
        self.errors.check(APPEND)
    }
}
