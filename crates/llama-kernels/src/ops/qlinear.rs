//! Linear layers over packed weights (kernels/qlinear.cu): `y = x Wᵀ` and `y += x Wᵀ` with `W`
//! kept in a 4-, 5-, 6- or 8-bit format ([`QuantFormat`]: GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
//! Q4_K, Q5_K and Q6_K, bitsandbytes' NF4), the semantics of [`linear`](super::linear()) with the weight's values
//! defined by [`PackedWeight::dequantize`].
//!
//! ```
//! use llama_kernels::ops::qlinear::{QWeight, qlinear};
//! use llama_kernels::spec::quant::PackedWeight;
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (tokens, d_in, d_out) = (2, 128, 64);
//! let dense: Vec<f32> = (0..d_out * d_in).map(|i| ((i % 17) as f32 - 8.0) / 16.0).collect();
//! let packed = PackedWeight::quantize_nf4(d_out, d_in, 64, &dense)?;
//! let w = QWeight::new(&device, &packed)?;
//! let x = Tensor::from_f64(&device, DType::BF16, &vec![0.5; tokens * d_in], &[tokens, d_in])?;
//! let y = Tensor::zeros(&device, DType::BF16, &[tokens, d_out])?;
//! qlinear(&x, &w, &y, None)?; // 2 rows: the GEMV, no scratch needed
//! # Ok(())
//! # }
//! ```
//!
//! # Four paths ([`QPath`]), chosen by the format, the number of rows and the dtype
//!
//! - **Decode on tensor cores, 1 to [`MAX_MMA_GEMV_ROWS`] rows of bf16 or f16**, for every
//!   4- and 6-bit format (Q4_0, Q4_1, Q4_K, Q6_K, NF4; [`has_mma_gemv`]): one kernel streams the
//!   packed weight once with 16-byte loads, turns each value into a 16-bit float by byte permutes
//!   in registers (the integer formats' values exactly, with one permute per two; NF4's by a
//!   lookup of its code book rounded to the dtype), multiplies 16-row tiles of them by the
//!   activations with `mma.sync` (the rows are the MMA's 8 columns), and applies each chunk's
//!   scale and minimum (NF4: its absmax) to the chunk's f32 partial sums, as llama.cpp's `mmvq`
//!   applies block scales to integer dot products. `in` is split over the grid
//!   ([`mma_gemv_splits`], from the shape alone) when the weight has too few 16-row tiles to
//!   fill the GPU; a split product needs a [`QScratch`] for its f32 partials.
//! - **Decode on CUDA cores, 1 to [`MAX_GEMV_ROWS`] rows** (the other formats, f32, or the
//!   rows [`GEMM_FROM_ROWS`] leaves to it), rows starting on 16-byte boundaries (any row stride
//!   that keeps them there: the model's own buffers always do): one GEMV kernel
//!   streams the packed weight once (16-byte loads), dequantizes each 32-element chunk in
//!   registers and accumulates every row in f32; the bytes read are the packed bytes
//!   ([`QuantLayout::bits_per_weight`]), which is what makes a 4-bit decode faster than a 16-bit
//!   one. Weights with few output features are split along `in` over 2 or 4 warps per feature
//!   ([`gemv_split`], from the shape alone, so a result does not depend on the device).
//! - **Prefill (more rows), bf16 and f16, 16-byte aligned rows**: one tensor-core GEMM
//!   (`mma.sync`) that dequantizes 128 x 64 weight tiles into shared memory, one step ahead of the
//!   products: the packed weight is read, never a dense copy of it.
//! - **f32 prefill, or rows that are not 16-byte aligned**: bands of weight rows are dequantized
//!   into a [`QScratch`] of the activation dtype and multiplied by the dense GEMM of
//!   [`linear`](super::linear()) (cuBLAS on CUDA), one band after another into column ranges of `y`.
//!
//! # Which weight values each path multiplies by
//!
//! Products and sums are f32 on every path, with one rounding of the output; the weight values
//! differ by path ([`QPath::weight_values`], [`WeightValues`]):
//!
//! - The GEMM, the CUDA-core GEMV and the dequantize path multiply by each dequantized value
//!   rounded to the activation dtype (exact for f32): their reference is
//!   [`reference::linear`](crate::reference::linear) over `round_to(dtype,
//!   PackedWeight::dequantize())`.
//! - The tensor-core GEMV of the integer formats multiplies by the exact dequantized values (the
//!   16-bit operands are the stored integers, the f32 factors the reference's), so its reference
//!   is `reference::linear` over `PackedWeight::dequantize()` itself; its f32 sums carry the base
//!   of the integers' encoding (a few bits of the f32 significand, see kernels/qmmv.cu) and
//!   cancel it per chunk.
//! - The tensor-core GEMV of NF4 multiplies by its code book rounded to the activation dtype,
//!   times each block's absmax in f32: `T(code[q]) * absmax` instead of `T(code[q] * absmax)`,
//!   the same size of error (one rounding to T of each weight), never an error of the product.
//!   bitsandbytes' own batch-1 kernel rounds the code book and the absmax to T and multiplies in
//!   T.
//!
//! Shapes: `x` is `[..., in]` (leading dimensions collapse into rows; any row stride), `y` is
//! `[..., out]` with the same leading dimensions (any row stride), one float dtype for both
//! (f32, f16 or bf16), `y` disjoint from `x`. The sum of [`qlinear_add`] is rounded once.

