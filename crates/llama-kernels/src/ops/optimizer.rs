//! AdamW over many tensors in one launch, after a deterministic global gradient norm with
//! clipping and a non-finite check, with `torch.amp.GradScaler`'s dynamic loss scale
//! (kernels/optimizer.cu).
//!
//! A step is three launches and no host synchronization: each fixed chunk of every gradient sums
//! its squares in f64; one block adds the chunk sums in order (so the norm has the same bits on
//! every run), derives the clip coefficient and `found_inf`, counts the step and updates the loss
//! scale; then every chunk applies `torch.optim.AdamW`'s update, or nothing when a gradient was
//! inf or NaN (the skipped step of f16 training: the scale is multiplied by `backoff` instead,
//! and grows by `growth` after `growth_interval` finite steps, as GradScaler does).
//!
//! Parameters are f32, f16 or bf16, updated in place; an optional f32 master copy per tensor is
//! then the update's source and destination (the parameter gets its rounding). Moments are f32,
//! owned by the optimizer. Gradients are f32, f16 or bf16, multiplied by the loss scale (1 when
//! not scaling). The learning rate travels with the launch ([`Lr::Host`]) or is read from a
//! device scalar ([`Lr::Device`], for CUDA graphs and device-side schedules).
//!
//! ```
//! use llama_kernels::ops::optimizer::{AdamW, AdamWConfig, Lr, ParamSlot};
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let w = Tensor::from_f64(&device, DType::F32, &[1.0, -2.0], &[2])?;
//! let g = Tensor::from_f64(&device, DType::F32, &[0.5, 0.5], &[2])?;
//! let opt = AdamW::new(&device, &[ParamSlot { param: &w, grad: &g, master: None }], AdamWConfig::default())?;
//! opt.step(Lr::Host(1e-3))?;
//! // The first step moves each weight by about lr against its gradient's sign (and decays it).
//! let w = w.to_f64_vec()?;
//! assert!((w[0] - (1.0 * (1.0 - 1e-5) - 1e-3)).abs() < 1e-6);
//! assert_eq!(opt.stats()?.step, 1);
//! # Ok(())
//! # }
//! ```

use crate::backend::{Device, LaunchDims};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    LLK_OPTIM_CHUNK, LLK_OPTIM_REDUCE_THREADS, LLK_OPTIM_THREADS, LlkFloatType, LlkOptimChunk, LlkOptimSlot,
    LlkOptimState, OptimizerParams,
};
use crate::kernels::optimizer::{ADAMW, FINALIZE, NORM_PARTIALS};
use crate::launch::{KernelArgs, grid_x, to_i64};
use crate::tensor::Tensor;

const OP: &str = "adamw";
const CHUNK: usize = LLK_OPTIM_CHUNK as usize;

/// GradScaler's dynamic loss scale (its defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaling {
    /// The first step's scale (65536).
    pub init_scale: f32,
    /// Multiplies the scale after `growth_interval` finite steps in a row (2).
    pub growth_factor: f32,
    /// Multiplies the scale after a non-finite step (0.5).
    pub backoff_factor: f32,
    /// Finite steps before the scale grows (2000).
    pub growth_interval: u32,
}

impl Default for LossScaling {
    fn default() -> Self {
        LossScaling { init_scale: 65536.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000 }
    }
}

/// AdamW's hyperparameters (torch's defaults), the clipping and the loss scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// The first moment's decay (0.9).
    pub beta1: f32,
    /// The second moment's decay (0.999).
    pub beta2: f32,
    /// Added to the denominator (1e-8).
    pub eps: f32,
    /// Decoupled: `p *= 1 - lr * weight_decay` (0.01).
    pub weight_decay: f32,
    /// Clip the global norm of the gradients to this (`clip_grad_norm_`); `None`: no clipping.
    pub max_grad_norm: Option<f32>,
    /// f16 training's dynamic loss scale; `None`: gradients unscaled, and a non-finite one still
    /// skips the step (the scale stays 1).
    pub loss_scaling: Option<LossScaling>,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, max_grad_norm: None, loss_scaling: None }
    }
}

