//! SwiGLU, `silu(gate) · up` (kernels/swiglu.cu), from separate gate and up or from one packed
//! `[gate | up]` tensor (a fused gate-up projection's output), with its backward: with
//! `s = sigmoid(gate)`, `d_up = d_out · gate · s` and `d_gate = d_out · up · s · (1 + gate (1 - s))`,
//! in f32, rounded once.

use candle::{Result, Shape, Tensor};
use llama_kernels::ops::{self as k, GateUpGrad, GateUpView};

use crate::bridge::{Forward, Input, Kernel, KernelStorage, arity, custom_op, kernel_err, launch, op_err};

/// `silu(gate) · up` elementwise; `gate` and `up` `[..., d]` of one float dtype. Differentiable
/// in both.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

/// `silu(gate) · up` from one `[..., 2d]` tensor, gate in columns `[0, d)` and up in `[d, 2d)`
/// (`gate, up = gate_up.chunk(2, -1)`): `[..., d]`. Differentiable.
pub fn swiglu_packed(gate_up: &Tensor) -> Result<Tensor> {
    gate_up.contiguous()?.apply_op1(SwiGluPacked)
}

struct SwiGlu;

impl Kernel for SwiGlu {
    const NAME: &'static str = "llama-kernels/swiglu";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [gate, up] = arity(Self::NAME, inputs)?;
        let device = gate.storage.kernel_device()?;
        let mut out = gate.zeros(gate.dims(), gate.dtype())?;
        let (gv, uv) = (gate.view()?, up.view()?);
        let input = GateUpView::Separate { gate: Some(&gv), up: &uv };
        k::swiglu_on(&device, input, &mut out.view_mut(gate.dims())?).map_err(kernel_err)?;
        Ok(vec![(out, gate.layout.shape().clone())])
    }
}
impl Forward for SwiGlu {}

impl SwiGlu {
    fn backward(&self, [gate, up]: [&Tensor; 2], _out: &Tensor, d_out: &Tensor) -> Result<[Option<Tensor>; 2]> {
        let mut grads = launch(&SwiGluBackward { packed: false }, &[&d_out.contiguous()?, gate, up])?.into_iter();
        Ok([grads.next(), grads.next()])
    }
}
custom_op!(CustomOp2 for SwiGlu);

struct SwiGluPacked;

/// `[..., 2d]` to `[..., d]`.
fn half_dims(op: &'static str, dims: &[usize]) -> Result<Vec<usize>> {
    match dims.split_last() {
        Some((&w, lead)) if w % 2 == 0 => Ok(lead.iter().copied().chain([w / 2]).collect()),
        _ => Err(op_err(op, format_args!("gate_up {dims:?} needs an even last dimension [..., 2d]"))),
    }
}

impl Kernel for SwiGluPacked {
    const NAME: &'static str = "llama-kernels/swiglu_packed";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [gate_up] = arity(Self::NAME, inputs)?;
        let device = gate_up.storage.kernel_device()?;
        let dims = half_dims(Self::NAME, gate_up.dims())?;
        let mut out = gate_up.zeros(&dims, gate_up.dtype())?;
        let pv = gate_up.view()?;
        k::swiglu_on(&device, GateUpView::GateThenUp(&pv), &mut out.view_mut(&dims)?).map_err(kernel_err)?;
        Ok(vec![(out, Shape::from_dims(&dims))])
    }
}
impl Forward for SwiGluPacked {}

impl SwiGluPacked {
    fn backward(&self, [gate_up]: [&Tensor; 1], _out: &Tensor, d_out: &Tensor) -> Result<[Option<Tensor>; 1]> {
        Ok([launch(&SwiGluBackward { packed: true }, &[&d_out.contiguous()?, gate_up])?.into_iter().next()])
    }
}
custom_op!(CustomOp1 for SwiGluPacked);

/// `[d_out, gate, up]` to `[d_gate, d_up]`, or `[d_out, gate_up]` to `[d_gate_up]` when packed.
struct SwiGluBackward {
    packed: bool,
}

impl Kernel for SwiGluBackward {
    const NAME: &'static str = "llama-kernels/swiglu_backward";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let device = inputs.first().map(|i| i.storage.kernel_device()).transpose()?;
        let device = device.ok_or_else(|| op_err(Self::NAME, "no inputs"))?;
        if self.packed {
            let [d_out, gate_up] = arity(Self::NAME, inputs)?;
            let mut grad = gate_up.zeros(gate_up.dims(), gate_up.dtype())?;
            {
                let (dov, pv) = (d_out.view()?, gate_up.view()?);
                let mut gv = grad.view_mut(gate_up.dims())?;
                k::swiglu_backward_on(&device, &dov, GateUpView::GateThenUp(&pv), GateUpGrad::GateThenUp(&mut gv))
                    .map_err(kernel_err)?;
            }
            return Ok(vec![(grad, gate_up.layout.shape().clone())]);
        }
        let [d_out, gate, up] = arity(Self::NAME, inputs)?;
        let (mut dg, mut du) = (gate.zeros(gate.dims(), gate.dtype())?, up.zeros(up.dims(), up.dtype())?);
        {
            let (dov, gv, uv) = (d_out.view()?, gate.view()?, up.view()?);
            let (mut dgv, mut duv) = (dg.view_mut(gate.dims())?, du.view_mut(up.dims())?);
            let grad = GateUpGrad::Separate { d_gate: &mut dgv, d_up: &mut duv };
            k::swiglu_backward_on(&device, &dov, GateUpView::Separate { gate: Some(&gv), up: &uv }, grad)
                .map_err(kernel_err)?;
        }
        Ok(vec![(dg, gate.layout.shape().clone()), (du, up.layout.shape().clone())])
    }
}