use crate::backend::{Device, LaunchDims, Queue};
use crate::dtype::{DType, round_to};
use crate::error::{Error, Result};
use crate::ffi::params::{
    LLK_QDEQUANT_THREADS, LLK_QGEMM_BLOCK_K, LLK_QGEMM_BLOCK_M, LLK_QGEMM_BLOCK_N, LLK_QGEMM_MAX_SPLITS,
    LLK_QGEMM_THREADS, LLK_QGEMV_MAX_ROWS, LLK_QGEMV_MAX_SPLIT, LLK_QGEMV_WARPS, LLK_QMMV_GROUP, LLK_QMMV_MAX_ROWS,
    LLK_QMMV_WARPS, LLK_QREDUCE_THREADS, LLK_QUANT_CHUNK, QLinearParams,
};
use crate::kernels::qlinear::{KERNELS, MMA_GEMV, QKernel, SPLIT_REDUCE};
use crate::launch::KernelArgs;
use crate::launch::{Rows, check_disjoint, check_dtype, check_float, grid_x, grid_y, to_i64};
pub use crate::spec::quant::{PackedWeight, QuantFormat, QuantLayout};
use crate::tensor::{Dims, Tensor, TensorView, TensorViewMut};

use super::linear;

const OP: &str = "qlinear";

/// The most activation rows the GEMV takes; more go through the dequantize-and-GEMM path.
pub const MAX_GEMV_ROWS: usize = LLK_QGEMV_MAX_ROWS as usize;

/// The GEMV splits a weight along `in` until its grid has this many warps (or each lane would
/// keep fewer than two chunks): about 16 warps per SM on a 132-SM GPU, enough 16-byte loads in
/// flight to cover DRAM latency.
pub const GEMV_SPLIT_WARPS: usize = 2048;

/// Warps per output feature of the GEMV for an `[out, in]` weight: 1, 2 or 4.
pub fn gemv_split(out: usize, inp: usize) -> usize {
    let chunks = inp / LLK_QUANT_CHUNK as usize;
    let mut split = 1;
    while split < LLK_QGEMV_MAX_SPLIT as usize && out * split < GEMV_SPLIT_WARPS && chunks >= 64 * split {
        split *= 2;
    }
    split
}

/// 16-bit activations with this many rows or more take the tensor-core GEMM, for the formats
/// without the tensor-core GEMV (Q8_0 and the 5-bit formats): below it the CUDA-core GEMV spends fewer issue slots
/// per weight (its dequantization is shared by every row, but each row adds its fmas; the static
/// report's packed-kernel section shows the crossover near 5 rows). The other formats take the
/// GEMM from `MAX_MMA_GEMV_ROWS + 1` rows.
pub const GEMM_FROM_ROWS: usize = 5;

