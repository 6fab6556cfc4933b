//! The LoRA branch of a linear layer, peft's: `scaling · dropout(x) Aᵀ Bᵀ` with
//! `scaling = alpha / r` (or `alpha / √r`, rsLoRA), A `[r, in]`, B `[out, r]`
//! (kernels/dropout.cu and two GEMMs; cuBLAS on CUDA).
//!
//! The dropout mask is a pure function of `(seed, stream, row, column)` (Philox), so the
//! backward regenerates it instead of keeping it: pass a new seed each training step, and a
//! different stream to each adapter of one step. The backward gives dA and dB and the branch's
//! share of dx; candle adds it to the base layer's.

use candle::{Result, Shape, Tensor};
use llama_kernels::ops::lora::{LoraAdapterView, LoraGradsView, LoraScratch};
use llama_kernels::ops::{self as k};
pub use llama_kernels::spec::lora::LoraConfig;

use crate::bridge::{Forward, Input, Kernel, KernelStorage, arity, custom_op, kernel_err, launch, op_err};

/// One adapter's hyper-parameters and its dropout stream: what the branch needs besides x, A
/// and B.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lora {
    /// Rank, alpha, dropout, rsLoRA.
    pub config: LoraConfig,
    /// The dropout seed (a new one each step).
    pub seed: u64,
    /// Which of a step's adapters this is (masks of different streams are independent).
    pub stream: u64,
}

impl Lora {
    /// `scaling · dropout(x) Aᵀ Bᵀ` for x `[..., in]` (x, A and B of one float dtype): the
    /// branch's output `[..., out]`, to add to the base layer's. Differentiable in x, A and B.
    pub fn branch(&self, x: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let (lead, d_in) = match x.dims().split_last() {
            Some((&d_in, lead)) => (lead.to_vec(), d_in),
            None => return Err(op_err(LoraBranch::NAME, "x must be [..., in]")),
        };
        let x2 = x.contiguous()?.reshape(((lead.iter().product::<usize>()), d_in))?;
        let y = x2.apply_op3(&a.contiguous()?, &b.contiguous()?, LoraBranch { lora: *self })?;
        let d_out = y.dim(1)?;
        y.reshape(lead.into_iter().chain([d_out]).collect::<Vec<_>>())
    }
}

/// `[x, A, B]` (x `[tokens, in]`) to the branch `[tokens, out]`.
struct LoraBranch {
    lora: Lora,
}

impl LoraBranch {
    fn scratch(device: &llama_kernels::Device, x: &[usize], dtype: candle::DType, r: usize) -> Result<LoraScratch> {
        let dtype = crate::bridge::kernel_dtype(Self::NAME, dtype)?;
        let (tokens, d_in) = match x {
            [t, d] => (*t, *d),
            _ => return Err(op_err(Self::NAME, format_args!("x {x:?} must be [tokens, in]"))),
        };
        LoraScratch::new(device, dtype, tokens, d_in, r).map_err(kernel_err)
    }
}

impl Kernel for LoraBranch {
    const NAME: &'static str = "llama-kernels/lora";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [x, a, b] = arity(Self::NAME, inputs)?;
        let device = x.storage.kernel_device()?;
        let (tokens, d_out) = (x.dims().first().copied().unwrap_or(0), b.dims().first().copied().unwrap_or(0));
        let scratch = Self::scratch(&device, x.dims(), x.dtype(), self.lora.config.r)?;
        let mut y = x.zeros(&[tokens, d_out], x.dtype())?;
        let (xv, av, bv) = (x.view()?, a.view()?, b.view()?);
        let adapter =
            LoraAdapterView { cfg: self.lora.config, a: &av, b: &bv, seed: self.lora.seed, stream: self.lora.stream };
        k::lora::lora_forward_on(&device, &adapter, &xv, &mut y.view_mut(&[tokens, d_out])?, &scratch)
            .map_err(kernel_err)?;
        Ok(vec![(y, Shape::from_dims(&[tokens, d_out]))])
    }
}
impl Forward for LoraBranch {}

impl LoraBranch {
    fn backward(&self, [x, a, b]: [&Tensor; 3], _y: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]> {
        let mut g = launch(&LoraBackward { lora: self.lora }, &[x, a, b, &dy.contiguous()?])?.into_iter();
        Ok([g.next(), g.next(), g.next()])
    }
}
custom_op!(CustomOp3 for LoraBranch);

/// `[x, A, B, dy]` to `[dx (the branch's share), dA, dB]`.
struct LoraBackward {
    lora: Lora,
}

impl Kernel for LoraBackward {
    const NAME: &'static str = "llama-kernels/lora_backward";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [x, a, b, dy] = arity(Self::NAME, inputs)?;
        let device = x.storage.kernel_device()?;
        let scratch = LoraBranch::scratch(&device, x.dims(), x.dtype(), self.lora.config.r)?;
        let (mut dx, mut da, mut db) =
            (x.zeros(x.dims(), x.dtype())?, a.zeros(a.dims(), a.dtype())?, b.zeros(b.dims(), b.dtype())?);
        {
            let (xv, av, bv, dyv) = (x.view()?, a.view()?, b.view()?, dy.view()?);
            let adapter = LoraAdapterView {
                cfg: self.lora.config,
                a: &av,
                b: &bv,
                seed: self.lora.seed,
                stream: self.lora.stream,
            };
            let (mut dxv, mut dav, mut dbv) = (dx.view_mut(x.dims())?, da.view_mut(a.dims())?, db.view_mut(b.dims())?);
            let mut grads = LoraGradsView { da: &mut dav, db: &mut dbv, accumulate: false };
            k::lora::lora_backward_on(&device, &adapter, &xv, &dyv, &mut grads, Some(&mut dxv), &scratch)
                .map_err(kernel_err)?;
        }
        let shape = |i: &Input<'_, S>| i.layout.shape().clone();
        Ok(vec![(dx, shape(x)), (da, shape(a)), (db, shape(b))])
    }
}
