//! LoRA adapters (peft's `LoraLayer`): the low-rank branch `y += scaling · dropout(x) Aᵀ Bᵀ` over
//! a frozen base projection, and its backward.
//!
//! ```
//! use llama_kernels::ops::linear::linear;
//! use llama_kernels::ops::lora::{LoraAdapter, LoraConfig, LoraScratch, lora_forward};
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (tokens, d_in, d_out) = (8, 64, 32);
//! let cfg = LoraConfig { r: 4, alpha: 8.0, dropout: 0.05, rslora: false };
//! let w = Tensor::zeros(&device, DType::BF16, &[d_out, d_in])?; // the frozen base
//! let a = Tensor::zeros(&device, DType::BF16, &[cfg.r, d_in])?;
//! let b = Tensor::zeros(&device, DType::BF16, &[d_out, cfg.r])?;
//! let x = Tensor::zeros(&device, DType::BF16, &[tokens, d_in])?;
//! let y = Tensor::zeros(&device, DType::BF16, &[tokens, d_out])?;
//! let scratch = LoraScratch::new(&device, DType::BF16, tokens, d_in, cfg.r)?;
//! linear(&x, &w, None, &y)?; // y = x Wᵀ
//! // y += 2 · dropout(x) Aᵀ Bᵀ, the mask keyed by (seed 1, stream 0).
//! lora_forward(&LoraAdapter { cfg, a: &a, b: &b, seed: 1, stream: 0 }, &x, &y, &scratch)?;
//! # Ok(())
//! # }
//! ```
//!
//! The branch runs as three launches: the dropout kernel writes `xs = dropout(x) · scaling`
//! (one pass, [`dropout`](mod@super::dropout)), then two products on
//! [`linear`](mod@super::linear)'s GEMM engine, `h = xs Aᵀ` and `y += h Bᵀ`. The backward
//! regenerates `xs` and `h` from `x` and the mask's key instead of storing them (`r` is small:
//! recomputing `h` costs `2 r / out` of the base's forward FLOPs), then
//! `dB (+)= dyᵀ h`, `dh = dy B`, `dA (+)= dhᵀ xs`, and `dx += dropout(dh A) · scaling` with the
//! forward's mask. The base's own input gradient (dense:
//! [`linear_backward_input`](mod@super::linear_backward), packed:
//! [`qlinear_backward_input`](mod@super::qlinear_backward)) writes `dx` first.
//!
//! Shapes: `x` `[tokens, in]`, `y` and `dy` `[tokens, out]`, `A` `[r, in]`, `B` `[out, r]`; rows
//! may be strided. One float dtype for activations and adapter weights; the gradients of `A` and
//! `B` in that dtype or f32 (the f32 accumulation of micro-batches). Mixed precision keeps f32
//! masters in the optimizer ([`AdamW`](super::optimizer::AdamW)), where peft's default keeps f32
//! adapter weights and runs the branch in f32 (`autocast_adapter_dtype`).

pub use crate::spec::dropout::Dropout;
pub use crate::spec::lora::LoraConfig;

use super::dropout::dropout_on;
use super::linear::{linear_add_on, linear_on};
use super::linear_backward::{linear_backward_input_on, linear_backward_weight_on};
use crate::backend::{Device, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::launch::check_dtype;
use crate::tensor::{Tensor, TensorView, TensorViewMut};

/// One adapter on one projection: its hyper-parameters, its weights and the key of its dropout
/// mask (a training step gives every (layer, projection, micro-step) its own `stream`).
#[derive(Clone, Copy, Debug)]
pub struct LoraAdapter<'a> {
    /// r, alpha, dropout, rsLoRA.
    pub cfg: LoraConfig,
    /// `[r, in]` (peft's `lora_A.weight`).
    pub a: &'a Tensor,
    /// `[out, r]` (peft's `lora_B.weight`).
    pub b: &'a Tensor,
    /// The dropout mask's seed.
    pub seed: u64,
    /// The dropout mask's stream.
    pub stream: u64,
}

/// [`LoraAdapter`] over borrowed views (the view-level calls).
#[derive(Clone, Copy, Debug)]
pub struct LoraAdapterView<'r, 'a> {
    /// r, alpha, dropout, rsLoRA.
    pub cfg: LoraConfig,
    /// `[r, in]`.
    pub a: &'r TensorView<'a>,
    /// `[out, r]`.
    pub b: &'r TensorView<'a>,
    /// The dropout mask's seed.
    pub seed: u64,
    /// The dropout mask's stream.
    pub stream: u64,
}

impl LoraAdapterView<'_, '_> {
    /// The dropout mask of this adapter.
    pub fn mask(&self) -> Dropout {
        Dropout { p: self.cfg.dropout, seed: self.seed, stream: self.stream }
    }