/// The most activation rows the tensor-core GEMV takes (one MMA n-tile).
pub const MAX_MMA_GEMV_ROWS: usize = LLK_QMMV_MAX_ROWS as usize;

/// Whether `format` with activations of `dtype` has the tensor-core GEMV.
pub fn has_mma_gemv(format: QuantFormat, dtype: DType) -> bool {
    MMA_GEMV.has((format, dtype))
}

/// The tensor-core GEMV splits `in` (grid.z) until its grid has this many warps (16 per SM on a
/// 132-SM GPU), keeping at least 2 groups of 128 per warp.
pub const MMA_GEMV_SPLIT_WARPS: usize = 2048;

/// Splits of `in` for the tensor-core GEMV through an `[out, in]` weight (1: no split), from the
/// shape alone, within [`GEMM_PARTIAL_ELEMS`] at its most rows.
pub fn mma_gemv_splits(out: usize, inp: usize) -> usize {
    let (warps, group) = (LLK_QMMV_WARPS as usize, LLK_QMMV_GROUP as usize * LLK_QUANT_CHUNK as usize);
    if out == 0 {
        return 1;
    }
    let per_split = out.div_ceil(16) * warps;
    let by_grid = MMA_GEMV_SPLIT_WARPS.div_ceil(per_split);
    let by_depth = inp.div_ceil(group) / (2 * warps);
    let by_memory = GEMM_PARTIAL_ELEMS / (MAX_MMA_GEMV_ROWS * out);
    by_grid.min(by_depth).min(by_memory).clamp(1, LLK_QGEMM_MAX_SPLITS as usize)
}

/// The GEMM splits `in` (grid.z) until its grid has this many blocks: 4 per SM on a 132-SM GPU.
pub const GEMM_SPLIT_BLOCKS: usize = 528;

/// The f32 partial products a split GEMM may write (elements of [`QScratch`]'s partial buffer).
pub const GEMM_PARTIAL_ELEMS: usize = 1 << 22;

/// Splits of `in` for the tensor-core GEMM of `rows` rows through an `[out, in]` weight: 1 (no
/// split) beyond one 64-row block, else enough to fill [`GEMM_SPLIT_BLOCKS`], keeping at least 4
/// steps of 64 per split and the partials within [`GEMM_PARTIAL_ELEMS`]. From the shape alone.
pub fn gemm_splits(rows: usize, out: usize, inp: usize) -> usize {
    let (bm, bn, bk) = (LLK_QGEMM_BLOCK_M as usize, LLK_QGEMM_BLOCK_N as usize, LLK_QGEMM_BLOCK_K as usize);
    if rows == 0 || rows > bm || out == 0 {
        return 1;
    }
    let blocks = out.div_ceil(bn);
    let by_grid = GEMM_SPLIT_BLOCKS.div_ceil(blocks);
    let by_depth = inp.div_ceil(bk) / 4;
    let by_memory = GEMM_PARTIAL_ELEMS / (rows * out);
    by_grid.min(by_depth).min(by_memory).clamp(1, LLK_QGEMM_MAX_SPLITS as usize)
}

/// The kernels a product runs (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QPath {
    /// The tensor-core decode GEMV.
    MmaGemv {
        /// Splits of `in` ([`mma_gemv_splits`]); more than one needs a [`QScratch`].
        k_splits: usize,
    },
    /// The CUDA-core decode GEMV.
    Gemv {
        /// Warps per output feature ([`gemv_split`]).
        split: usize,
    },
    /// The tensor-core GEMM over weight tiles dequantized in shared memory.
    Gemm {
        /// Splits of `in` ([`gemm_splits`]); more than one needs a [`QScratch`] for the partials.
        k_splits: usize,
    },
    /// Bands dequantized into a [`QScratch`], then the dense GEMM of [`linear`](super::linear()).
    DequantGemm,
}

