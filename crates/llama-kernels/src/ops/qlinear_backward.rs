//! The input gradient through a frozen packed weight: `dx = dy W` and `dx += dy W` with `W` kept
//! in its packed format, the backward of [`qlinear`](super::qlinear::qlinear) that QLoRA needs
//! for its NF4 base weights (every [`QuantFormat`](super::qlinear::QuantFormat) works). The
//! weight is never expanded to a dense copy on the tensor-core path: bitsandbytes'
//! `MatMul4Bit` and Unsloth dequantize `W` to a 16-bit tensor and call a dense GEMM for this
//! product; here the packed bytes are the operand.
//!
//! ```
//! use llama_kernels::ops::qlinear::QWeight;
//! use llama_kernels::ops::qlinear_backward::qlinear_backward_input;
//! use llama_kernels::spec::quant::PackedWeight;
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (tokens, d_in, d_out) = (3, 128, 64);
//! let dense: Vec<f32> = (0..d_out * d_in).map(|i| ((i % 13) as f32 - 6.0) / 8.0).collect();
//! let w = QWeight::new(&device, &PackedWeight::quantize_nf4(d_out, d_in, 64, &dense)?)?;
//! let dy = Tensor::from_f64(&device, DType::BF16, &vec![0.25; tokens * d_out], &[tokens, d_out])?;
//! let dx = Tensor::zeros(&device, DType::BF16, &[tokens, d_in])?;
//! qlinear_backward_input(&dy, &w, &dx, false, None)?; // bf16, aligned rows: no scratch
//! # Ok(())
//! # }
//! ```
//!
//! # Two paths ([`QPath::for_input_grad`])
//!
//! - **bf16 and f16, `dy` rows on 16-byte boundaries**: the packed GEMM of the forward with W's
//!   dimensions exchanged (kernels/qlinear.cu, `qgemm_dx_<format>_<dtype>`): 64-row blocks of
//!   `dy` times 64 x 128 tiles of `W` dequantized in shared memory one step ahead of the
//!   products, `mma.sync` with f32 accumulators, one rounding of `dx` (and of `dx + dy W`).
//! - **f32, or `dy` rows that are not 16-byte aligned**: bands of `W`'s rows are dequantized
//!   into a [`QScratch`] and multiplied by the dense GEMM of
//!   [`linear_backward_input`](super::linear_backward::linear_backward_input), `dx` adding one
//!   band's product after another (16-bit `dx` is then rounded once per band).
//!
//! Both multiply by each dequantized weight rounded to the activation dtype
//! ([`WeightValues::Rounded`](super::qlinear::WeightValues)), as the forward's GEMM does, so the
//! gradient is exactly the one of the product the forward computed.
//!
//! Shapes: `dy` `[..., out]` (any row stride), `dx` `[..., in]` with the same leading dimensions
//! (any row stride), one float dtype, `dx` disjoint from `dy`. With `out == 0`, `dx` is zeroed
//! (accumulating: left as it is).

use super::linear_backward::linear_backward_input_on;
use super::qlinear::{QPath, QScratch, QWeight, band_rows, dequantize_band, gemm_dims, weight_params};
use crate::backend::Queue;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::LLK_QGEMM_BLOCK_K;
use crate::kernels::qlinear::{KERNELS, QKernel};
use crate::launch::{KernelArgs, Rows, check_disjoint, check_dtype, check_float, to_i64};
use crate::tensor::{Dims, Tensor, TensorView, TensorViewMut};

const OP: &str = "qlinear_backward_input";

impl QPath {
    /// The path of the input gradient for `dy` of `dtype` (`aligned`: its rows start on 16-byte
    /// boundaries): the tensor-core GEMM, or bands dequantized for the dense GEMM.
    pub fn for_input_grad(dtype: DType, aligned: bool) -> QPath {
        if aligned && dtype != DType::F32 { QPath::Gemm { k_splits: 1 } } else { QPath::DequantGemm }
    }
}

/// `dx (+)= dy W` through the packed weight `w` (`[out, in]`): the input gradient of
/// [`qlinear`](super::qlinear::qlinear) (`accumulate`: added to `dx`). `scratch` is needed on
/// the dequantize path (f32, or `dy` rows that are not 16-byte aligned; module docs).
pub fn qlinear_backward_input(
    dy: &Tensor,
    w: &QWeight,
    dx: &Tensor,
    accumulate: bool,
    scratch: Option<&QScratch>,
) -> Result<()> {
    qlinear_backward_input_on(dx.device(), &dy.view(), w, &mut TensorViewMut::of_tensor(dx), accumulate, scratch)
}

