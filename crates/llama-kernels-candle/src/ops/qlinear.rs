//! A linear layer over a packed weight (kernels/qlinear.cu): `y = x Wᵀ` with W `[out, in]` kept
//! in a 4-, 5-, 6- or 8-bit format (GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K;
//! bitsandbytes' NF4), read packed by the kernels, never expanded to a dense copy. The weight is
//! frozen: the backward is the input gradient `dx = dy W`, computed from the packed bytes too
//! (what QLoRA trains through).

use std::sync::Arc;

use candle::{Module, Result, Shape, Tensor};
use llama_kernels::ops::qlinear::{self as q, QScratch, QWeight};
pub use llama_kernels::spec::quant::PackedWeight;

use crate::bridge::{Forward, Input, Kernel, KernelStorage, PerDevice, arity, custom_op, kernel_err, launch, op_err};

/// A frozen packed weight as a candle layer; its planes are uploaded once per device on first
/// use. Cloning shares them.
#[derive(Clone, Debug)]
pub struct QLinear {
    inner: Arc<Packed>,
}

#[derive(Debug)]
struct Packed {
    weight: PackedWeight,
    by_device: PerDevice<QWeight>,
}

impl QLinear {
    /// The layer of `weight` (`[out, in]`, packed; e.g. [`PackedWeight::quantize_nf4`]).
    pub fn new(weight: PackedWeight) -> QLinear {
        QLinear { inner: Arc::new(Packed { weight, by_device: PerDevice::new() }) }
    }
    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        self.inner.weight.shape()
    }
    /// The packed weight.
    pub fn weight(&self) -> &PackedWeight {
        &self.inner.weight
    }
}

impl Module for QLinear {
    /// `x Wᵀ` for x `[..., in]` (f32, f16 or bf16): `[..., out]`. Differentiable in x.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.contiguous()?.apply_op1(QLinearOp { packed: self.inner.clone(), backward: false })
    }
}

/// `[x]` to `x Wᵀ`, or as the backward `[dy]` to `dy W`.
struct QLinearOp {
    packed: Arc<Packed>,
    backward: bool,
}

impl Kernel for QLinearOp {
    const NAME: &'static str = "llama-kernels/qlinear";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [x] = arity(Self::NAME, inputs)?;
        let device = x.storage.kernel_device()?;
        let w = self.packed.by_device.get(Self::NAME, &device, |d| QWeight::new(d, &self.packed.weight))?;
        let [d_out, d_in] = w.shape();
        let (from, to) = if self.backward { (d_out, d_in) } else { (d_in, d_out) };
        let mut dims = x.dims().to_vec();
        match dims.last_mut() {
            Some(last) if *last == from => *last = to,
            _ => return Err(op_err(Self::NAME, format_args!("x {:?} must be [..., {from}]", x.dims()))),
        }
        let dtype = crate::bridge::kernel_dtype(Self::NAME, x.dtype())?;
        let scratch = QScratch::new(&device, dtype, &[&w]).map_err(kernel_err)?;
        let mut y = x.zeros(&dims, x.dtype())?;
        {
            let (xv, mut yv) = (x.view()?, y.view_mut(&dims)?);
            let run = if self.backward {
                llama_kernels::ops::qlinear_backward_input_on(&device, &xv, &w, &mut yv, false, Some(&scratch))
            } else {
                q::qlinear_on(&device, &xv, &w, &mut yv, Some(&scratch))
            };
            run.map_err(kernel_err)?;
        }
        Ok(vec![(y, Shape::from_dims(&dims))])
    }
}
impl Forward for QLinearOp {}

impl QLinearOp {
    fn backward(&self, [_x]: [&Tensor; 1], _y: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 1]> {
        let op = QLinearOp { packed: self.packed.clone(), backward: true };
        Ok([launch(&op, &[&dy.contiguous()?])?.into_iter().next()])
    }
}
custom_op!(CustomOp1 for QLinearOp);
