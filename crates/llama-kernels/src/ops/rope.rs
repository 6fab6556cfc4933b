//! Rotary position embedding of q and k, in place, in one launch (kernels/rope.cu).
//!
//! Build a [`Rope`] once per model configuration (it uploads the f64-exact inverse-frequency
//! table: the only allocation), then call [`Rope::apply`] on every batch:
//!
//! ```
//! use llama_kernels::ops::rope::{Rope, RopeConfig};
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let rope = Rope::new(&device, RopeConfig::llama3_1(128))?;
//! let (tokens, q_heads, kv_heads) = (3, 4, 1);
//! let q = Tensor::zeros(&device, DType::BF16, &[tokens, q_heads, 128])?;
//! let k = Tensor::zeros(&device, DType::BF16, &[tokens, kv_heads, 128])?;
//! let positions = Tensor::from_slice(&device, &[0i32, 1, 131071], &[tokens])?;
//! rope.apply(&q, Some(&k), &positions)?;
//! # Ok(())
//! # }
//! ```
//!
//! Shapes: q `[tokens, q_heads, head_dim]` and k `[tokens, kv_heads, head_dim]` (more leading
//! dimensions are fine if they collapse into one token stride), `head_dim` contiguous, any token
//! and head strides (views into a fused QKV buffer work), same float dtype; positions `[tokens]`,
//! i32 or i64, contiguous (ragged batches, decode at any offset).
//!
//! Position domain: `|p| <= 2^24 - 1` ([`MAX_POSITION`]), where every angle is within 3e-7 rad
//! of exact (Llama 4's 10M-token context fits). Positions are device data, so they are not
//! checked on the host: a position outside the domain is clamped to `+-(2^24 - 1)` by the kernel
//! (on both targets; the reference does the same), so the result is always a rotation, at the
//! clamped angle, never garbage.
//! NoPE layers (Llama 4) simply do not call this.
//!
//! Backward: [`Rope::backward`] turns the gradients of the rotated q and k into the gradients of
//! their inputs, in place. Without a qk-norm it is the transpose, the rotation by the negated
//! angle (the kernel's angle is exactly odd, so rotating forward then backward in f32 is within a
//! rounding of the identity) and needs nothing saved. With Llama 4's qk-norm (`y = s R x`,
//! `s = 1 / sqrt(mean((R x)^2) + eps)`) it needs the forward's inputs q and k ([`Saved`]) and
//! computes `dx = R^T (s dy - s^3 z mean(z dy))` with `z = R x` recomputed.

