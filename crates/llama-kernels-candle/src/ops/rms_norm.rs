//! RMSNorm, `y = x · rsqrt(mean(x²) + eps) · weight` over the last dimension, with its backward
//! (kernels/rms_norm.cu: one pass over each row, f32 statistics, one rounding).
//!
//! The backward recomputes `rsqrt` from `x` (nothing is saved) and reduces the weight's gradient
//! over rows in a fixed order, so the same inputs give the same bits on every run.

use candle::{Result, Shape, Tensor};
use llama_kernels::ops::{self as k, WeightGradView};

use crate::bridge::{Forward, Input, Kernel, KernelStorage, arity, custom_op, kernel_err, launch};

/// `x · rsqrt(mean(x²) + eps) · weight` over the last dimension of `x` (f32, f16 or bf16; any
/// leading dimensions), `weight` `[hidden]` of the same dtype. Differentiable in `x` and
/// `weight`. A non-contiguous `x` is made contiguous first.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&weight.contiguous()?, RmsNorm { eps })
}

struct RmsNorm {
    eps: f32,
}

impl Kernel for RmsNorm {
    const NAME: &'static str = "llama-kernels/rms_norm";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [x, w] = arity(Self::NAME, inputs)?;
        let device = x.storage.kernel_device()?;
        let mut y = x.zeros(x.dims(), x.dtype())?;
        let (xv, wv) = (x.view()?, w.view()?);
        k::rms_norm_on(&device, Some(&xv), &wv, self.eps, &mut y.view_mut(x.dims())?).map_err(kernel_err)?;
        Ok(vec![(y, x.layout.shape().clone())])
    }
}
impl Forward for RmsNorm {}

impl RmsNorm {
    fn backward(&self, [x, w]: [&Tensor; 2], _y: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 2]> {
        let [dx, dw] = <[Tensor; 2]>::try_from(launch(&RmsNormBackward { eps: self.eps }, &[&dy.contiguous()?, x, w])?)
            .map_err(|_| crate::bridge::op_err(RmsNormBackward::NAME, "expected two gradients"))?;
        Ok([Some(dx), Some(dw.to_dtype(w.dtype())?)])
    }
}
custom_op!(CustomOp2 for RmsNorm);

/// `[dy, x, weight]` to `[dx, dw]` (dw in f32).
struct RmsNormBackward {
    eps: f32,
}

impl Kernel for RmsNormBackward {
    const NAME: &'static str = "llama-kernels/rms_norm_backward";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [dy, x, w] = arity(Self::NAME, inputs)?;
        let device = x.storage.kernel_device()?;
        let hidden = x.dims().last().copied().unwrap_or(0);
        let rows = x.layout.shape().elem_count().checked_div(hidden).unwrap_or(0);
        let mut dx = x.zeros(x.dims(), x.dtype())?;
        let mut dw = x.zeros(&[hidden], candle::DType::F32)?;
        let scratch_len = k::rms_norm_backward::dw_scratch_len(rows, hidden);
        let mut scratch = x.zeros(&[scratch_len], candle::DType::F32)?;
        {
            let (dyv, xv, wv) = (dy.view()?, x.view()?, w.view()?);
            let (mut dxv, mut dwv, mut sv) =
                (dx.view_mut(x.dims())?, dw.view_mut(&[hidden])?, scratch.view_mut(&[scratch_len])?);
            let grad = WeightGradView { dw: &mut dwv, scratch: &mut sv, accumulate: false };
            k::rms_norm_backward_on(&device, Some(&dyv), &xv, &wv, self.eps, &mut dxv, None, Some(grad))
                .map_err(kernel_err)?;
        }
        Ok(vec![(dx, x.layout.shape().clone()), (dw, Shape::from_dims(&[hidden]))])
    }
}