/// One tensor the optimizer updates.
#[derive(Clone, Copy, Debug)]
pub struct ParamSlot<'a> {
    /// f32, f16 or bf16, contiguous; updated in place.
    pub param: &'a Tensor,
    /// The same shape, f32, f16 or bf16, contiguous.
    pub grad: &'a Tensor,
    /// An f32 master copy (same shape, contiguous), or `None`.
    pub master: Option<&'a Tensor>,
}

/// Where a step's learning rate comes from.
#[derive(Clone, Copy, Debug)]
pub enum Lr<'a> {
    /// A value carried by the launch.
    Host(f32),
    /// A `[1]` f32 tensor on the device, read by the kernel.
    Device(&'a Tensor),
}

/// What the last step found ([`AdamW::stats`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OptimStats {
    /// The global L2 norm of the unscaled gradients (before clipping).
    pub grad_norm: f32,
    /// A gradient was inf or NaN and the step was skipped.
    pub found_inf: bool,
    /// The loss scale for the next step.
    pub loss_scale: f32,
    /// Completed (not skipped) steps.
    pub step: i64,
}

/// A planned AdamW over a fixed set of tensors: the moments, the tensor and chunk tables on the
/// device, the norm's partial sums and the step state. The tensors must stay alive and in place
/// (the optimizer keeps handles to them).
#[derive(Debug)]
pub struct AdamW {
    config: AdamWConfig,
    /// The caller's tensors and the moments, kept alive for the addresses in `slots`.
    tensors: Vec<Tensor>,
    slots: Tensor,
    chunks: Tensor,
    partials: Tensor,
    state: Tensor,
    n_chunks: usize,
}

fn float_type(op: &'static str, what: &'static str, dtype: DType) -> Result<LlkFloatType> {
    match dtype {
        DType::F32 => Ok(LlkFloatType::LLK_FLOAT_F32),
        DType::F16 => Ok(LlkFloatType::LLK_FLOAT_F16),
        DType::BF16 => Ok(LlkFloatType::LLK_FLOAT_BF16),
        other => Err(Error::UnsupportedDType { op, what, dtype: other, supported: "f32, f16, bf16".into() }),
    }
}

/// The bytes of plain C structs without padding (the generated params types below).
///
/// # Safety
/// `T` must be a `repr(C)` struct of integers, floats and `repr(i32)`/`repr(u32)` enums with no
/// padding bytes, so that every byte is initialized.
unsafe fn pod_bytes<T: Copy>(values: &[T]) -> Vec<u8> {
    // SAFETY: the caller's contract: every byte of `values` is initialized.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)).to_vec() }
}

// No padding in the structs handed to pod_bytes: their sizes are the sums of their fields'.
const _: () = assert!(std::mem::size_of::<LlkOptimSlot>() == 6 * 8 + 2 * 4);
const _: () = assert!(std::mem::size_of::<LlkOptimChunk>() == 2 * 8);
const _: () = assert!(std::mem::size_of::<LlkOptimState>() == 6 * 4 + 8);

