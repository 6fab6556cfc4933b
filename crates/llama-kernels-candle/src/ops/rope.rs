//! Rotary position embedding (kernels/rope.cu) at positions given as a tensor, with its
//! backward (the rotation by the negated angle; with Llama 4's qk-norm, the norm's backward
//! too). Both pairings (`RopeLayout::HalfSplit`, Hugging Face's `rotate_half`, and
//! `RopeLayout::Interleaved`), Llama 3.1 frequency scaling and partial rotary come from the
//! [`RopeConfig`].
//!
//! Layout: `x` is `[tokens, heads, head_dim]` or `[batch, seq, heads, head_dim]` (tokens
//! outermost, as a fused QKV projection's output is laid out); candle's `[batch, heads, seq,
//! head_dim]` convention is `x.transpose(1, 2)` before and after. `positions` holds one i32 or
//! i64 position per token (`[tokens]` or `[batch, seq]`), so ragged batches and decode at any
//! offset work.

use std::sync::Arc;

use candle::{Result, Shape, Tensor};
use llama_kernels::ops::rope::{Rope, RopeConfig, Saved};

use crate::bridge::{Forward, Input, Kernel, KernelStorage, PerDevice, custom_op, kernel_err, launch, op_err};

/// A RoPE configuration with its inverse-frequency table uploaded once per device (candle's
/// CPU, each CUDA stream) on first use.
#[derive(Clone, Debug)]
pub struct RotaryEmbedding {
    tables: Arc<Tables>,
}

#[derive(Debug)]
struct Tables {
    config: RopeConfig,
    by_device: PerDevice<Rope>,
}

impl RotaryEmbedding {
    /// Checks `config` (head_dim, rotary_dim, theta, scaling) and keeps it; nothing is uploaded
    /// until the first call.
    pub fn new(config: RopeConfig) -> Result<RotaryEmbedding> {
        config.validate().map_err(kernel_err)?;
        Ok(RotaryEmbedding { tables: Arc::new(Tables { config, by_device: PerDevice::new() }) })
    }

    /// The configuration.
    pub fn config(&self) -> &RopeConfig {
        &self.tables.config
    }

    /// `x` rotated at `positions` (see the module docs for the shapes), as a new contiguous
    /// tensor. Differentiable in `x`.
    pub fn forward(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor> {
        x.apply_op2(&positions.contiguous()?, RopeOp { tables: self.tables.clone(), backward: false })
    }
}

/// `x` rotated at `positions` with `config` (a one-off [`RotaryEmbedding`]: the table is
/// uploaded on every call; keep a `RotaryEmbedding` to upload it once).
pub fn rope(x: &Tensor, positions: &Tensor, config: &RopeConfig) -> Result<Tensor> {
    RotaryEmbedding::new(*config)?.forward(x, positions)
}

/// `[x, positions]` to the rotated x; as the backward, `[dy, positions]` (or `[dy, positions,
/// x]` with a qk-norm) to dx.
struct RopeOp {
    tables: Arc<Tables>,
    backward: bool,
}

/// `[..., heads, head_dim]` as `[tokens, heads, head_dim]`.
fn token_dims(op: &'static str, dims: &[usize]) -> Result<[usize; 3]> {
    match dims {
        [lead @ .., heads, head_dim] if !lead.is_empty() => Ok([lead.iter().product(), *heads, *head_dim]),
        _ => Err(op_err(
            op,
            format_args!("x {dims:?} must be [tokens, heads, head_dim] or [batch, seq, heads, head_dim]"),
        )),
    }
}

impl Kernel for RopeOp {
    const NAME: &'static str = "llama-kernels/rope";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let (x, positions, saved) = match inputs {
            [x, p] => (x, p, None),
            [x, p, saved] => (x, p, Some(saved)),
            _ => return Err(op_err(Self::NAME, format_args!("takes 2 or 3 inputs, got {}", inputs.len()))),
        };
        let device = x.storage.kernel_device()?;
        let rope = self.tables.by_device.get(Self::NAME, &device, |d| Rope::new(d, self.tables.config))?;
        let dims = token_dims(Self::NAME, x.dims())?;
        let pv = positions.view_as(Self::NAME, "positions", &[dims[0]])?;
        // Out of place: copy, then rotate the copy in place.
        let mut out = x.copy()?;
        {
            let mut ov = out.view_mut(&dims)?;
            if self.backward {
                let sv = saved.map(|s| s.view_as(Self::NAME, "x", &dims)).transpose()?;
                let saved = sv.as_ref().map(|q| Saved { q, k: None });
                rope.backward_on(&device, &mut ov, None, &pv, saved).map_err(kernel_err)?;
            } else {
                rope.apply_on(&device, &mut ov, None, &pv).map_err(kernel_err)?;
            }
        }
        Ok(vec![(out, x.layout.shape().clone())])
    }
}
impl Forward for RopeOp {}

impl RopeOp {
    fn backward(&self, [x, positions]: [&Tensor; 2], _y: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 2]> {
        let op = RopeOp { tables: self.tables.clone(), backward: true };
        let dy = dy.contiguous()?;
        let x = x.contiguous()?;
        let inputs: Vec<&Tensor> =
            if self.tables.config.qk_norm_eps.is_some() { vec![&dy, positions, &x] } else { vec![&dy, positions] };
        Ok([launch(&op, &inputs)?.into_iter().next(), None])
    }
}
custom_op!(CustomOp2 for RopeOp);