impl QPath {
    /// The path for `rows` activation rows of `dtype` through an `[out, in]` weight of `format`;
    /// `aligned`: x starts on a 16-byte boundary and its row stride keeps every row there.
    pub fn choose(format: QuantFormat, dtype: DType, rows: usize, aligned: bool, [out, inp]: [usize; 2]) -> QPath {
        let mma = has_mma_gemv(format, dtype);
        let gemv_rows = if dtype == DType::F32 { MAX_GEMV_ROWS } else { GEMM_FROM_ROWS - 1 };
        if !aligned {
            QPath::DequantGemm
        } else if mma && rows <= MAX_MMA_GEMV_ROWS {
            QPath::MmaGemv { k_splits: mma_gemv_splits(out, inp) }
        } else if !mma && rows <= gemv_rows {
            QPath::Gemv { split: gemv_split(out, inp) }
        } else if dtype == DType::F32 {
            QPath::DequantGemm
        } else {
            QPath::Gemm { k_splits: gemm_splits(rows, out, inp) }
        }
    }
    /// Whether the path needs a [`QScratch`].
    pub fn needs_scratch(self) -> bool {
        matches!(self, QPath::DequantGemm | QPath::Gemm { k_splits: 2.. } | QPath::MmaGemv { k_splits: 2.. })
    }
    /// Which values of a `format` weight the path multiplies by (module docs).
    pub fn weight_values(self, format: QuantFormat) -> WeightValues {
        match self {
            QPath::MmaGemv { .. } if format == QuantFormat::NF4 => WeightValues::RoundedCodeBook,
            QPath::MmaGemv { .. } => WeightValues::Exact,
            _ => WeightValues::Rounded,
        }
    }
}

/// The values of a packed weight that a product multiplies by (module docs): what its f64
/// reference multiplies by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightValues {
    /// The dequantized values ([`PackedWeight::dequantize`]).
    Exact,
    /// Each dequantized value rounded to the activation dtype.
    Rounded,
    /// NF4: the code book rounded to the activation dtype, times each block's absmax (f32).
    RoundedCodeBook,
}

impl WeightValues {
    /// These values of `w` for activations of `dtype`, row-major `[out, in]`.
    pub fn of(self, w: &PackedWeight, dtype: DType) -> Vec<f64> {
        match self {
            WeightValues::Exact => w.dequantize().into_iter().map(f64::from).collect(),
            WeightValues::Rounded => w.dequantize().into_iter().map(|v| round_to(dtype, f64::from(v))).collect(),
            WeightValues::RoundedCodeBook => {
                let code = w.code().map(|c| round_to(dtype, f64::from(c)) as f32);
                let rounded = w.with_code(code);
                rounded.dequantize().into_iter().map(f64::from).collect()
            }
        }
    }
}

impl std::fmt::Display for QPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QPath::MmaGemv { k_splits: 1 } => write!(f, "gemv mma.sync"),
            QPath::MmaGemv { k_splits } => write!(f, "gemv mma.sync split-k {k_splits}"),
            QPath::Gemv { split: 1 } => write!(f, "gemv"),
            QPath::Gemv { split } => write!(f, "gemv split-k {split}"),
            QPath::Gemm { k_splits: 1 } => write!(f, "gemm mma.sync"),
            QPath::Gemm { k_splits } => write!(f, "gemm mma.sync split-k {k_splits}"),
            QPath::DequantGemm => write!(f, "dequant+gemm"),
        }
    }
}

/// Elements of the dense band the prefill path dequantizes at a time (at most; a band is whole
/// rows, at least 64 of them).
pub const BAND_ELEMS: usize = 1 << 24;

/// A packed weight on the device (a shared handle: clones share the planes).
#[derive(Clone, Debug)]
pub struct QWeight {
    layout: QuantLayout,
    code: [f32; 16],
    data: Tensor,
}