impl AdamW {
    /// Plans the optimizer of `params` on `device`: allocates zeroed moments, uploads the tables.
    pub fn new(device: &Device, params: &[ParamSlot<'_>], config: AdamWConfig) -> Result<AdamW> {
        let check = |what: &'static str, v: f32, ok: bool| {
            if ok { Ok(()) } else { Err(Error::invalid(OP, what, v, "out of range")) }
        };
        check("beta1", config.beta1, (0.0..1.0).contains(&config.beta1))?;
        check("beta2", config.beta2, (0.0..1.0).contains(&config.beta2))?;
        check("eps", config.eps, config.eps.is_finite() && config.eps >= 0.0)?;
        check("weight_decay", config.weight_decay, config.weight_decay.is_finite())?;
        if let Some(m) = config.max_grad_norm {
            check("max_grad_norm", m, m.is_finite() && m > 0.0)?;
        }
        if let Some(s) = config.loss_scaling {
            check("init_scale", s.init_scale, s.init_scale.is_finite() && s.init_scale > 0.0)?;
            check("growth_factor", s.growth_factor, s.growth_factor.is_finite() && s.growth_factor >= 1.0)?;
            check("backoff_factor", s.backoff_factor, s.backoff_factor > 0.0 && s.backoff_factor <= 1.0)?;
        }
        let mut tensors = Vec::new();
        let (mut slots, mut chunks) = (Vec::new(), Vec::new());
        for (i, p) in params.iter().enumerate() {
            let param_type = float_type(OP, "param", p.param.dtype())?;
            let grad_type = float_type(OP, "grad", p.grad.dtype())?;
            for (what, t) in [("param", p.param), ("grad", p.grad)].into_iter().chain(p.master.map(|m| ("master", m))) {
                if !t.device().same_context(device) {
                    return Err(Error::DeviceMismatch { op: OP, what });
                }
                if !t.is_contiguous() {
                    return Err(Error::shape(OP, what, t.shape().to_vec(), "contiguous"));
                }
                if t.shape() != p.param.shape() {
                    return Err(Error::shape(
                        OP,
                        what,
                        t.shape().to_vec(),
                        format!("{:?} like param {i}", p.param.shape()),
                    ));
                }
            }
            if let Some(m) = p.master {
                if m.dtype() != DType::F32 {
                    return Err(Error::DTypeMismatch { op: OP, what: "master", expected: DType::F32, got: m.dtype() });
                }
            }
            let numel = p.param.numel();
            let (m, v) = (
                Tensor::zeros(device, DType::F32, &[numel.max(1)])?,
                Tensor::zeros(device, DType::F32, &[numel.max(1)])?,
            );
            // The addresses the kernels reach through the table; each launch registers these
            // tensors with its KernelArgs, which orders and guards them like direct arguments.
            let addr = |t: &Tensor| t.storage().address() + (t.offset() * t.dtype().size()) as u64;
            slots.push(LlkOptimSlot {
                param: addr(p.param),
                grad: addr(p.grad),
                m: addr(&m),
                v: addr(&v),
                master: p.master.map_or(0, addr),
                numel: to_i64(OP, "numel", numel)?,
                param_type,
                grad_type,
            });
            for start in (0..numel).step_by(CHUNK) {
                chunks.push(LlkOptimChunk { slot: to_i64(OP, "slot", i)?, start: to_i64(OP, "start", start)? });
            }
            tensors.extend([p.param.clone(), p.grad.clone(), m, v]);
            tensors.extend(p.master.cloned());
        }
        let scale = config.loss_scaling.map_or(1.0, |s| s.init_scale);
        let state = LlkOptimState {
            loss_scale: scale,
            grad_norm: 0.0,
            clip_coef: 1.0,
            found_inf: 0,
            growth_tracker: 0,
            pad: 0,
            step: 0,
        };
        let n_chunks = chunks.len();
        // SAFETY: the three types have no padding (the size assertions above).
        let (slot_bytes, chunk_bytes, state_bytes) =
            unsafe { (pod_bytes(&slots), pod_bytes(&chunks), pod_bytes(std::slice::from_ref(&state))) };
        let upload =
            |b: &[u8]| Tensor::from_slice(device, if b.is_empty() { &[0u8; 16] } else { b }, &[b.len().max(16)]);
        Ok(AdamW {
            config,
            tensors,
            slots: upload(&slot_bytes)?,
            chunks: upload(&chunk_bytes)?,
            partials: Tensor::zeros(device, DType::I64, &[n_chunks.max(1)])?,
            state: upload(&state_bytes)?,
            n_chunks,
        })
    }