    /// Checks the config and the weights' shapes and dtypes; returns `[out, in]`.
    fn check(&self, op: &'static str, dtype: DType) -> Result<[usize; 2]> {
        self.cfg.check(op)?;
        check_dtype(op, "lora A", self.a.dtype(), dtype)?;
        check_dtype(op, "lora B", self.b.dtype(), dtype)?;
        let r = self.cfg.r;
        let [ar, d_in] = *self.a.shape() else {
            return Err(Error::shape(op, "lora A", self.a.shape().to_vec(), format!("[{r}, in]")));
        };
        let [d_out, br] = *self.b.shape() else {
            return Err(Error::shape(op, "lora B", self.b.shape().to_vec(), format!("[out, {r}]")));
        };
        if ar != r {
            return Err(Error::shape(op, "lora A", self.a.shape().to_vec(), format!("[{r}, in] (r = {r})")));
        }
        if br != r {
            return Err(Error::shape(op, "lora B", self.b.shape().to_vec(), format!("[out, {r}] (r = {r})")));
        }
        Ok([d_out, d_in])
    }
}

/// The gradients of one adapter's weights.
#[derive(Clone, Copy, Debug)]
pub struct LoraGrads<'a> {
    /// `[r, in]`, the dtype or f32.
    pub da: &'a Tensor,
    /// `[out, r]`, the dtype or f32.
    pub db: &'a Tensor,
    /// Add to `da` and `db` (gradient accumulation over micro-batches) instead of writing them.
    pub accumulate: bool,
}

/// [`LoraGrads`] over borrowed views.
#[derive(Debug)]
pub struct LoraGradsView<'r, 'a> {
    /// `[r, in]`, the dtype or f32.
    pub da: &'r mut TensorViewMut<'a>,
    /// `[out, r]`, the dtype or f32.
    pub db: &'r mut TensorViewMut<'a>,
    /// Add to `da` and `db` (gradient accumulation over micro-batches) instead of writing them.
    pub accumulate: bool,
}

/// Device scratch of the branch: `xs` `[tokens, in]` and `h` `[tokens, r]` for up to
/// `max_tokens` rows, `max_in` inputs and rank `r`, planned once per step shape. One scratch
/// serves every projection of a layer in turn (calls on one queue run in order).
#[derive(Debug)]
pub struct LoraScratch {
    xs: Tensor,
    h: Tensor,
}

impl LoraScratch {
    /// Scratch for `dtype` activations.
    pub fn new(device: &Device, dtype: DType, max_tokens: usize, max_in: usize, r: usize) -> Result<LoraScratch> {
        Ok(LoraScratch {
            xs: Tensor::zeros(device, dtype, &[max_tokens, max_in])?,
            h: Tensor::zeros(device, dtype, &[max_tokens, r])?,
        })
    }

    /// `xs` and `h` narrowed to `tokens` rows of `d_in` and `r`.
    fn parts(&self, op: &'static str, dtype: DType, tokens: usize, d_in: usize, r: usize) -> Result<(Tensor, Tensor)> {
        check_dtype(op, "scratch", self.xs.dtype(), dtype)?;
        let [max_tokens, max_in] = *self.xs.shape() else {
            return Err(Error::shape(op, "scratch", self.xs.shape().to_vec(), "[max_tokens, max_in]"));
        };
        let max_r = self.h.shape().get(1).copied().unwrap_or(0);
        if tokens > max_tokens || d_in > max_in || r > max_r {
            return Err(Error::invalid(
                op,
                "scratch",
                format!("{max_tokens} tokens, {max_in} inputs, rank {max_r}"),
                format!("too small for {tokens} tokens, {d_in} inputs, rank {r}"),
            ));
        }
        Ok((self.xs.narrow(0, 0, tokens)?.narrow(1, 0, d_in)?, self.h.narrow(0, 0, tokens)?.narrow(1, 0, r)?))
    }
}

/// `[tokens, d]` rows of a 2-D activation, else a shape error.
fn rows_of(op: &'static str, what: &'static str, shape: &[usize], d: usize, d_name: &str) -> Result<usize> {
    match *shape {
        [tokens, c] if c == d => Ok(tokens),
        _ => Err(Error::shape(op, what, shape.to_vec(), format!("[tokens, {d}] ({d_name})"))),
    }
}

/// `y += scaling · dropout(x) Aᵀ Bᵀ`: the branch added to the base's output `y`.
pub fn lora_forward(adapter: &LoraAdapter<'_>, x: &Tensor, y: &Tensor, scratch: &LoraScratch) -> Result<()> {
    let (a, b) = (adapter.a.view(), adapter.b.view());
    let view = LoraAdapterView { cfg: adapter.cfg, a: &a, b: &b, seed: adapter.seed, stream: adapter.stream };
    lora_forward_on(x.device(), &view, &x.view(), &mut TensorViewMut::of_tensor(y), scratch)
}