impl QWeight {
    /// Uploads `w`'s planes.
    pub fn new(device: &Device, w: &PackedWeight) -> Result<QWeight> {
        if w.bytes().len() != w.layout().total_bytes() {
            return Err(Error::invalid(
                OP,
                "packed bytes",
                w.bytes().len(),
                format!("the layout needs {}", w.layout().total_bytes()),
            ));
        }
        let data = Tensor::from_slice(device, w.bytes(), &[w.bytes().len()])?;
        Ok(QWeight { layout: *w.layout(), code: *w.code(), data })
    }
    /// Where the planes lie.
    pub fn layout(&self) -> &QuantLayout {
        &self.layout
    }
    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.layout.rows(), self.layout.cols()]
    }
    /// The device holding the planes.
    pub fn device(&self) -> &Device {
        self.data.device()
    }
    /// The planes' bytes on the device.
    pub(crate) fn tensor(&self) -> &Tensor {
        &self.data
    }
    /// Bytes on the device (what a GEMV reads).
    pub fn bytes(&self) -> usize {
        self.layout.total_bytes()
    }
    /// The planes back on the host.
    pub fn to_host(&self) -> Result<PackedWeight> {
        PackedWeight::new(self.layout, self.data.to_vec()?, self.code)
    }
}

/// Rows of `layout` the prefill path dequantizes per band.
pub fn band_rows(layout: &QuantLayout) -> usize {
    (BAND_ELEMS / layout.cols().max(1)).max(64).min(layout.rows())
}

/// The dense band the [`QPath::DequantGemm`] path dequantizes into, planned once for a set of
/// weights (f32 prefill, misaligned rows).
#[derive(Debug)]
pub struct QScratch {
    band: Tensor,
    /// f32 partial products of a split GEMM (16-bit dtypes).
    partial: Tensor,
}

/// f32 elements the split products of `w` with 16-bit activations write at most (over the row
/// counts that split).
fn partial_elems(w: &QWeight) -> usize {
    let [out, inp] = [w.layout.rows(), w.layout.cols()];
    let gemm = (GEMM_FROM_ROWS..=LLK_QGEMM_BLOCK_M as usize)
        .map(|rows| match gemm_splits(rows, out, inp) {
            1 => 0,
            k => k * rows * out,
        })
        .max()
        .unwrap_or(0);
    let mma_gemv = match mma_gemv_splits(out, inp) {
        1 => 0,
        k if has_mma_gemv(w.layout.format(), DType::BF16) => k * MAX_MMA_GEMV_ROWS * out,
        _ => 0,
    };
    gemm.max(mma_gemv)
}

impl QScratch {
    /// The dense band buffer.
    pub(super) fn band(&self) -> &Tensor {
        &self.band
    }
    /// A scratch of `dtype` large enough for a band of every weight in `weights` (the
    /// dequantize-and-GEMM path) and, for bf16 and f16, the partial products of their split GEMMs.
    pub fn new(device: &Device, dtype: DType, weights: &[&QWeight]) -> Result<QScratch> {
        check_float(OP, "scratch", dtype)?;
        let elems = weights.iter().map(|w| band_rows(&w.layout) * w.layout.cols()).max().unwrap_or(0);
        let partial = if dtype == DType::F32 { 0 } else { weights.iter().map(|w| partial_elems(w)).max().unwrap_or(0) };
        Ok(QScratch {
            band: Tensor::zeros(device, dtype, &[elems.max(1)])?,
            partial: Tensor::zeros(device, DType::F32, &[partial.max(1)])?,
        })
    }
}

/// `y = x Wᵀ`. `scratch` is needed when the path is [`QPath::DequantGemm`] (f32 with more than
/// [`MAX_GEMV_ROWS`] rows, or rows that are not 16-byte aligned).
pub fn qlinear(x: &Tensor, w: &QWeight, y: &Tensor, scratch: Option<&QScratch>) -> Result<()> {
    qlinear_on(y.device(), &x.view(), w, &mut TensorViewMut::of_tensor(y), scratch)
}

/// `y += x Wᵀ` (the sum rounded once).
pub fn qlinear_add(x: &Tensor, w: &QWeight, y: &Tensor, scratch: Option<&QScratch>) -> Result<()> {
    qlinear_add_on(y.device(), &x.view(), w, &mut TensorViewMut::of_tensor(y), scratch)
}