    /// One step at learning rate `lr` (three launches, no host wait).
    pub fn step(&self, lr: Lr<'_>) -> Result<()> {
        let device = self.state.device();
        let lr_value = match lr {
            Lr::Host(v) if v.is_finite() && v >= 0.0 => v,
            Lr::Host(v) => return Err(Error::invalid(OP, "lr", v, "must be finite and >= 0")),
            Lr::Device(t) => {
                if t.dtype() != DType::F32 || t.numel() != 1 {
                    return Err(Error::shape(OP, "lr", t.shape().to_vec(), "one f32 ([1] or [])"));
                }
                0.0
            }
        };
        let lr_tensor = match lr {
            Lr::Device(t) => Some(t),
            Lr::Host(_) => None,
        };
        let chunks = LaunchDims {
            grid: (grid_x(OP, self.n_chunks.max(1))?, 1, 1),
            block: (LLK_OPTIM_THREADS, 1, 1),
            smem_at_launch: 0,
        };
        let one = LaunchDims { grid: (1, 1, 1), block: (LLK_OPTIM_REDUCE_THREADS, 1, 1), smem_at_launch: 0 };
        if self.n_chunks > 0 {
            let mut args = KernelArgs::new(OP, device);
            let mut p = self.params(&mut args, lr_value)?;
            p.partials = args.write_tensor("partials", &self.partials)?;
            for t in &self.tensors {
                args.read_tensor("tensors", t)?;
            }
            args.launch(NORM_PARTIALS, chunks, &p)?;
        }
        {
            let mut args = KernelArgs::new(OP, device);
            let mut p = self.params(&mut args, lr_value)?;
            p.partials = args.read_tensor("partials", &self.partials)?;
            p.state = args.write_tensor("state", &self.state)?;
            args.launch(FINALIZE, one, &p)?;
        }
        if self.n_chunks > 0 {
            let mut args = KernelArgs::new(OP, device);
            let mut p = self.params(&mut args, lr_value)?;
            p.state = args.read_tensor("state", &self.state)?;
            if let Some(t) = lr_tensor {
                p.lr_device = args.read_tensor("lr", t)?;
            }
            for t in &self.tensors {
                args.write_tensor("tensors", t)?;
            }
            args.launch(ADAMW, chunks, &p)?;
        }
        Ok(())
    }

    /// The params every launch of a step shares (the tables registered with `args`).
    fn params<'a>(&'a self, args: &mut KernelArgs<'a>, lr: f32) -> Result<OptimizerParams> {
        let scaling = self.config.loss_scaling;
        Ok(OptimizerParams {
            slots: args.read_tensor("slots", &self.slots)?,
            chunks: args.read_tensor("chunks", &self.chunks)?,
            partials: 0,
            state: 0,
            lr_device: 0,
            n_chunks: to_i64(OP, "chunks", self.n_chunks)?,
            lr,
            beta1: self.config.beta1,
            beta2: self.config.beta2,
            eps: self.config.eps,
            weight_decay: self.config.weight_decay,
            max_norm: self.config.max_grad_norm.unwrap_or(0.0),
            backoff: scaling.map_or(1.0, |s| s.backoff_factor),
            growth: scaling.map_or(1.0, |s| s.growth_factor),
            growth_interval: scaling.map_or(0, |s| s.growth_interval.min(i32::MAX as u32) as i32),
        })
    }

    /// The state after the last step (waits for the device).
    pub fn stats(&self) -> Result<OptimStats> {
        let b = self.state.to_vec::<u8>()?;
        let f = |o: usize| f32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let i = |o: usize| i32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut step = [0u8; 8];
        step.copy_from_slice(&b[24..32]);
        Ok(OptimStats { loss_scale: f(0), grad_norm: f(4), found_inf: i(12) != 0, step: i64::from_le_bytes(step) })
    }
}