/// [`qlinear_backward_input`] on borrowed views, queued on `queue`.
pub fn qlinear_backward_input_on(
    queue: &impl Queue,
    dy: &TensorView<'_>,
    w: &QWeight,
    dx: &mut TensorViewMut<'_>,
    accumulate: bool,
    scratch: Option<&QScratch>,
) -> Result<()> {
    let device = queue.queue_device()?;
    let dtype = dy.dtype();
    check_float(OP, "dy", dtype)?;
    check_dtype(OP, "dx", dx.dtype(), dtype)?;
    if !device.same_context(w.device()) {
        return Err(Error::DeviceMismatch { op: OP, what: "weight" });
    }
    let [d_out, d_in] = w.shape();
    if dy.shape().last() != Some(&d_out) {
        return Err(Error::shape(OP, "dy", dy.shape().to_vec(), format!("[..., {d_out}] (out = the weight's rows)")));
    }
    let mut dx_expected = dy.shape().to_vec();
    if let Some(last) = dx_expected.last_mut() {
        *last = d_in;
    }
    if dx.shape() != dx_expected.as_slice() {
        return Err(Error::shape(OP, "dx", dx.shape().to_vec(), format!("{dx_expected:?}")));
    }
    let mut args = KernelArgs::new(OP, &device);
    let dxb = args.write("dx", dx)?;
    let dyb = args.read("dy", dy)?;
    let wb = args.read_tensor("weight", w.tensor())?;
    let (dyr, dxr) = (Rows::of(OP, "dy", &dyb, 1)?, Rows::of(OP, "dx", &dxb, 1)?);
    let wr = Rows { addr: wb, elem: 1, rows: 1, cols: w.bytes(), row_stride: w.bytes() };
    check_disjoint(OP, ("dx", dxr), ("dy", dyr))?;
    check_disjoint(OP, ("dx", dxr), ("weight", wr))?;
    if dxr.rows == 0 || d_in == 0 {
        return Ok(());
    }
    let aligned = dyr.addr % 16 == 0 && dyr.row_stride % dtype.vec16() == 0;
    match QPath::for_input_grad(dtype, aligned) {
        QPath::DequantGemm => {}
        path => {
            // W's packed bytes are the operand; with out == 0 the kernel writes dx = 0 (or
            // leaves dx + 0).
            let mut p = weight_params(w, wb)?;
            p.x = dyr.addr;
            p.y = dxr.addr;
            p.rows = to_i64(OP, "rows", dyr.rows)?;
            p.x_row_stride = to_i64(OP, "dy row stride", dyr.row_stride)?;
            p.y_row_stride = to_i64(OP, "dx row stride", dxr.row_stride)?;
            p.accumulate = i32::from(accumulate);
            // One split: every 64-deep step of W's rows.
            p.k_steps_per_split = i32::try_from(d_out.div_ceil(LLK_QGEMM_BLOCK_K as usize))
                .map_err(|_| Error::invalid(OP, "out features", d_out, "too many 64-row steps for i32"))?;
            let kernel = KERNELS.find(OP, "dy", (QKernel::GemmInputGrad, w.layout().format(), dtype))?;
            debug_assert_eq!(path, QPath::Gemm { k_splits: 1 });
            return args.launch(kernel, gemm_dims(OP, dyr.rows, d_in, 1)?, &p);
        }
    }
    drop(args);
    let scratch = scratch.ok_or_else(|| {
        let why = if aligned { "f32 needs a QScratch" } else { "dy rows that are not 16-byte aligned need a QScratch" };
        Error::invalid(OP, "scratch", "None", why)
    })?;
    let band_buf = scratch.band();
    check_dtype(OP, "scratch", band_buf.dtype(), dtype)?;
    if !device.same_context(band_buf.device()) {
        return Err(Error::DeviceMismatch { op: OP, what: "scratch" });
    }
    let band = band_rows(w.layout());
    if band_buf.numel() < band * d_in {
        let why = format!("needs {} elements (plan it with this weight)", band * d_in);
        return Err(Error::invalid(OP, "scratch", band_buf.numel(), why));
    }
    // One band at least: with out == 0 the dense GEMM of an empty band writes dx = 0.
    let mut n0 = 0;
    loop {
        let n = band.min(d_out - n0);
        if n > 0 {
            dequantize_band(&device, w, band_buf, n0, n)?;
        }
        let wv = band_buf.view().with_layout(&[n, d_in], &[d_in, 1], 0)?;
        let dy_cols = dy.clone().with_layout(&[dyr.rows, n], &[dyr.row_stride, 1], dy.offset() + n0)?;
        let dx_dims = Dims::new(OP, &[dxr.rows, d_in], &[dxr.row_stride, 1], dx.offset())?;
        let mut dxv = dx.reborrow_within(OP, dx_dims)?;
        linear_backward_input_on(&device, &dy_cols, &wv, &mut dxv, accumulate || n0 > 0)?;
        n0 += n;
        if n0 >= d_out {
            return Ok(());
        }
    }
}