/// [`qlinear`] on borrowed views, queued on `queue`.
pub fn qlinear_on(
    queue: &impl Queue,
    x: &TensorView<'_>,
    w: &QWeight,
    y: &mut TensorViewMut<'_>,
    scratch: Option<&QScratch>,
) -> Result<()> {
    run(&queue.queue_device()?, x, w, y, scratch, false)
}

/// [`qlinear_add`] on borrowed views, queued on `queue`.
pub fn qlinear_add_on(
    queue: &impl Queue,
    x: &TensorView<'_>,
    w: &QWeight,
    y: &mut TensorViewMut<'_>,
    scratch: Option<&QScratch>,
) -> Result<()> {
    run(&queue.queue_device()?, x, w, y, scratch, true)
}

/// The parameters every kernel of a packed weight shares: the planes of `w` at `base`.
pub(crate) fn weight_params(w: &QWeight, base: u64) -> Result<QLinearParams> {
    let l = &w.layout;
    let [qs, qh, meta] = l.planes().map(|o| base + o as u64);
    Ok(QLinearParams {
        x: 0,
        y: 0,
        qs,
        qh: if l.qh_row_bytes() > 0 { qh } else { 0 },
        meta,
        rows: 0,
        n: to_i64(OP, "out features", l.rows())?,
        k: to_i64(OP, "in features", l.cols())?,
        block: to_i64(OP, "block", l.block())?,
        row_first: 0,
        x_row_stride: 0,
        y_row_stride: 0,
        qs_row_bytes: to_i64(OP, "qs row bytes", l.qs_row_bytes())?,
        qh_row_bytes: to_i64(OP, "qh row bytes", l.qh_row_bytes())?,
        meta_row_bytes: to_i64(OP, "meta row bytes", l.meta_row_bytes())?,
        code: w.code,
        format: l.format().ffi(),
        accumulate: 0,
        split: 1,
        // A power of two for every format (QuantLayout::new checks it).
        block_shift: l.block().trailing_zeros() as i32,
        partial: 0,
        k_splits: 1,
        k_steps_per_split: 0,
    })
}