use crate::backend::{Device, LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    LLK_ROPE_MAX_THREADS, LlkIndexType, LlkRopeDirection, LlkRopeLayout, LlkRopeNorm, RopeParams,
};
use crate::kernels::Access;
use crate::kernels::rope::{KERNELS, RopeKernel};
use crate::launch::KernelArgs;
use crate::launch::{Arg, Heads, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
pub use crate::spec::rope::{Llama3Scaling, MAX_POSITION, MAX_ROTARY_DIM, RopeConfig, RopeLayout};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

const OP: &str = "rope";
const BACKWARD_OP: &str = "rope_backward";
/// Threads per block (kMaxThreads in kernels/rope.cu).
const MAX_THREADS: usize = LLK_ROPE_MAX_THREADS as usize;

/// A RoPE configuration bound to a device, with its inverse-frequency table uploaded.
#[derive(Clone, Debug)]
pub struct Rope {
    config: RopeConfig,
    inv_freq: Vec<f64>,
    /// `[rotary_dim / 2, 2]` f32: each f64 inverse frequency as hi + lo.
    table: Tensor,
}

/// The forward's inputs (q and k before rotation), which the qk-norm's backward recomputes from:
/// `Saved<&Tensor>` for [`Rope::backward`], `Saved<&TensorView>` for [`Rope::backward_on`].
#[derive(Clone, Copy, Debug)]
pub struct Saved<T> {
    /// The input q, shaped like the q gradient.
    pub q: T,
    /// The input k, shaped like the k gradient; given exactly when a k gradient is.
    pub k: Option<T>,
}

/// Elements per chunk and the chunk cap per thread, mirroring `Chunking` in kernels/rope.cu.
fn chunking(layout: RopeLayout, vec: usize) -> (usize, usize) {
    let pairs = if layout == RopeLayout::Interleaved { vec / 2 } else { vec };
    (pairs, if pairs >= 8 { 1 } else { 8 / pairs })
}

impl Rope {
    /// Validates `config` and uploads its inverse-frequency table to `device`.
    pub fn new(device: &Device, config: RopeConfig) -> Result<Rope> {
        config.validate()?;
        let inv_freq = crate::spec::rope::inv_freq(&config);
        let split: Vec<f32> = inv_freq
            .iter()
            .flat_map(|&f| {
                let hi = f as f32;
                [hi, (f - f64::from(hi)) as f32]
            })
            .collect();
        let table = Tensor::from_slice(device, &split, &[inv_freq.len(), 2])?;
        Ok(Rope { config, inv_freq, table })
    }

    /// The configuration the frequency table was built from.
    pub fn config(&self) -> &RopeConfig {
        &self.config
    }
    /// The device the frequency table lives on (the calls' queue must be of its context).
    pub fn device(&self) -> &Device {
        self.table.device()
    }
    /// The f64 inverse frequencies (after scaling) the kernel uses.
    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }

    /// Rotates `q` and (if given) `k` in place at `positions`, then applies the qk-norm if the
    /// configuration has one.
    pub fn apply(&self, q: &Tensor, k: Option<&Tensor>, positions: &Tensor) -> Result<()> {
        let mut kv = k.map(TensorViewMut::of_tensor);
        self.apply_on(q.device(), &mut TensorViewMut::of_tensor(q), kv.as_mut(), &positions.view())
    }

    /// [`Rope::apply`] on borrowed views, queued on `queue` (a [`Device`] or an engine's
    /// `Arc<CudaStream>` of the context the table was uploaded to).
    ///
    /// q and k get the same rotation (and the same qk-norm), so when the k heads follow the q
    /// heads in a fused QKV buffer (`[tokens, q_heads + 2 kv_heads, head_dim]`, Llama's layout)
    /// one writable view of `q_heads + kv_heads` heads with `k = None` rotates both: a cudarc
    /// buffer can only lend one `&mut` at a time.
    pub fn apply_on(
        &self,
        queue: &impl Queue,
        q: &mut TensorViewMut<'_>,
        k: Option<&mut TensorViewMut<'_>>,
        positions: &TensorView<'_>,
    ) -> Result<()> {
        self.launch(OP, queue, q, k, positions, None)
    }

    /// The backward of [`Rope::apply`]: overwrites `dq` and (if given) `dk`, the gradients of the
    /// rotated (and normalized) q and k, with the gradients of the forward's inputs. `saved`, the
    /// forward's inputs, is needed when the configuration has a qk-norm and ignored otherwise.
    pub fn backward(
        &self,
        dq: &Tensor,
        dk: Option<&Tensor>,
        positions: &Tensor,
        saved: Option<Saved<&Tensor>>,
    ) -> Result<()> {
        let mut kv = dk.map(TensorViewMut::of_tensor);
        let views = saved.map(|s| (s.q.view(), s.k.map(Tensor::view)));
        let saved = views.as_ref().map(|(q, k)| Saved { q, k: k.as_ref() });
        self.backward_on(dq.device(), &mut TensorViewMut::of_tensor(dq), kv.as_mut(), &positions.view(), saved)
    }

    /// [`Rope::backward`] on borrowed views, queued on `queue` (see [`Rope::apply_on`]; a fused
    /// QKV gradient works the same way, with `saved.q` covering the same heads).
    pub fn backward_on(
        &self,
        queue: &impl Queue,
        dq: &mut TensorViewMut<'_>,
        dk: Option<&mut TensorViewMut<'_>>,
        positions: &TensorView<'_>,
        saved: Option<Saved<&TensorView<'_>>>,
    ) -> Result<()> {
        let saved = match (self.config.qk_norm_eps, saved) {
            (None, _) => None,
            (Some(_), Some(saved)) => Some(saved),
            (Some(_), None) => {
                return Err(Error::invalid(
                    BACKWARD_OP,
                    "saved",
                    "None",
                    "the qk-norm's backward needs the forward's inputs q and k",
                ));
            }
        };
        self.launch(BACKWARD_OP, queue, dq, dk, positions, Some(saved))
    }

    /// The launch behind both directions: `backward` is `None` for the forward, `Some(saved)` for
    /// the backward (`saved` given exactly when the configuration has a qk-norm).
    fn launch(
        &self,
        op: &'static str,
        queue: &impl Queue,
        q: &mut TensorViewMut<'_>,
        k: Option<&mut TensorViewMut<'_>>,
        positions: &TensorView<'_>,
        backward: Option<Option<Saved<&TensorView<'_>>>>,
    ) -> Result<()> {
        let device = queue.queue_device()?;
        let dtype = q.dtype();
        check_float(op, "q", dtype)?;
        if let Some(k) = &k {
            check_dtype(op, "k", k.dtype(), dtype)?;
        }
        let position_type = match positions.dtype() {
            DType::I32 => LlkIndexType::LLK_INDEX_I32,
            DType::I64 => LlkIndexType::LLK_INDEX_I64,
            other => {
                return Err(Error::UnsupportedDType {
                    op,
                    what: "positions",
                    dtype: other,
                    supported: "i32, i64".into(),
                });
            }
        };
        let saved = backward.flatten();
        let mut args = KernelArgs::new(op, &device);
        let qb = args.write("q", q)?;
        let kb = match k {
            Some(k) => Some(args.write("k", k)?),
            None => None,
        };
        let pb = args.read("positions", positions)?;
        let table = args.read_tensor("rope table", &self.table)?;
        let (qh, kh) = self.check_shapes(op, &qb, kb.as_ref(), &pb)?;
        let saved = match saved {
            Some(s) => Some(Self::check_saved(op, &mut args, s, dtype, &qh, kh.as_ref())?),
            None => None,
        };
        let kv_heads = kh.map_or(0, |h| h.heads);
        if qh.tokens == 0 || qh.heads.saturating_add(kv_heads) == 0 || qh.head_dim == 0 {
            return Ok(());
        }
        let mut params = self.params(op, &qh, kh.as_ref(), pb.addr, table, position_type)?;
        if backward.is_some() {
            params.direction = LlkRopeDirection::LLK_ROPE_BACKWARD;
        }
        if let Some((sq, sk)) = &saved {
            params.q_saved = sq.addr;
            params.q_saved_token_stride = to_i64(op, "saved q token stride", sq.token_stride)?;
            params.q_saved_head_stride = to_i64(op, "saved q head stride", sq.head_stride)?;
            if let Some(sk) = sk {
                params.k_saved = sk.addr;
                params.k_saved_token_stride = to_i64(op, "saved k token stride", sk.token_stride)?;
                params.k_saved_head_stride = to_i64(op, "saved k head stride", sk.head_stride)?;
            }
        }
        let heads = [Some(qh), kh, saved.map(|s| s.0), saved.and_then(|s| s.1)];
        let (dims, vectorized) = self.launch_dims(op, &device, dtype, &qh, &heads)?;
        let kernel = match (self.config.qk_norm_eps.is_some(), backward.is_some()) {
            (false, _) => RopeKernel::Rotate,
            (true, false) => RopeKernel::Norm,
            (true, true) => RopeKernel::NormBackward,
        };
        args.launch(KERNELS.find(op, "q", (self.config.layout, Access::of(vectorized), kernel, dtype))?, dims, &params)
    }

    /// Checks the saved inputs of the qk-norm's backward against the gradients (same dtype and
    /// shape, disjoint from what the kernel writes) and returns their heads.
    fn check_saved<'a>(
        op: &'static str,
        args: &mut KernelArgs<'a>,
        saved: Saved<&'a TensorView<'_>>,
        dtype: DType,
        qh: &Heads,
        kh: Option<&Heads>,
    ) -> Result<(Heads, Option<Heads>)> {
        let mut one = |what: &'static str, view: &'a TensorView<'_>, like: &Heads| {
            check_dtype(op, what, view.dtype(), dtype)?;
            let b = args.read(what, view)?;
            let h = Heads::of(op, what, &b)?;
            if (h.tokens, h.heads, h.head_dim) != (like.tokens, like.heads, like.head_dim) {
                return Err(Error::shape(
                    op,
                    what,
                    b.shape().to_vec(),
                    format!("[{}, {}, {}] like its gradient", like.tokens, like.heads, like.head_dim),
                ));
            }
            check_disjoint(op, ("q", *qh), (what, h))?;
            if let Some(kh) = kh {
                check_disjoint(op, ("k", *kh), (what, h))?;
            }
            Ok(h)
        };
        let sq = one("saved q", saved.q, qh)?;
        let sk = match (saved.k, kh) {
            (Some(k), Some(kh)) => Some(one("saved k", k, kh)?),
            (None, None) => None,
            (Some(_), None) => return Err(Error::invalid(op, "saved k", "Some", "given without a k gradient")),
            (None, Some(_)) => return Err(Error::invalid(op, "saved k", "None", "needed with a k gradient")),
        };
        Ok((sq, sk))
    }

    /// Checks q, k and the positions against the configuration and each other.
    fn check_shapes(&self, op: &'static str, qb: &Arg, kb: Option<&Arg>, pb: &Arg) -> Result<(Heads, Option<Heads>)> {
        let cfg = &self.config;
        let qh = Heads::of(op, "q", qb)?;
        let kh = kb.map(|k| Heads::of(op, "k", k)).transpose()?;
        if qh.head_dim != cfg.head_dim {
            return Err(Error::shape(op, "q", qb.shape().to_vec(), format!("head_dim {}", cfg.head_dim)));
        }
        if let (Some(kb), Some(kh)) = (kb, &kh) {
            if kh.head_dim != qh.head_dim {
                return Err(Error::shape(op, "k", kb.shape().to_vec(), format!("head_dim {} like q", qh.head_dim)));
            }
            if kh.tokens != qh.tokens {
                return Err(Error::shape(op, "k", kb.shape().to_vec(), format!("{} tokens like q", qh.tokens)));
            }
            check_disjoint(op, ("q", qh), ("k", *kh))?;
        }
        if pb.dims.numel() != qh.tokens || !pb.dims.is_contiguous() {
            return Err(Error::shape(
                op,
                "positions",
                pb.shape().to_vec(),
                format!("{} contiguous values (one per token)", qh.tokens),
            ));
        }
        let pr = Rows { addr: pb.addr, elem: pb.dtype.size(), rows: 1, cols: qh.tokens, row_stride: qh.tokens };
        check_disjoint(op, ("q", qh), ("positions", pr))?;
        if let Some(kh) = kh {
            check_disjoint(op, ("k", kh), ("positions", pr))?;
        }
        Ok((qh, kh))
    }

    /// Fills the params struct (`k`: k's heads, when there is a k).
    fn params(
        &self,
        op: &'static str,
        qh: &Heads,
        k: Option<&Heads>,
        positions: u64,
        table: u64,
        position_type: LlkIndexType,
    ) -> Result<RopeParams> {
        let cfg = &self.config;
        let kv_heads = k.map_or(0, |h| h.heads);
        let kk = k.copied().unwrap_or(Heads {
            addr: 0,
            elem: qh.elem,
            tokens: 0,
            heads: 0,
            head_dim: 0,
            token_stride: 0,
            head_stride: 0,
        });
        Ok(RopeParams {
            q: qh.addr,
            k: k.map_or(0, |k| k.addr),
            positions,
            inv_freq: table,
            tokens: to_i64(op, "tokens", qh.tokens)?,
            q_heads: to_i64(op, "q heads", qh.heads)?,
            kv_heads: to_i64(op, "kv heads", kv_heads)?,
            head_dim: to_i64(op, "head_dim", cfg.head_dim)?,
            rotary_dim: to_i64(op, "rotary_dim", cfg.rotary_dim)?,
            q_token_stride: to_i64(op, "q token stride", qh.token_stride)?,
            q_head_stride: to_i64(op, "q head stride", qh.head_stride)?,
            k_token_stride: to_i64(op, "k token stride", kk.token_stride)?,
            k_head_stride: to_i64(op, "k head stride", kk.head_stride)?,
            layout: match cfg.layout {
                RopeLayout::Interleaved => LlkRopeLayout::LLK_ROPE_INTERLEAVED,
                RopeLayout::HalfSplit => LlkRopeLayout::LLK_ROPE_HALF_SPLIT,
            },
            position_type,
            norm: if cfg.qk_norm_eps.is_some() { LlkRopeNorm::LLK_ROPE_L2_NORM } else { LlkRopeNorm::LLK_ROPE_NO_NORM },
            norm_eps: cfg.qk_norm_eps.unwrap_or(0.0),
            q_saved: 0,
            k_saved: 0,
            q_saved_token_stride: 0,
            q_saved_head_stride: 0,
            k_saved_token_stride: 0,
            k_saved_head_stride: 0,
            direction: LlkRopeDirection::LLK_ROPE_FORWARD,
        })
    }

    /// Grid and block of the kernel, and whether it takes the 16-byte path: `heads` are q's, then
    /// every other tensor the kernel reads or writes by head (k, the saved q and k).
    fn launch_dims(
        &self,
        op: &'static str,
        device: &Device,
        dtype: DType,
        qh: &Heads,
        heads: &[Option<Heads>; 4],
    ) -> Result<(LaunchDims, bool)> {
        let cfg = &self.config;
        let kv_heads = heads[1].map_or(0, |h| h.heads);
        // The 16-byte path: whole vectors per chunk, 16-byte aligned heads in q and k.
        let v = dtype.vec16();
        let chunk_elems = if cfg.layout == RopeLayout::Interleaved { cfg.rotary_dim } else { cfg.rotary_dim / 2 };
        let aligned = |addr: u64, h: &Heads| addr % 16 == 0 && h.token_stride % v == 0 && h.head_stride % v == 0;
        let vectorized = chunk_elems % v == 0 && heads.iter().flatten().all(|h| aligned(h.addr, h));
        let vec = if vectorized {
            v
        } else if cfg.layout == RopeLayout::Interleaved {
            2
        } else {
            1
        };
        let (pairs, max_chunks) = chunking(cfg.layout, vec);
        let nchunks = cfg.rotary_dim / 2 / pairs;
        let g = nchunks.next_power_of_two().min(32);
        if nchunks > g * max_chunks {
            return Err(Error::invalid(
                op,
                "rotary_dim",
                cfg.rotary_dim,
                format!("unsupported (at most {MAX_ROTARY_DIM})"),
            ));
        }
        // Heads per block: as few passes over the heads as the block size allows, spread evenly
        // (40 heads in 8-thread groups: 2 passes of 20, not 32 + 8), in whole warps.
        let nheads = qh.heads + kv_heads;
        let passes = nheads.div_ceil(MAX_THREADS / g);
        let heads_per_block = nheads.div_ceil(passes).div_ceil(32 / g) * (32 / g);
        // Few tokens (decode): one block per (token, pass) instead of one per token, so the
        // passes run side by side on otherwise idle SMs.
        let head_blocks = if qh.tokens < 2 * device.sm_count() { nheads.div_ceil(heads_per_block) } else { 1 };
        let head_blocks = u32::try_from(head_blocks)
            .ok()
            .filter(|&b| b <= 65535)
            .ok_or_else(|| Error::invalid(op, "heads", nheads, "too many head blocks for grid.y (65535)"))?;
        let dims = LaunchDims {
            grid: (grid_x(op, qh.tokens)?, head_blocks, 1),
            block: (g as u32, heads_per_block as u32, 1),
            smem_at_launch: 0,
        };
        Ok((dims, vectorized))
    }
}
