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

/// `sum = x + residual` (rounded to the dtype) and `y = rms_norm(sum, weight, eps)` in one pass:
/// the pre-norm residual step of a decoder layer. Returns `(y, sum)`, both differentiable; the
/// backward gives x and residual the same gradient (the one reaching `sum` through `y` plus the
/// one reaching it directly).
pub fn fused_add_rms_norm(x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    let both = x.contiguous()?.apply_op3(&residual.contiguous()?, &weight.contiguous()?, FusedAddRmsNorm { eps })?;
    Ok((both.get(0)?, both.get(1)?))
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

/// `[x, residual, weight]` to `[2, ...]`: y, then the sum, in one buffer (a `CustomOp` has one
/// output).
struct FusedAddRmsNorm {
    eps: f32,
}

impl Kernel for FusedAddRmsNorm {
    const NAME: &'static str = "llama-kernels/fused_add_rms_norm";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [x, residual, w] = arity(Self::NAME, inputs)?;
        let device = x.storage.kernel_device()?;
        if residual.dims() != x.dims() {
            return Err(crate::bridge::op_err(
                Self::NAME,
                format_args!("residual {:?} must be shaped like x {:?}", residual.dims(), x.dims()),
            ));
        }
        let both: Vec<usize> = [2].into_iter().chain(x.dims().iter().copied()).collect();
        // The sum starts as a copy of the residual, which the kernel updates in place.
        let mut out = x.zeros(&both, x.dtype())?;
        let n = x.layout.shape().elem_count();
        residual.storage.copy_strided_src(&mut out, n, residual.layout)?;
        let (xv, wv) = (x.view()?, w.view()?);
        out.with_pair(x.dims(), x.dims(), |y, sum| {
            k::fused_add_rms_norm_on(&device, Some(&xv), sum, &wv, self.eps, y).map_err(kernel_err)
        })?;
        Ok(vec![(out, Shape::from_dims(&both))])
    }
}
impl Forward for FusedAddRmsNorm {}

impl FusedAddRmsNorm {
    fn backward(&self, [_x, _r, w]: [&Tensor; 3], both: &Tensor, d_both: &Tensor) -> Result<[Option<Tensor>; 3]> {
        // dx = rms_norm_backward(dy at the sum) + d_sum, for x and residual alike.
        let (sum, dy, d_sum) = (both.get(1)?, d_both.get(0)?.contiguous()?, d_both.get(1)?.contiguous()?);
        let [dx, dw] = <[Tensor; 2]>::try_from(launch(&RmsNormBackward { eps: self.eps }, &[&dy, &sum, w, &d_sum])?)
            .map_err(|_| crate::bridge::op_err(RmsNormBackward::NAME, "expected two gradients"))?;
        Ok([Some(dx.clone()), Some(dx), Some(dw.to_dtype(w.dtype())?)])
    }
}
custom_op!(CustomOp3 for FusedAddRmsNorm);

/// `[dy, x, weight]` (and `d_residual`, the gradient reaching x directly) to `[dx, dw]` (dw in
/// f32).
struct RmsNormBackward {
    eps: f32,
}

impl Kernel for RmsNormBackward {
    const NAME: &'static str = "llama-kernels/rms_norm_backward";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let (dy, x, w, d_residual) = match inputs {
            [dy, x, w] => (dy, x, w, None),
            [dy, x, w, dr] => (dy, x, w, Some(dr)),
            _ => {
                return Err(crate::bridge::op_err(
                    Self::NAME,
                    format_args!("takes 3 or 4 inputs, got {}", inputs.len()),
                ));
            }
        };
        let device = x.storage.kernel_device()?;
        let hidden = x.dims().last().copied().unwrap_or(0);
        let rows = x.layout.shape().elem_count().checked_div(hidden).unwrap_or(0);
        let mut dx = x.zeros(x.dims(), x.dtype())?;
        let mut dw = x.zeros(&[hidden], candle::DType::F32)?;
        let scratch_len = k::rms_norm_backward::dw_scratch_len(rows, hidden);
        let mut scratch = x.zeros(&[scratch_len], candle::DType::F32)?;
        {
            let (dyv, xv, wv) = (dy.view()?, x.view()?, w.view()?);
            let drv = d_residual.map(Input::view).transpose()?;
            let (mut dxv, mut dwv, mut sv) =
                (dx.view_mut(x.dims())?, dw.view_mut(&[hidden])?, scratch.view_mut(&[scratch_len])?);
            let grad = WeightGradView { dw: &mut dwv, scratch: &mut sv, accumulate: false };
            k::rms_norm_backward_on(&device, Some(&dyv), &xv, &wv, self.eps, &mut dxv, drv.as_ref(), Some(grad))
                .map_err(kernel_err)?;
        }
        Ok(vec![(dx, x.layout.shape().clone()), (dw, Shape::from_dims(&[hidden]))])
    }
}