fn run(
    device: &Device,
    x: &TensorView<'_>,
    w: &QWeight,
    y: &mut TensorViewMut<'_>,
    scratch: Option<&QScratch>,
    accumulate: bool,
) -> Result<()> {
    let op = if accumulate { "qlinear_add" } else { OP };
    let dtype = x.dtype();
    check_float(op, "x", dtype)?;
    check_dtype(op, "y", y.dtype(), dtype)?;
    if !device.same_context(w.device()) {
        return Err(Error::DeviceMismatch { op, what: "weight" });
    }
    let [d_out, d_in] = w.shape();
    if x.shape().last() != Some(&d_in) {
        return Err(Error::shape(op, "x", x.shape().to_vec(), format!("[..., {d_in}] (in = the weight's columns)")));
    }
    let mut y_expected = x.shape().to_vec();
    if let Some(last) = y_expected.last_mut() {
        *last = d_out;
    }
    if y.shape() != y_expected.as_slice() {
        return Err(Error::shape(op, "y", y.shape().to_vec(), format!("{y_expected:?}")));
    }
    let mut args = KernelArgs::new(op, device);
    let yb = args.write("y", y)?;
    let xb = args.read("x", x)?;
    let wb = args.read_tensor("weight", &w.data)?;
    let (xr, yr) = (Rows::of(op, "x", &xb, 1)?, Rows::of(op, "y", &yb, 1)?);
    let wr = Rows { addr: wb, elem: 1, rows: 1, cols: w.bytes(), row_stride: w.bytes() };
    check_disjoint(op, ("y", yr), ("x", xr))?;
    check_disjoint(op, ("y", yr), ("weight", wr))?;
    if xr.rows == 0 || d_out == 0 {
        return Ok(());
    }
    let aligned = xr.addr % 16 == 0 && xr.row_stride % dtype.vec16() == 0;
    let path = QPath::choose(w.layout.format(), dtype, xr.rows, aligned, [d_out, d_in]);
    // What a path that needs a scratch reports without a usable one.
    let usable = |why: String| -> Result<&QScratch> {
        let scratch = scratch.ok_or_else(|| Error::invalid(op, "scratch", "None", why))?;
        check_dtype(op, "scratch", scratch.band.dtype(), dtype)?;
        if !device.same_context(scratch.band.device()) {
            return Err(Error::DeviceMismatch { op, what: "scratch" });
        }
        Ok(scratch)
    };
    let io_params = || -> Result<QLinearParams> {
        let mut p = weight_params(w, wb)?;
        p.x = xr.addr;
        p.y = yr.addr;
        p.rows = to_i64(op, "rows", xr.rows)?;
        p.x_row_stride = to_i64(op, "x row stride", xr.row_stride)?;
        p.y_row_stride = to_i64(op, "y row stride", yr.row_stride)?;
        p.accumulate = i32::from(accumulate);
        Ok(p)
    };
    let find = |kernel| KERNELS.find(op, "x", (kernel, w.layout.format(), dtype));
    // The f32 partials of a split product (GEMM or tensor-core GEMV), checked against its size.
    let partials = |k_splits: usize| -> Result<&QScratch> {
        let why = format!("{} rows split `in` {k_splits} ways ({path}): they need a QScratch", xr.rows);
        let scratch = usable(why)?;
        let need = k_splits * xr.rows * d_out;
        if scratch.partial.numel() < need {
            let why = format!("needs {need} f32 partial elements (plan it with this weight)");
            return Err(Error::invalid(op, "scratch", scratch.partial.numel(), why));
        }
        Ok(scratch)
    };
    // Adds the splits' partials in order into y (and its old values), rounding once.
    let reduce = |p: &QLinearParams, scratch: &QScratch, y: &mut TensorViewMut<'_>| -> Result<()> {
        let mut args = KernelArgs::new(op, device);
        args.write("y", y)?;
        args.read_tensor("scratch partials", &scratch.partial)?;
        let threads = LLK_QREDUCE_THREADS as usize;
        let grid = (grid_x(op, (xr.rows * d_out).div_ceil(threads))?, 1, 1);
        let dims = LaunchDims { grid, block: (threads as u32, 1, 1), smem_at_launch: 0 };
        args.launch(SPLIT_REDUCE.find(op, "y", dtype)?, dims, p)
    };
    match path {
        QPath::Gemv { split } => {
            let mut p = io_params()?;
            p.split = split as i32;
            let per_block = LLK_QGEMV_WARPS as usize / split;
            let block = (LLK_QGEMV_WARPS * 32, 1, 1);
            let dims = LaunchDims { grid: (grid_x(op, d_out.div_ceil(per_block))?, 1, 1), block, smem_at_launch: 0 };
            return args.launch(find(QKernel::Gemv)?, dims, &p);
        }
        QPath::MmaGemv { k_splits } | QPath::Gemm { k_splits } => {
            // With more than one split the kernel writes f32 partials into the scratch and the
            // reduce kernel adds them in order into y (and its old values), rounding once.
            let mut p = io_params()?;
            let (kernel, dims, steps) = if matches!(path, QPath::MmaGemv { .. }) {
                let groups = d_in.div_ceil(LLK_QMMV_GROUP as usize * LLK_QUANT_CHUNK as usize);
                let grid = (grid_x(op, d_out.div_ceil(16))?, 1, k_splits as u32);
                let dims = LaunchDims { grid, block: (LLK_QMMV_WARPS * 32, 1, 1), smem_at_launch: 0 };
                (MMA_GEMV.find(op, "x", (w.layout.format(), dtype))?, dims, groups)
            } else {
                let steps = d_in.div_ceil(LLK_QGEMM_BLOCK_K as usize);
                (find(QKernel::Gemm)?, gemm_dims(op, xr.rows, d_out, k_splits)?, steps)
            };
            p.k_splits = to_i32(op, "k splits", k_splits)?;
            p.k_steps_per_split = to_i32(op, "steps per split", steps.div_ceil(k_splits))?;
            let split = if k_splits > 1 {
                let scratch = partials(k_splits)?;
                p.partial = args.write_tensor("scratch partials", &scratch.partial)?;
                Some(scratch)
            } else {
                None
            };
            args.launch(kernel, dims, &p)?;
            return match split {
                Some(scratch) => reduce(&p, scratch, y),
                None => Ok(()),
            };
        }
        QPath::DequantGemm => {}
    }
    drop(args);
    let scratch = usable(if aligned {
        format!("{} f32 rows need a QScratch (the GEMV takes at most {MAX_GEMV_ROWS})", xr.rows)
    } else {
        "x rows that are not 16-byte aligned need a QScratch (the GEMV reads 16-byte vectors)".to_string()
    })?;
    let band = band_rows(&w.layout);
    if scratch.band.numel() < band * d_in {
        return Err(Error::invalid(
            op,
            "scratch",
            scratch.band.numel(),
            format!("needs {} elements (plan it with this weight)", band * d_in),
        ));
    }
    let x_rows = x.clone().with_layout(&[xr.rows, d_in], &[xr.row_stride, 1], x.offset())?;
    let mut n0 = 0;
    while n0 < d_out {
        let n = band.min(d_out - n0);
        dequantize_band(device, w, &scratch.band, n0, n)?;
        let wv = scratch.band.view().with_layout(&[n, d_in], &[d_in, 1], 0)?;
        let y_dims = Dims::new(op, &[yr.rows, n], &[yr.row_stride, 1], y.offset() + n0)?;
        let mut yv = y.reborrow_within(op, y_dims)?;
        if accumulate {
            linear::linear_add_on(device, &x_rows, &wv, None, &mut yv)?;
        } else {
            linear::linear_on(device, &x_rows, &wv, None, &mut yv)?;
        }
        n0 += n;
    }
    Ok(())
}