/// [`lora_forward`] on borrowed views, queued on `queue`.
pub fn lora_forward_on(
    queue: &impl Queue,
    adapter: &LoraAdapterView<'_, '_>,
    x: &TensorView<'_>,
    y: &mut TensorViewMut<'_>,
    scratch: &LoraScratch,
) -> Result<()> {
    const OP: &str = "lora_forward";
    let dtype = x.dtype();
    let [d_out, d_in] = adapter.check(OP, dtype)?;
    check_dtype(OP, "y", y.dtype(), dtype)?;
    let tokens = rows_of(OP, "x", x.shape(), d_in, "in = lora A's second dimension")?;
    if rows_of(OP, "y", y.shape(), d_out, "out = lora B's first dimension")? != tokens {
        return Err(Error::shape(OP, "y", y.shape().to_vec(), format!("[{tokens}, {d_out}] (x's rows)")));
    }
    let (xs, h) = scratch.parts(OP, dtype, tokens, d_in, adapter.cfg.r)?;
    dropout_on(queue, x, &mut TensorViewMut::of_tensor(&xs), &adapter.mask(), adapter.cfg.scaling(), false)?;
    linear_on(queue, &xs.view(), adapter.a, None, &mut TensorViewMut::of_tensor(&h))?;
    linear_add_on(queue, &h.view(), adapter.b, None, y)
}

/// The backward of [`lora_forward`] from `dy` (the gradient of `y`): the adapter's weight
/// gradients into `grads`, and, when `dx` is given, the branch's share of the input gradient
/// added to it (`dx += scaling · dropout(dy B A)`; the base writes `dx` first).
pub fn lora_backward(
    adapter: &LoraAdapter<'_>,
    x: &Tensor,
    dy: &Tensor,
    grads: &LoraGrads<'_>,
    dx: Option<&Tensor>,
    scratch: &LoraScratch,
) -> Result<()> {
    let (a, b) = (adapter.a.view(), adapter.b.view());
    let view = LoraAdapterView { cfg: adapter.cfg, a: &a, b: &b, seed: adapter.seed, stream: adapter.stream };
    let (mut dam, mut dbm) = (TensorViewMut::of_tensor(grads.da), TensorViewMut::of_tensor(grads.db));
    let mut grads = LoraGradsView { da: &mut dam, db: &mut dbm, accumulate: grads.accumulate };
    let mut dxm = dx.map(TensorViewMut::of_tensor);
    lora_backward_on(x.device(), &view, &x.view(), &dy.view(), &mut grads, dxm.as_mut(), scratch)
}

/// [`lora_backward`] on borrowed views, queued on `queue`.
pub fn lora_backward_on(
    queue: &impl Queue,
    adapter: &LoraAdapterView<'_, '_>,
    x: &TensorView<'_>,
    dy: &TensorView<'_>,
    grads: &mut LoraGradsView<'_, '_>,
    dx: Option<&mut TensorViewMut<'_>>,
    scratch: &LoraScratch,
) -> Result<()> {
    const OP: &str = "lora_backward";
    let dtype = x.dtype();
    let [d_out, d_in] = adapter.check(OP, dtype)?;
    check_dtype(OP, "dy", dy.dtype(), dtype)?;
    let tokens = rows_of(OP, "x", x.shape(), d_in, "in = lora A's second dimension")?;
    if rows_of(OP, "dy", dy.shape(), d_out, "out = lora B's first dimension")? != tokens {
        return Err(Error::shape(OP, "dy", dy.shape().to_vec(), format!("[{tokens}, {d_out}] (x's rows)")));
    }
    let r = adapter.cfg.r;
    if grads.da.shape() != [r, d_in] {
        return Err(Error::shape(OP, "da", grads.da.shape().to_vec(), format!("[{r}, {d_in}] like lora A")));
    }
    if grads.db.shape() != [d_out, r] {
        return Err(Error::shape(OP, "db", grads.db.shape().to_vec(), format!("[{d_out}, {r}] like lora B")));
    }
    if let Some(dx) = &dx {
        check_dtype(OP, "dx", dx.dtype(), dtype)?;
        if dx.shape() != [tokens, d_in] {
            return Err(Error::shape(OP, "dx", dx.shape().to_vec(), format!("[{tokens}, {d_in}] like x")));
        }
    }
    let (xs, h) = scratch.parts(OP, dtype, tokens, d_in, r)?;
    let (mask, scaling) = (adapter.mask(), adapter.cfg.scaling());
    // The forward's xs and h, regenerated.
    dropout_on(queue, x, &mut TensorViewMut::of_tensor(&xs), &mask, scaling, false)?;
    linear_on(queue, &xs.view(), adapter.a, None, &mut TensorViewMut::of_tensor(&h))?;
    // dB (+)= dyᵀ h, then h's buffer takes dh = dy B.
    linear_backward_weight_on(queue, dy, &h.view(), grads.db, grads.accumulate)?;
    linear_backward_input_on(queue, dy, adapter.b, &mut TensorViewMut::of_tensor(&h), false)?;
    // dA (+)= dhᵀ xs, then xs's buffer takes dh A, masked and scaled into dx.
    linear_backward_weight_on(queue, &h.view(), &xs.view(), grads.da, grads.accumulate)?;
    if let Some(dx) = dx {
        linear_backward_input_on(queue, &h.view(), adapter.a, &mut TensorViewMut::of_tensor(&xs), false)?;
        dropout_on(queue, &xs.view(), dx, &mask, scaling, true)?;
    }
    Ok(())
}