/// The GEMM's grid for `rows` x `out` (the output's columns) with `k_splits` splits of `in` (grid.z).
pub(super) fn gemm_dims(op: &'static str, rows: usize, out: usize, k_splits: usize) -> Result<LaunchDims> {
    let grid = (
        grid_x(op, rows.div_ceil(LLK_QGEMM_BLOCK_M as usize))?,
        grid_y(op, "out features", out.div_ceil(LLK_QGEMM_BLOCK_N as usize))?,
        k_splits as u32,
    );
    Ok(LaunchDims { grid, block: (LLK_QGEMM_THREADS, 1, 1), smem_at_launch: 0 })
}

fn to_i32(op: &'static str, name: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(op, name, v, "does not fit in i32"))
}

/// Rows `[first, first + n)` of `w`, dequantized into the start of `band` (`[n, in]`).
pub(super) fn dequantize_band(device: &Device, w: &QWeight, band: &Tensor, first: usize, n: usize) -> Result<()> {
    let dtype = band.dtype();
    let mut args = KernelArgs::new(OP, device);
    let ob = args.write_tensor("scratch", band)?;
    let wb = args.read_tensor("weight", &w.data)?;
    let mut p = weight_params(w, wb)?;
    p.y = ob;
    p.n = to_i64(OP, "band rows", n)?;
    p.row_first = to_i64(OP, "band start", first)?;
    p.y_row_stride = p.k;
    let threads = n * (w.layout.cols() / LLK_QUANT_CHUNK as usize);
    let block = LLK_QDEQUANT_THREADS as usize;
    let dims = LaunchDims {
        grid: (grid_x(OP, threads.div_ceil(block))?, 1, 1),
        block: (block as u32, 1, 1),
        smem_at_launch: 0,
    };
    args.launch(KERNELS.find(OP, "scratch", (QKernel::Dequantize, w.layout.format(), dtype))?, dims, &p)
}

/// `w` dequantized on the device into a dense `[out, in]` tensor of `dtype` (the kernel the
/// prefill path uses, whole): for checks and for users who want the dense weight.
pub fn dequantize(w: &QWeight, dtype: DType) -> Result<Tensor> {
    check_float(OP, "dtype", dtype)?;
    let [rows, cols] = w.shape();
    let out = Tensor::zeros(w.device(), dtype, &[rows, cols])?;
    if rows > 0 {
        dequantize_band(w.device(), w, &out, 0, rows)?;
    }
    Ok(out)
}
