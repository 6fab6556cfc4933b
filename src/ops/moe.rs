//! Mixture-of-experts feed-forward on the device (kernels/moe.cu): top-k routing, the expert
//! permutation, the grouped expert GEMM on tensor cores, the weighted combine, and [`MoeFfn`], a
//! whole layer with its shared expert.
//!
//! ```text
//! logits [T, E] --moe_route--> ids [T, k] i32, weights [T, k] f32
//! ids --MoeAlign::align--> counts [E], offsets [E + 1], rows [T k], block -> expert map (device)
//! x [T, H] --moe_gather--> xp [R, H]        (R: the padded row capacity; Llama 4 scales by w)
//! xp --moe_grouped_gemm (SwiGLU)--> h [R, I] --moe_grouped_gemm--> y [R, H]
//! y --moe_combine--> out [T, H] = sum_j (w_tj) y[row(t, j)] (+ shared expert) (+ residual)
//! ```
//!
//! Nothing waits on the host: expert token counts stay on the device, every grid is sized by an
//! upper bound the host knows (`tokens * k` and the number of experts), and blocks past the real
//! work exit after one read. A planned [`MoeFfn`] forward allocates nothing and copies nothing, so
//! it can be captured in a CUDA graph.
//!
//! ```
//! use llama_kernels::ops::moe::{GateUpTensors, MoeFfn, MoeFfnConfig, MoeFfnWeights, WeightLayout};
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (hidden, inter, experts, tokens) = (64, 64, 4, 3);
//! let t = |shape: &[usize]| Tensor::zeros(&device, DType::BF16, shape);
//! // Hugging Face Llama 4 layout: gate_up_proj [E, hidden, 2I], down_proj [E, I, hidden].
//! let weights = MoeFfnWeights {
//!     router: t(&[experts, hidden])?,
//!     router_bias: None,
//!     layout: WeightLayout::InOut,
//!     gate_up: GateUpTensors::Packed(t(&[experts, hidden, 2 * inter])?),
//!     down: t(&[experts, inter, hidden])?,
//!     shared: None,
//! };
//! let config = MoeFfnConfig::llama4(hidden, inter, experts, 1);
//! let mut ffn = MoeFfn::new(&device, config, weights, 16)?;
//! let (x, out) = (t(&[tokens, hidden])?, t(&[tokens, hidden])?);
//! ffn.forward(&x, None, &out)?;
//! # Ok(())
//! # }
//! ```
//!
//! Routing modes ([`MoeRouting`]), exactly (src/reference/moe.rs is the spec): experts rank by a
//! key, larger first, ties to the lower expert index, NaN below every number. A NaN expert is
//! chosen only when fewer than k others exist; a row of all-NaN logits gets experts 0..k-1 with
//! NaN weights.
//!
//! * [`MoeRouting::Llama4`]: key = logit, weight = `sigmoid(logit)` (Hugging Face
//!   `Llama4TextMoe`, vLLM `Llama4MoE.custom_routing_function`). Hugging Face rounds the weight
//!   to the model dtype before scaling the input; here it stays f32 until the product is rounded.
//! * [`MoeRouting::Softmax`]: softmax over all experts in f32 (NaN logits count as probability 0),
//!   top-k, optionally renormalized to sum 1 (Mixtral; Qwen2/3-MoE with `norm_topk_prob`).
//!   Selection uses the logits, whose order is the order of the exact probabilities.
//! * [`MoeRouting::Grouped`] (DeepSeek-V3): `s = sigmoid(logit)`, key `s + bias`, groups scored
//!   by the sum of their two best keys, the best `topk_group` of `n_group` kept, top-k inside them,
//!   weight = `s` (renormalized by `sum + 1e-20` if asked) times `routed_scaling_factor`. Experts
//!   of dropped groups are never chosen (Hugging Face fills them with 0.0, which can beat a
//!   negative key; vLLM and this crate use -inf).
//!
//! Limits: experts 1..=512, k <= 8 (16 for grouped routing), `n_group <= 32`, group size >= 2.
//!
//! Weight layouts ([`WeightLayout`]): [`WeightLayout::InOut`] is `[experts, in, out]` with
//! `y = x @ W[e]` (Hugging Face Llama 4 `experts.gate_up_proj [E, hidden, 2I]` and
//! `experts.down_proj [E, I, hidden]`); [`WeightLayout::OutIn`] is `[experts, out, in]`, one
//! `nn.Linear` per expert stacked (Mixtral `w1`/`w3` `[E, I, hidden]`, `w2` `[E, hidden, I]`).
//! Both are read in place, by strides: no repack. The SwiGLU epilogue takes the gate and up
//! columns packed in one tensor (gate first, as Llama 4's `gate_up_proj` and a fused gate-up
//! projection) or as two tensors with the same strides.

use crate::backend::{Device, KernelRef, LaunchDims, Queue};
use crate::launch::KernelArgs;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::moe::{ROUTE, ALIGN_HISTOGRAM, ALIGN_SCAN, ALIGN_SCATTER, GATHER, COMBINE, GEMM};
use crate::launch::{Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::ffi::params::{
    LLK_MOE_ALIGN_MAX_CHUNKS, LLK_MOE_ALIGN_MIN_CHUNK, LLK_MOE_ALIGN_THREADS, LLK_MOE_GEMM_BLOCK_M,
    LLK_MOE_GEMM_BLOCK_M_DECODE, LLK_MOE_GEMM_BLOCK_N, LLK_MOE_GEMM_BLOCK_N_DECODE, LLK_MOE_GEMM_SMEM_BYTES,
    LLK_MOE_GEMM_SMEM_BYTES_DECODE, LLK_MOE_GEMM_THREADS, LLK_MOE_MAX_EXPERTS, LLK_MOE_MAX_GROUPS, LLK_MOE_MAX_TOP_K,
    LLK_MOE_MAX_TOP_K_GROUPED, LLK_MOE_ROUTE_SMALL_EXPERTS, LLK_MOE_ROUTE_WARPS, LLK_MOE_ROW_THREADS,
    LLK_MOE_SIMT_BLOCK_N, LLK_MOE_SIMT_THREADS, LlkDeviceError, LlkMoeEpilogue, LlkMoeRenormalize, LlkMoeRouting,
    LlkMoeScale, LlkMoeSchedule, LlkMoeWeightLayout, MoeAlignParams, MoeCombineParams, MoeGatherParams, MoeGemmParams,
    MoeRouteParams,
};
use crate::tensor::{Tensor, TensorView, TensorViewMut};
pub use crate::spec::moe::{MoeFfnConfig, MoeRouting, WeightLayout};

const OP_ROUTE: &str = "moe_route";
const OP_ALIGN: &str = "moe_align";
const OP_GATHER: &str = "moe_gather";
const OP_GEMM: &str = "moe_grouped_gemm";
const OP_COMBINE: &str = "moe_combine";
const OP_FFN: &str = "moe_ffn";

/// Most experts a layer may have.
pub const MAX_EXPERTS: usize = LLK_MOE_MAX_EXPERTS as usize;
/// Most experts per token for Llama 4 and softmax routing.
pub const MAX_TOP_K: usize = LLK_MOE_MAX_TOP_K as usize;
/// Most experts per token for grouped routing.
pub const MAX_TOP_K_GROUPED: usize = LLK_MOE_MAX_TOP_K_GROUPED as usize;
/// Most expert groups (grouped routing).
pub const MAX_GROUPS: usize = LLK_MOE_MAX_GROUPS as usize;
/// Rows per grouped-GEMM block: prefill and decode.
pub const BLOCK_M: usize = LLK_MOE_GEMM_BLOCK_M as usize;
pub const BLOCK_M_DECODE: usize = LLK_MOE_GEMM_BLOCK_M_DECODE as usize;

/// The params-struct enum of a weight layout.
fn raw_layout(layout: WeightLayout) -> LlkMoeWeightLayout {
    match layout {
        WeightLayout::InOut => LlkMoeWeightLayout::LLK_MOE_WEIGHT_KN,
        WeightLayout::OutIn => LlkMoeWeightLayout::LLK_MOE_WEIGHT_NK,
    }
}

// ----------------------------------------------------------------------------------- kernels

fn contiguous_rows(op: &'static str, what: &'static str, b: &crate::launch::Arg) -> Result<Rows> {
    let r = Rows::of(op, what, b, 1)?;
    if r.rows > 1 && r.row_stride != r.cols {
        return Err(Error::BadLayout {
            op,
            what,
            shape: b.shape().to_vec(),
            strides: b.strides().to_vec(),
            why: "must be contiguous",
        });
    }
    Ok(r)
}

fn to_i32(op: &'static str, what: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(op, what, v, "exceeds 2^31 - 1 (expert rows are i32)"))
}

// ----------------------------------------------------------------------------------- route

/// Routes every token: writes `ids` (`[tokens, k]` i32, best first) and `weights` (`[tokens, k]`
/// f32) from `logits` (`[tokens, experts]` f32/f16/bf16, rows may be strided). `bias` (`[experts]`
/// f32, contiguous) is the grouped mode's selection bias (DeepSeek-V3 `e_score_correction_bias`);
/// other modes take none. k is `ids`' last dimension.
pub fn moe_route_on(
    queue: &impl Queue,
    logits: &TensorView<'_>,
    bias: Option<&TensorView<'_>>,
    routing: MoeRouting,
    ids: &mut TensorViewMut<'_>,
    weights: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = OP_ROUTE;
    let device = queue.queue_device()?;
    let dtype = logits.dtype();
    check_float(OP, "logits", dtype)?;
    check_dtype(OP, "ids", ids.dtype(), DType::I32)?;
    check_dtype(OP, "weights", weights.dtype(), DType::F32)?;
    if let Some(b) = bias {
        check_dtype(OP, "bias", b.dtype(), DType::F32)?;
    }
    let mut args = KernelArgs::new(OP, &device);
    let ib = args.write("ids", ids)?;
    let wb = args.write("weights", weights)?;
    let lb = args.read("logits", logits)?;
    let bb = bias.map(|b| args.read("bias", b)).transpose()?;
    let lr = Rows::of(OP, "logits", &lb, 1)?;
    let ir = contiguous_rows(OP, "ids", &ib)?;
    let wr = contiguous_rows(OP, "weights", &wb)?;
    let (tokens, experts, k) = (lr.rows, lr.cols, ir.cols);
    if ir.rows != tokens {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "ids",
            got: ib.shape().to_vec(),
            expected: format!("[{tokens}, k] (one row per token of logits)"),
        });
    }
    if wb.shape() != ib.shape() {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "weights",
            got: wb.shape().to_vec(),
            expected: format!("{:?} like ids", ib.shape()),
        });
    }
    check_routing(OP, experts, k, routing)?;
    let bias_addr = match (&bb, routing) {
        (Some(b), MoeRouting::Grouped { .. }) => {
            if b.shape() != [experts] {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what: "bias",
                    got: b.shape().to_vec(),
                    expected: format!("[{experts}] (one per expert)"),
                });
            }
            contiguous_rows(OP, "bias", b)?;
            b.addr
        }
        (Some(_), _) => {
            return Err(Error::invalid(OP, "bias", "given", "only grouped routing takes a selection bias"));
        }
        (None, _) => 0,
    };
    check_disjoint(OP, ("ids", ir), ("weights", wr))?;
    check_disjoint(OP, ("ids", ir), ("logits", lr))?;
    check_disjoint(OP, ("weights", wr), ("logits", lr))?;
    if tokens == 0 {
        return Ok(());
    }
    let (mode, renormalize, n_group, topk_group, factor) = match routing {
        MoeRouting::Llama4 => (0u8, false, 0, 0, 1.0),
        MoeRouting::Softmax { renormalize } => (1, renormalize, 0, 0, 1.0),
        MoeRouting::Grouped { n_group, topk_group, renormalize, routed_scaling_factor } => {
            (2, renormalize, n_group, topk_group, routed_scaling_factor)
        }
    };
    let params = MoeRouteParams {
        logits: lb.addr,
        bias: bias_addr,
        ids: ib.addr,
        weights: wb.addr,
        tokens: to_i64(OP, "tokens", tokens)?,
        experts: to_i64(OP, "experts", experts)?,
        top_k: to_i64(OP, "top_k", k)?,
        logits_row_stride: to_i64(OP, "logits row stride", lr.row_stride)?,
        n_group: to_i64(OP, "n_group", n_group)?,
        topk_group: to_i64(OP, "topk_group", topk_group)?,
        mode: [
            LlkMoeRouting::LLK_MOE_ROUTE_LLAMA4,
            LlkMoeRouting::LLK_MOE_ROUTE_SOFTMAX,
            LlkMoeRouting::LLK_MOE_ROUTE_GROUPED,
        ][mode as usize],
        renormalize: if renormalize {
            LlkMoeRenormalize::LLK_MOE_RENORMALIZE
        } else {
            LlkMoeRenormalize::LLK_MOE_KEEP_WEIGHTS
        },
        routed_scaling_factor: factor,
    };
    let warps = LLK_MOE_ROUTE_WARPS as usize;
    let small = experts <= LLK_MOE_ROUTE_SMALL_EXPERTS as usize;
    let dims =
        LaunchDims { grid: (grid_x(OP, tokens.div_ceil(warps))?, 1, 1), block: (32 * warps as u32, 1, 1), dyn_smem: 0 };
    args.launch(ROUTE.find(OP, "logits", (mode, small, dtype), dtype)?, dims, &params)
}

/// Checks experts, k and the group configuration of a routing mode.
fn check_routing(op: &'static str, experts: usize, k: usize, routing: MoeRouting) -> Result<()> {
    if experts == 0 || experts > MAX_EXPERTS {
        return Err(Error::invalid(op, "experts", experts, format!("must be 1..={MAX_EXPERTS}")));
    }
    let max_k = if matches!(routing, MoeRouting::Grouped { .. }) { MAX_TOP_K_GROUPED } else { MAX_TOP_K };
    if k == 0 || k > max_k {
        return Err(Error::invalid(op, "top_k", k, format!("must be 1..={max_k} for {routing:?}")));
    }
    if k > experts {
        return Err(Error::invalid(op, "top_k", k, format!("exceeds the {experts} experts")));
    }
    if let MoeRouting::Grouped { n_group, topk_group, routed_scaling_factor, .. } = routing {
        if n_group == 0 || n_group > MAX_GROUPS || experts % n_group != 0 {
            return Err(Error::invalid(
                op,
                "n_group",
                n_group,
                format!("must divide the {experts} experts and be 1..={MAX_GROUPS}"),
            ));
        }
        if experts / n_group < 2 {
            return Err(Error::invalid(
                op,
                "n_group",
                n_group,
                "groups need at least 2 experts (scored by their top 2)",
            ));
        }
        if topk_group == 0 || topk_group > n_group {
            return Err(Error::invalid(op, "topk_group", topk_group, format!("must be 1..={n_group} (n_group)")));
        }
        if k > topk_group * (experts / n_group) {
            return Err(Error::invalid(
                op,
                "top_k",
                k,
                format!("exceeds the {} experts of the {topk_group} kept groups", topk_group * (experts / n_group)),
            ));
        }
        if !routed_scaling_factor.is_finite() {
            return Err(Error::invalid(op, "routed_scaling_factor", routed_scaling_factor, "must be finite"));
        }
    }
    Ok(())
}

/// [`moe_route_on`] on tensors.
pub fn moe_route(
    logits: &Tensor,
    bias: Option<&Tensor>,
    routing: MoeRouting,
    ids: &Tensor,
    weights: &Tensor,
) -> Result<()> {
    let bv = bias.map(Tensor::view);
    moe_route_on(
        logits.device(),
        &logits.view(),
        bv.as_ref(),
        routing,
        &mut TensorViewMut::of_tensor(ids),
        &mut TensorViewMut::of_tensor(weights),
    )
}

// ----------------------------------------------------------------------------------- align

/// Upper bound on the grouped GEMM's row blocks for `slots` rows over `experts` experts:
/// `sum_e ceil(c_e / block_m) <= floor((slots + min(experts, slots) (block_m - 1)) / block_m)`.
pub fn max_blocks(slots: usize, experts: usize, block_m: usize) -> usize {
    (slots + experts.min(slots) * (block_m - 1)) / block_m
}

/// Rows an expert-contiguous buffer (gather output, GEMM input and output) needs for `slots`
/// slots: every block the GEMM may run, whole.
pub fn padded_rows(slots: usize, experts: usize, block_m: usize) -> usize {
    max_blocks(slots, experts, block_m) * block_m
}

/// The GEMM block rows for `slots` slots over `experts` experts: 16 (the decode kernel) when the
/// experts average at most 16 rows, else 64.
pub fn preferred_block_m(slots: usize, experts: usize) -> usize {
    if slots <= BLOCK_M_DECODE * experts.min(slots).max(1) { BLOCK_M_DECODE } else { BLOCK_M }
}

/// Slots per align chunk (at most LLK_MOE_ALIGN_MAX_CHUNKS chunks) and the chunk count.
fn chunking(slots: usize) -> (usize, usize) {
    let min = LLK_MOE_ALIGN_MIN_CHUNK as usize;
    let chunk = min * slots.div_ceil(min * LLK_MOE_ALIGN_MAX_CHUNKS as usize).max(1);
    (chunk, slots.div_ceil(chunk))
}

/// The expert permutation on the device: per-expert counts, padded segment offsets, the row of
/// every (token, slot) in the expert-contiguous buffer (ordered by token inside each expert),
/// and the GEMM's block -> expert map. Plan it once for the largest `tokens * k`; an alignment
/// within capacity allocates nothing (a larger one grows the buffers: the only allocation).
///
/// Expert ids outside `[0, experts)` (possible only with caller-made ids) are dropped: their slot
/// gets row -1, so gather and combine skip it, and [`MoeAlign::check_errors`] reports it.
#[derive(Debug)]
pub struct MoeAlign {
    device: Device,
    experts: usize,
    capacity: usize,
    arrays: Option<AlignArrays>,
    state: Option<AlignState>,
}

#[derive(Debug)]
struct AlignArrays {
    flag: Tensor,
    counts: Tensor,
    offsets: Tensor,
    rows: Tensor,
    block_expert: Tensor,
    chunk_counts: Tensor,
}

/// What the last alignment was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AlignState {
    tokens: usize,
    top_k: usize,
    block_m: usize,
}

impl MoeAlign {
    /// A permutation for `experts` experts (1..=512), planned for up to `max_slots` slots
    /// (`tokens * k`).
    pub fn new(device: &Device, experts: usize, max_slots: usize) -> Result<MoeAlign> {
        if experts == 0 || experts > MAX_EXPERTS {
            return Err(Error::invalid(OP_ALIGN, "experts", experts, format!("must be 1..={MAX_EXPERTS}")));
        }
        let mut a = MoeAlign { device: device.clone(), experts, capacity: 0, arrays: None, state: None };
        a.reserve(max_slots)?;
        Ok(a)
    }

    fn reserve(&mut self, slots: usize) -> Result<()> {
        if self.arrays.is_some() && slots <= self.capacity {
            return Ok(());
        }
        let slots = slots.max(1);
        to_i32(OP_ALIGN, "slots", padded_rows(slots, self.experts, BLOCK_M))?;
        let e = self.experts;
        let blocks = max_blocks(slots, e, BLOCK_M_DECODE).max(max_blocks(slots, e, BLOCK_M)).max(1);
        let chunk = LLK_MOE_ALIGN_MAX_CHUNKS as usize * e;
        let sizes = [1, e, e + 1, slots, blocks, chunk];
        let total: usize = sizes.iter().sum();
        let buf = Tensor::zeros(&self.device, DType::I32, &[total])?;
        let mut at = 0;
        let mut part = |n: usize| -> Result<Tensor> {
            let t = buf.narrow(0, at, n)?;
            at += n;
            Ok(t)
        };
        self.arrays = Some(AlignArrays {
            flag: part(sizes[0])?,
            counts: part(sizes[1])?,
            offsets: part(sizes[2])?,
            rows: part(sizes[3])?,
            block_expert: part(sizes[4])?,
            chunk_counts: part(sizes[5])?,
        });
        self.capacity = slots;
        Ok(())
    }

    fn arrays(&self) -> Result<&AlignArrays> {
        self.arrays.as_ref().ok_or(Error::InvalidView { what: OP_ALIGN, why: "not planned".into() })
    }
    fn state(&self, op: &'static str) -> Result<AlignState> {
        self.state.ok_or(Error::InvalidView { what: op, why: "the permutation has not been aligned yet".into() })
    }

    pub fn experts(&self) -> usize {
        self.experts
    }
    /// Slots planned for.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// `(tokens, top_k, block_m)` of the last alignment.
    pub fn aligned_for(&self) -> Option<(usize, usize, usize)> {
        self.state.map(|s| (s.tokens, s.top_k, s.block_m))
    }
    /// Rows the expert-contiguous buffers need for the last alignment.
    pub fn padded_rows(&self) -> Option<usize> {
        self.state.map(|s| padded_rows(s.tokens * s.top_k, self.experts, s.block_m))
    }
    /// `[experts]` i32: rows routed to each expert (device memory, valid after an alignment).
    pub fn counts(&self) -> Result<Tensor> {
        Ok(self.arrays()?.counts.clone())
    }
    /// `[experts + 1]` i32: each expert's padded segment start; the last is the padded total.
    pub fn offsets(&self) -> Result<Tensor> {
        Ok(self.arrays()?.offsets.clone())
    }
    /// `[tokens * k]` i32 of the last alignment: the row of every slot (-1: dropped).
    pub fn rows(&self) -> Result<Tensor> {
        let s = self.state(OP_ALIGN)?;
        self.arrays()?.rows.narrow(0, 0, s.tokens * s.top_k)
    }
    /// The block -> expert map of the last alignment (entries below the padded total / block_m
    /// are set; the rest are stale).
    pub fn block_expert(&self) -> Result<Tensor> {
        let s = self.state(OP_ALIGN)?;
        self.arrays()?.block_expert.narrow(0, 0, max_blocks(s.tokens * s.top_k, self.experts, s.block_m))
    }

    /// Reads and clears the device-side error flag (waits for the device): `Err` when an earlier
    /// alignment met an expert id outside `[0, experts)` (those slots were dropped).
    pub fn check_errors(&self) -> Result<()> {
        let flag = &self.arrays()?.flag;
        let bits = flag.to_vec::<i32>()?[0];
        if bits != 0 {
            flag.copy_from_slice(&[0i32])?;
            let what = if bits & LlkDeviceError::LLK_DEVICE_BAD_EXPERT_ID as i32 != 0 {
                "an expert id outside [0, experts) (its slot was dropped)"
            } else {
                "unknown error bits"
            };
            return Err(Error::DeviceReported { op: OP_ALIGN, what: format!("{what} [flag {bits:#x}]") });
        }
        Ok(())
    }

    /// Aligns `ids` (`[tokens, k]` i32, contiguous) for GEMM blocks of `block_m` rows (16 or
    /// 64, see [`preferred_block_m`]).
    pub fn align(&mut self, ids: &Tensor, block_m: usize) -> Result<()> {
        self.align_on(ids.device(), &ids.view(), block_m)
    }

    /// [`MoeAlign::align`] on a borrowed view, queued on `queue`.
    pub fn align_on(&mut self, queue: &impl Queue, ids: &TensorView<'_>, block_m: usize) -> Result<()> {
        const OP: &str = OP_ALIGN;
        let device = queue.queue_device()?;
        if !device.same_context(&self.device) {
            return Err(Error::DeviceMismatch { op: OP, what: "permutation" });
        }
        check_dtype(OP, "ids", ids.dtype(), DType::I32)?;
        if block_m != BLOCK_M && block_m != BLOCK_M_DECODE {
            return Err(Error::invalid(OP, "block_m", block_m, format!("must be {BLOCK_M_DECODE} or {BLOCK_M}")));
        }
        if ids.shape().len() != 2 {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "ids",
                got: ids.shape().to_vec(),
                expected: "[tokens, k]".into(),
            });
        }
        let (tokens, top_k) = (ids.shape()[0], ids.shape()[1]);
        let slots =
            tokens.checked_mul(top_k).ok_or_else(|| Error::TooLarge { what: "ids", shape: ids.shape().to_vec() })?;
        self.reserve(slots)?;
        let arrays = self.arrays.as_ref().ok_or(Error::InvalidView { what: OP, why: "not planned".into() })?;
        let (chunk_slots, chunks) = chunking(slots);
        let experts = self.experts;
        // Three launches over the same memory: each registers all of it.
        let launch = |kernel: KernelRef, dims: LaunchDims| -> Result<()> {
            let mut args = KernelArgs::new(OP, &device);
            let ib = args.read("ids", ids)?;
            contiguous_rows(OP, "ids", &ib)?;
            let params = MoeAlignParams {
                ids: ib.addr,
                chunk_counts: args.write_tensor("chunk_counts", &arrays.chunk_counts)?,
                counts: args.write_tensor("counts", &arrays.counts)?,
                offsets: args.write_tensor("offsets", &arrays.offsets)?,
                rows: args.write_tensor("rows", &arrays.rows)?,
                block_expert: args.write_tensor("block_expert", &arrays.block_expert)?,
                error_flag: args.write_tensor("error_flag", &arrays.flag)?,
                slots: to_i64(OP, "slots", slots)?,
                experts: to_i64(OP, "experts", experts)?,
                chunks: to_i64(OP, "chunks", chunks)?,
                chunk_slots: to_i64(OP, "chunk slots", chunk_slots)?,
                block_m: to_i64(OP, "block_m", block_m)?,
            };
            args.launch(kernel, dims, &params)
        };
        let chunk_dims =
            LaunchDims { grid: (grid_x(OP, chunks)?, 1, 1), block: (LLK_MOE_ALIGN_THREADS, 1, 1), dyn_smem: 0 };
        if chunks > 0 {
            launch(ALIGN_HISTOGRAM, chunk_dims)?;
        }
        launch(ALIGN_SCAN, LaunchDims { grid: (1, 1, 1), block: (LLK_MOE_MAX_EXPERTS, 1, 1), dyn_smem: 0 })?;
        if chunks > 0 {
            launch(ALIGN_SCATTER, chunk_dims)?;
        }
        self.state = Some(AlignState { tokens, top_k, block_m });
        Ok(())
    }
}

// ----------------------------------------------------------------------------------- gather

/// Copies every routed (token, slot) row of `x` (`[tokens, hidden]`) to its row of `out` (the
/// expert-contiguous buffer, `[rows >= align.padded_rows(), hidden]`), optionally times the
/// slot's routing weight (`weights` `[tokens, k]` f32: Llama 4 scales the expert input).
/// Padding rows are not written (the GEMM never reads them). 16-byte accesses when `hidden`,
/// the addresses and the row strides allow.
pub fn moe_gather_on(
    queue: &impl Queue,
    x: &TensorView<'_>,
    align: &MoeAlign,
    weights: Option<&TensorView<'_>>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = OP_GATHER;
    let device = queue.queue_device()?;
    let dtype = x.dtype();
    check_float(OP, "x", dtype)?;
    check_dtype(OP, "out", out.dtype(), dtype)?;
    if let Some(w) = weights {
        check_dtype(OP, "weights", w.dtype(), DType::F32)?;
    }
    let state = align.state(OP)?;
    let arrays = align.arrays()?;
    let mut args = KernelArgs::new(OP, &device);
    let ob = args.write("out", out)?;
    let xb = args.read("x", x)?;
    let wb = weights.map(|w| args.read("weights", w)).transpose()?;
    let (xr, or) = (Rows::of(OP, "x", &xb, 1)?, Rows::of(OP, "out", &ob, 1)?);
    check_align_tokens(OP, "x", &xb, xr.rows, state)?;
    let need = padded_rows(state.tokens * state.top_k, align.experts, state.block_m);
    if or.cols != xr.cols || or.rows < need {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "out",
            got: ob.shape().to_vec(),
            expected: format!("at least [{need}, {}] (the padded rows of the permutation)", xr.cols),
        });
    }
    if let Some(w) = &wb {
        check_weights_shape(OP, w, state)?;
        check_disjoint(OP, ("out", or), ("weights", contiguous_rows(OP, "weights", w)?))?;
    }
    check_disjoint(OP, ("out", or), ("x", xr))?;
    let slots = state.tokens * state.top_k;
    if slots == 0 || xr.cols == 0 {
        return Ok(());
    }
    let v = dtype.vec16();
    let vec =
        xr.cols % v == 0 && xb.addr % 16 == 0 && ob.addr % 16 == 0 && xr.row_stride % v == 0 && or.row_stride % v == 0;
    let params = MoeGatherParams {
        x: xb.addr,
        rows: args.read_tensor("rows", &arrays.rows)?,
        weights: wb.map_or(0, |w| w.addr),
        out: ob.addr,
        tokens: to_i64(OP, "tokens", state.tokens)?,
        top_k: to_i64(OP, "top_k", state.top_k)?,
        hidden: to_i64(OP, "hidden", xr.cols)?,
        x_row_stride: to_i64(OP, "x row stride", xr.row_stride)?,
        out_row_stride: to_i64(OP, "out row stride", or.row_stride)?,
        out_rows: to_i64(OP, "out rows", or.rows)?,
        scale: if wb.is_some() { LlkMoeScale::LLK_MOE_SCALED } else { LlkMoeScale::LLK_MOE_UNSCALED },
    };
    let dims =
        LaunchDims { grid: (grid_x(OP, slots)?, 1, 1), block: (row_threads(xr.cols, vec, v), 1, 1), dyn_smem: 0 };
    args.launch(GATHER.find(OP, "x", (vec, dtype), dtype)?, dims, &params)
}

/// Threads per gather/combine block: one per vector, up to LLK_MOE_ROW_THREADS, whole warps.
fn row_threads(cols: usize, vec: bool, v: usize) -> u32 {
    let n = if vec { cols / v } else { cols };
    (n.div_ceil(32) * 32).clamp(32, LLK_MOE_ROW_THREADS as usize) as u32
}

fn check_align_tokens(
    op: &'static str,
    what: &'static str,
    b: &crate::launch::Arg,
    rows: usize,
    state: AlignState,
) -> Result<()> {
    if rows != state.tokens {
        return Err(Error::ShapeMismatch {
            op,
            what,
            got: b.shape().to_vec(),
            expected: format!("{} rows (the tokens of the last alignment)", state.tokens),
        });
    }
    Ok(())
}

fn check_weights_shape(op: &'static str, w: &crate::launch::Arg, state: AlignState) -> Result<()> {
    if w.shape() != [state.tokens, state.top_k] {
        return Err(Error::ShapeMismatch {
            op,
            what: "weights",
            got: w.shape().to_vec(),
            expected: format!("[{}, {}] like the aligned ids", state.tokens, state.top_k),
        });
    }
    contiguous_rows(op, "weights", w)?;
    Ok(())
}

/// [`moe_gather_on`] on tensors.
pub fn moe_gather(x: &Tensor, align: &MoeAlign, weights: Option<&Tensor>, out: &Tensor) -> Result<()> {
    let wv = weights.map(Tensor::view);
    moe_gather_on(x.device(), &x.view(), align, wv.as_ref(), &mut TensorViewMut::of_tensor(out))
}

// ----------------------------------------------------------------------------------- grouped GEMM

/// The weights of one grouped GEMM, and so its epilogue.
#[derive(Clone, Copy, Debug)]
pub enum ExpertWeights<'r, 'a> {
    /// `y = x W[e]`: `[experts, k, n]` (InOut) or `[experts, n, k]` (OutIn).
    Plain(&'r TensorView<'a>),
    /// SwiGLU over one tensor of `2n` output columns, gate first (Llama 4 `gate_up_proj`):
    /// `y = silu(x W[e][.., :n]) * (x W[e][.., n:])`, `[rows, n]`.
    SwiGluPacked(&'r TensorView<'a>),
    /// SwiGLU over separate gate and up tensors of `n` output columns each (same strides).
    SwiGluSeparate { gate: &'r TensorView<'a>, up: &'r TensorView<'a> },
}

/// Which rows go with which expert.
#[derive(Clone, Copy, Debug)]
pub enum GemmGroups<'r> {
    /// The permutation's segments (read on the device).
    Experts(&'r MoeAlign),
    /// One group: every row of `x` with `W[0]` (a dense layer: the shared expert, the router).
    Dense,
}

/// A stacked expert weight view: `[experts, a, b]` (or `[a, b]`: one expert), `b` contiguous.
#[derive(Clone, Copy, Debug)]
struct ExpertDims {
    addr: u64,
    experts: usize,
    a: usize,
    b: usize,
    expert_stride: usize,
    row_stride: usize,
}

impl ExpertDims {
    fn of(op: &'static str, what: &'static str, w: &crate::launch::Arg) -> Result<ExpertDims> {
        let (shape, strides) = (w.shape(), w.strides());
        let bad = |why| Error::BadLayout { op, what, shape: shape.to_vec(), strides: strides.to_vec(), why };
        let (experts, a, b, se, sa) = match *shape {
            [e, a, b] => (e, a, b, strides[0], strides[1]),
            [a, b] => (1, a, b, 0, strides[0]),
            _ => {
                return Err(Error::ShapeMismatch {
                    op,
                    what,
                    got: shape.to_vec(),
                    expected: "[experts, a, b] or [a, b]".into(),
                });
            }
        };
        if b > 1 && strides[shape.len() - 1] != 1 {
            return Err(bad("the last dimension must be contiguous"));
        }
        let sa = if a > 1 { sa } else { b };
        let se = if experts > 1 { se } else { a * sa };
        Ok(ExpertDims { addr: w.addr, experts, a, b, expert_stride: se, row_stride: sa })
    }
    /// Every byte any expert may use, as rows of one expert's span (conservative).
    fn region(&self, elem: usize) -> Rows {
        let span = if self.a == 0 || self.b == 0 { 0 } else { (self.a - 1) * self.row_stride + self.b };
        Rows { addr: self.addr, elem, rows: self.experts, cols: span, row_stride: self.expert_stride.max(span) }
    }
}

/// `y = x W[e]` (or its SwiGLU form) for the rows of every expert, one launch: `x` is
/// `[rows, k]` and `y` `[rows, n]` (grouped: both with at least the permutation's padded rows;
/// their padding rows are neither read nor written), the weights `[experts, k, n]`
/// ([`WeightLayout::InOut`]) or `[experts, n, k]` ([`WeightLayout::OutIn`]) with any expert and
/// row strides and a contiguous last dimension. bf16 and f16 run on tensor cores (k a multiple of
/// 8, 16-byte aligned rows; InOut also n a multiple of 8), f32 on a SIMT path (no alignment
/// needs). Which rows belong to which expert is read on the device ([`GemmGroups::Experts`]).
pub fn moe_grouped_gemm_on(
    queue: &impl Queue,
    x: &TensorView<'_>,
    layout: WeightLayout,
    weights: ExpertWeights<'_, '_>,
    groups: GemmGroups<'_>,
    y: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = OP_GEMM;
    let device = queue.queue_device()?;
    let dtype = x.dtype();
    check_float(OP, "x", dtype)?;
    check_dtype(OP, "y", y.dtype(), dtype)?;
    let (wv, upv, swiglu, packed) = match weights {
        ExpertWeights::Plain(w) => (w, None, false, false),
        ExpertWeights::SwiGluPacked(w) => (w, None, true, true),
        ExpertWeights::SwiGluSeparate { gate, up } => (gate, Some(up), true, false),
    };
    check_dtype(OP, "weights", wv.dtype(), dtype)?;
    if let Some(u) = upv {
        check_dtype(OP, "up weights", u.dtype(), dtype)?;
    }
    let mut args = KernelArgs::new(OP, &device);
    let yb = args.write("y", y)?;
    let xb = args.read("x", x)?;
    let wb = args.read("weights", wv)?;
    let ub = upv.map(|u| args.read("up weights", u)).transpose()?;
    let (xr, yr) = (Rows::of(OP, "x", &xb, 1)?, Rows::of(OP, "y", &yb, 1)?);
    let wd = ExpertDims::of(OP, "weights", &wb)?;
    let ud = ub.as_ref().map(|u| ExpertDims::of(OP, "up weights", u)).transpose()?;
    // The weight's (k, n) in the kernel's terms.
    let (wk, wn) = match layout {
        WeightLayout::InOut => (wd.a, wd.b),
        WeightLayout::OutIn => (wd.b, wd.a),
    };
    let k = xr.cols;
    let layout_name = match layout {
        WeightLayout::InOut => "[experts, in, out]",
        WeightLayout::OutIn => "[experts, out, in]",
    };
    if wk != k {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "weights",
            got: wb.shape().to_vec(),
            expected: format!("{layout_name} with in = {k} (the columns of x)"),
        });
    }
    let n = if packed {
        if wn % 2 != 0 {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "weights",
                got: wb.shape().to_vec(),
                expected: format!("{layout_name} with an even out = 2 I (gate then up)"),
            });
        }
        wn / 2
    } else {
        wn
    };
    if let (Some(u), Some(ub)) = (&ud, &ub) {
        if (u.experts, u.a, u.b) != (wd.experts, wd.a, wd.b) {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "up weights",
                got: ub.shape().to_vec(),
                expected: format!("{:?} like the gate weights", wb.shape()),
            });
        }
        if (u.expert_stride, u.row_stride) != (wd.expert_stride, wd.row_stride) {
            return Err(Error::BadLayout {
                op: OP,
                what: "up weights",
                shape: ub.shape().to_vec(),
                strides: ub.strides().to_vec(),
                why: "must have the gate weights' strides",
            });
        }
    }
    if yr.cols != n {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "y",
            got: yb.shape().to_vec(),
            expected: format!("[rows, {n}] (the weights' {} columns)", if swiglu { "SwiGLU output" } else { "output" }),
        });
    }
    let elem = dtype.size();
    check_disjoint(OP, ("y", yr), ("x", xr))?;
    check_disjoint(OP, ("y", yr), ("weights", wd.region(elem)))?;
    if let Some(u) = &ud {
        check_disjoint(OP, ("y", yr), ("up weights", u.region(elem)))?;
    }
    // Rows, blocks and the expert map.
    let (schedule, rows, blocks, block_m, map) = match groups {
        GemmGroups::Dense => {
            if xr.rows != yr.rows {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what: "y",
                    got: yb.shape().to_vec(),
                    expected: format!("{} rows like x", xr.rows),
                });
            }
            let bm = preferred_block_m(xr.rows, 1);
            (LlkMoeSchedule::LLK_MOE_DENSE, xr.rows, xr.rows.div_ceil(bm), bm, None)
        }
        GemmGroups::Experts(a) => {
            let s = a.state(OP)?;
            if a.experts != wd.experts {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what: "weights",
                    got: wb.shape().to_vec(),
                    expected: format!("{} experts like the permutation", a.experts),
                });
            }
            let slots = s.tokens * s.top_k;
            let need = padded_rows(slots, a.experts, s.block_m);
            for (what, b, r) in [("x", &xb, &xr), ("y", &yb, &yr)] {
                if r.rows < need {
                    return Err(Error::ShapeMismatch {
                        op: OP,
                        what,
                        got: b.shape().to_vec(),
                        expected: format!("at least {need} rows (the padded rows of the permutation)"),
                    });
                }
            }
            (
                LlkMoeSchedule::LLK_MOE_GROUPED,
                xr.rows.min(yr.rows),
                max_blocks(slots, a.experts, s.block_m),
                s.block_m,
                Some(a),
            )
        }
    };
    if blocks == 0 || n == 0 {
        return Ok(());
    }
    if dtype != DType::F32 {
        let v = dtype.vec16();
        if k % v != 0 {
            return Err(Error::invalid(OP, "k", k, format!("must be a multiple of {v} on the tensor-core path")));
        }
        if layout == WeightLayout::InOut && n % v != 0 {
            return Err(Error::invalid(
                OP,
                "n",
                n,
                format!("must be a multiple of {v} with [experts, in, out] weights"),
            ));
        }
        let misaligned = |addr: u64, strides: &[usize]| addr % 16 != 0 || strides.iter().any(|s| s % v != 0);
        let up_addr = ud.map_or(0, |u| u.addr);
        let checks = [
            ("x", misaligned(xb.addr, &[xr.row_stride]), xb.shape().to_vec(), xb.strides().to_vec()),
            (
                "weights",
                misaligned(wd.addr, &[wd.row_stride, wd.expert_stride]),
                wb.shape().to_vec(),
                wb.strides().to_vec(),
            ),
            ("up weights", ub.is_some() && misaligned(up_addr, &[]), vec![], vec![]),
            ("y", n % v == 0 && misaligned(yb.addr, &[yr.row_stride]), yb.shape().to_vec(), yb.strides().to_vec()),
        ];
        for (what, bad, shape, strides) in checks {
            if bad {
                return Err(Error::BadLayout {
                    op: OP,
                    what,
                    shape,
                    strides,
                    why: "the tensor-core path needs 16-byte aligned rows (address and strides)",
                });
            }
        }
    }
    let up_addr = match (packed, &ud, layout) {
        (true, _, WeightLayout::InOut) => wd.addr + (n * elem) as u64,
        (true, _, WeightLayout::OutIn) => wd.addr + (n * wd.row_stride * elem) as u64,
        (false, Some(u), _) => u.addr,
        (false, None, _) => 0,
    };
    let (offsets, counts, block_expert) = match map {
        Some(a) => {
            let arrays = a.arrays()?;
            (
                args.read_tensor("offsets", &arrays.offsets)?,
                args.read_tensor("counts", &arrays.counts)?,
                args.read_tensor("block_expert", &arrays.block_expert)?,
            )
        }
        None => (0, 0, 0),
    };
    let params = MoeGemmParams {
        x: xb.addr,
        w: wd.addr,
        w_up: up_addr,
        y: yb.addr,
        offsets,
        counts,
        block_expert,
        rows: to_i64(OP, "rows", rows)?,
        n: to_i64(OP, "n", n)?,
        k: to_i64(OP, "k", k)?,
        experts: to_i64(OP, "experts", wd.experts)?,
        x_row_stride: to_i64(OP, "x row stride", xr.row_stride)?,
        y_row_stride: to_i64(OP, "y row stride", yr.row_stride)?,
        w_expert_stride: to_i64(OP, "expert stride", wd.expert_stride)?,
        w_row_stride: to_i64(OP, "weight row stride", wd.row_stride)?,
        layout: raw_layout(layout),
        epilogue: if swiglu { LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU } else { LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN },
        schedule,
    };
    let (cols_per_block, threads, smem) = if dtype == DType::F32 {
        (LLK_MOE_SIMT_BLOCK_N as usize, LLK_MOE_SIMT_THREADS, 0)
    } else {
        if block_m == BLOCK_M {
            (LLK_MOE_GEMM_BLOCK_N as usize, LLK_MOE_GEMM_THREADS, LLK_MOE_GEMM_SMEM_BYTES)
        } else {
            (LLK_MOE_GEMM_BLOCK_N_DECODE as usize, LLK_MOE_GEMM_THREADS, LLK_MOE_GEMM_SMEM_BYTES_DECODE)
        }
    };
    let out_per_block = if swiglu { cols_per_block / 2 } else { cols_per_block };
    let grid_y = u32::try_from(n.div_ceil(out_per_block))
        .ok()
        .filter(|&g| g <= 65535)
        .ok_or_else(|| Error::invalid(OP, "n", n, "too many column blocks for grid.y (65535)"))?;
    let dims = LaunchDims { grid: (grid_x(OP, blocks)?, grid_y, 1), block: (threads, 1, 1), dyn_smem: smem };
    args.launch(GEMM.find(OP, "x", (layout, swiglu, block_m, dtype), dtype)?, dims, &params)
}

/// The tensor form of [`ExpertWeights`].
#[derive(Clone, Copy, Debug)]
pub enum ExpertTensors<'a> {
    Plain(&'a Tensor),
    SwiGluPacked(&'a Tensor),
    SwiGluSeparate { gate: &'a Tensor, up: &'a Tensor },
}

/// [`moe_grouped_gemm_on`] on tensors.
pub fn moe_grouped_gemm(
    x: &Tensor,
    layout: WeightLayout,
    weights: ExpertTensors<'_>,
    groups: GemmGroups<'_>,
    y: &Tensor,
) -> Result<()> {
    let mut yv = TensorViewMut::of_tensor(y);
    match weights {
        ExpertTensors::Plain(w) => {
            moe_grouped_gemm_on(x.device(), &x.view(), layout, ExpertWeights::Plain(&w.view()), groups, &mut yv)
        }
        ExpertTensors::SwiGluPacked(w) => {
            moe_grouped_gemm_on(x.device(), &x.view(), layout, ExpertWeights::SwiGluPacked(&w.view()), groups, &mut yv)
        }
        ExpertTensors::SwiGluSeparate { gate, up } => moe_grouped_gemm_on(
            x.device(),
            &x.view(),
            layout,
            ExpertWeights::SwiGluSeparate { gate: &gate.view(), up: &up.view() },
            groups,
            &mut yv,
        ),
    }
}

// ----------------------------------------------------------------------------------- combine

/// What `moe_combine` adds after the experts.
#[derive(Clone, Copy, Debug)]
pub enum MoeResidual<'r, 'a> {
    None,
    /// `[tokens, hidden]`, read.
    Separate(&'r TensorView<'a>),
    /// `out` already holds the residual: `out += moe(...)`.
    InPlace,
}

/// `out[t] = sum_j w_tj y[row(t, j)] (+ shared[t]) (+ residual[t])`, accumulated in f32 in slot
/// order and rounded once: `weights` (`[tokens, k]` f32) for softmax routing, `None` to sum
/// unweighted (Llama 4, whose weights already scaled the expert input). `y` is the expert-
/// contiguous output (`[rows >= padded rows, hidden]`), `shared` the shared expert's
/// `[tokens, hidden]`. No atomics: the result does not depend on the schedule.
#[allow(clippy::too_many_arguments)]
pub fn moe_combine_on(
    queue: &impl Queue,
    y: &TensorView<'_>,
    align: &MoeAlign,
    weights: Option<&TensorView<'_>>,
    shared: Option<&TensorView<'_>>,
    residual: MoeResidual<'_, '_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = OP_COMBINE;
    let device = queue.queue_device()?;
    let dtype = y.dtype();
    check_float(OP, "y", dtype)?;
    check_dtype(OP, "out", out.dtype(), dtype)?;
    if let Some(w) = weights {
        check_dtype(OP, "weights", w.dtype(), DType::F32)?;
    }
    if let Some(s) = shared {
        check_dtype(OP, "shared", s.dtype(), dtype)?;
    }
    if let MoeResidual::Separate(r) = residual {
        check_dtype(OP, "residual", r.dtype(), dtype)?;
    }
    let state = align.state(OP)?;
    let arrays = align.arrays()?;
    let mut args = KernelArgs::new(OP, &device);
    let ob = args.write("out", out)?;
    let yb = args.read("y", y)?;
    let wb = weights.map(|w| args.read("weights", w)).transpose()?;
    let sb = shared.map(|s| args.read("shared", s)).transpose()?;
    let rb = match residual {
        MoeResidual::Separate(r) => Some(args.read("residual", r)?),
        _ => None,
    };
    let (yr, or) = (Rows::of(OP, "y", &yb, 1)?, Rows::of(OP, "out", &ob, 1)?);
    check_align_tokens(OP, "out", &ob, or.rows, state)?;
    let hidden = or.cols;
    let need = padded_rows(state.tokens * state.top_k, align.experts, state.block_m);
    if yr.cols != hidden || yr.rows < need {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "y",
            got: yb.shape().to_vec(),
            expected: format!("at least [{need}, {hidden}] (the padded rows of the permutation)"),
        });
    }
    if let Some(w) = &wb {
        check_weights_shape(OP, w, state)?;
        check_disjoint(OP, ("out", or), ("weights", contiguous_rows(OP, "weights", w)?))?;
    }
    let mut extra = Vec::new();
    for (what, b) in [("shared", &sb), ("residual", &rb)] {
        if let Some(b) = b {
            let r = Rows::of(OP, what, b, 1)?;
            if (r.rows, r.cols) != (or.rows, or.cols) {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what,
                    got: b.shape().to_vec(),
                    expected: format!("{:?} like out", ob.shape()),
                });
            }
            check_disjoint(OP, ("out", or), (what, r))?;
            extra.push(r);
        }
    }
    check_disjoint(OP, ("out", or), ("y", yr))?;
    let (sr, rr) = (sb.as_ref().map(|_| extra[0]), rb.as_ref().map(|_| extra[extra.len() - 1]));
    let rr = match residual {
        MoeResidual::InPlace => Some(or),
        _ => rr,
    };
    if state.tokens == 0 || hidden == 0 {
        return Ok(());
    }
    let v = dtype.vec16();
    let aligned = |r: &Rows| r.addr % 16 == 0 && r.row_stride % v == 0;
    let vec = hidden % v == 0
        && aligned(&yr)
        && aligned(&or)
        && sr.is_none_or(|r| aligned(&r))
        && rr.is_none_or(|r| aligned(&r));
    let params = MoeCombineParams {
        y: yb.addr,
        rows: args.read_tensor("rows", &arrays.rows)?,
        weights: wb.map_or(0, |w| w.addr),
        shared: sr.map_or(0, |r| r.addr),
        residual: rr.map_or(0, |r| r.addr),
        out: ob.addr,
        tokens: to_i64(OP, "tokens", state.tokens)?,
        top_k: to_i64(OP, "top_k", state.top_k)?,
        hidden: to_i64(OP, "hidden", hidden)?,
        y_rows: to_i64(OP, "y rows", yr.rows)?,
        y_row_stride: to_i64(OP, "y row stride", yr.row_stride)?,
        shared_row_stride: to_i64(OP, "shared row stride", sr.map_or(0, |r| r.row_stride))?,
        residual_row_stride: to_i64(OP, "residual row stride", rr.map_or(0, |r| r.row_stride))?,
        out_row_stride: to_i64(OP, "out row stride", or.row_stride)?,
        scale: if wb.is_some() { LlkMoeScale::LLK_MOE_SCALED } else { LlkMoeScale::LLK_MOE_UNSCALED },
    };
    let dims =
        LaunchDims { grid: (grid_x(OP, state.tokens)?, 1, 1), block: (row_threads(hidden, vec, v), 1, 1), dyn_smem: 0 };
    args.launch(COMBINE.find(OP, "y", (vec, dtype), dtype)?, dims, &params)
}

/// [`moe_combine_on`] on tensors; `residual` may be `out` itself (then `out += moe(...)`).
pub fn moe_combine(
    y: &Tensor,
    align: &MoeAlign,
    weights: Option<&Tensor>,
    shared: Option<&Tensor>,
    residual: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let wv = weights.map(Tensor::view);
    let sv = shared.map(Tensor::view);
    let rv = residual.map(Tensor::view);
    let in_place = residual.is_some_and(|r| r.shares_storage(out) && r.dims() == out.dims());
    let res = match (&rv, in_place) {
        (_, true) => MoeResidual::InPlace,
        (Some(r), false) => MoeResidual::Separate(r),
        (None, _) => MoeResidual::None,
    };
    moe_combine_on(y.device(), &y.view(), align, wv.as_ref(), sv.as_ref(), res, &mut TensorViewMut::of_tensor(out))
}

// ----------------------------------------------------------------------------------- the layer

/// Gate and up projections of the routed experts.
#[derive(Clone, Debug)]
pub enum GateUpTensors {
    /// One tensor with `2 intermediate` outputs per expert, gate first (`[E, hidden, 2I]` InOut:
    /// Llama 4 `gate_up_proj`; `[E, 2I, hidden]` OutIn).
    Packed(Tensor),
    /// Two tensors with `intermediate` outputs each and the same strides (Mixtral `w1`, `w3`).
    Separate { gate: Tensor, up: Tensor },
}

/// A shared expert (a dense SwiGLU MLP applied to every token), `nn.Linear` weights:
/// gate and up `[shared_intermediate, hidden]`, down `[hidden, shared_intermediate]`.
#[derive(Clone, Debug)]
pub struct SharedExpertTensors {
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

/// The weights of a MoE layer, in the layer's dtype (the router bias in f32).
#[derive(Clone, Debug)]
pub struct MoeFfnWeights {
    /// `[experts, hidden]` (`nn.Linear`).
    pub router: Tensor,
    /// Grouped routing's selection bias `[experts]` f32, or none.
    pub router_bias: Option<Tensor>,
    /// Layout of `gate_up` and `down`.
    pub layout: WeightLayout,
    pub gate_up: GateUpTensors,
    /// `[experts, intermediate, hidden]` (InOut) or `[experts, hidden, intermediate]` (OutIn).
    pub down: Tensor,
    pub shared: Option<SharedExpertTensors>,
}

/// The planned buffers of a MoE feed-forward (router logits, routing, permutation, the
/// expert-contiguous activations, the shared expert's), for one configuration and a maximum
/// token count, without weights. One workspace serves every MoE layer of a model: the block
/// composer passes each layer's weights to [`MoeWorkspace::forward_on`]. [`MoeFfn`] pairs one
/// with its weights.
#[derive(Debug)]
pub struct MoeWorkspace {
    device: Device,
    config: MoeFfnConfig,
    dtype: DType,
    max_tokens: usize,
    /// The largest shared-expert intermediate size planned for (0: none).
    shared_capacity: usize,
    logits: Tensor,
    ids: Tensor,
    route_weights: Tensor,
    align: MoeAlign,
    xp: Tensor,
    h: Tensor,
    y: Tensor,
    /// Flat `[max_tokens * shared_capacity]`: viewed as `[tokens, shared intermediate]`.
    shared_h: Tensor,
    shared_out: Tensor,
    last_tokens: usize,
    last_shared: bool,
}

/// A MoE feed-forward layer with its workspace, planned once for a maximum token count:
/// router GEMM -> route -> align -> gather -> GEMM 1 + SwiGLU -> GEMM 2, the shared expert as two
/// dense GEMMs (the grouped GEMM with one group), then combine (+ residual). A forward within
/// the planned size allocates nothing, copies nothing and never waits on the host.
#[derive(Debug)]
pub struct MoeFfn {
    workspace: MoeWorkspace,
    weights: MoeFfnWeights,
}

/// The device tensors of the last forward's stages (views of the workspace, `tokens` rows).
#[derive(Clone, Debug)]
pub struct MoeFfnStages {
    pub logits: Tensor,
    pub ids: Tensor,
    pub weights: Tensor,
    /// The shared expert's output, when there is one.
    pub shared: Option<Tensor>,
}

/// Checks `weights` against `config` on `device`; returns their dtype and the shared expert's
/// intermediate size (0 without one).
pub fn check_ffn_weights(device: &Device, config: &MoeFfnConfig, weights: &MoeFfnWeights) -> Result<(DType, usize)> {
    const OP: &str = OP_FFN;
    let MoeFfnConfig { hidden, intermediate, experts, top_k, routing, .. } = *config;
    let dtype = weights.router.dtype();
    check_float(OP, "router", dtype)?;
    check_routing(OP, experts, top_k, routing)?;
    for (what, v) in [("hidden", hidden), ("intermediate", intermediate)] {
        if v == 0 {
            return Err(Error::invalid(OP, what, 0, "must be > 0"));
        }
    }
    let shape = |what: &'static str, t: &Tensor, expected: &[usize]| -> Result<()> {
        check_dtype(OP, what, t.dtype(), dtype)?;
        if t.shape() != expected {
            return Err(Error::ShapeMismatch {
                op: OP,
                what,
                got: t.shape().to_vec(),
                expected: format!("{expected:?}"),
            });
        }
        if !t.device().same_context(device) {
            return Err(Error::DeviceMismatch { op: OP, what });
        }
        Ok(())
    };
    shape("router", &weights.router, &[experts, hidden])?;
    if let Some(b) = &weights.router_bias {
        check_dtype(OP, "router_bias", b.dtype(), DType::F32)?;
        if !matches!(routing, MoeRouting::Grouped { .. }) {
            return Err(Error::invalid(OP, "router_bias", "given", "only grouped routing takes a selection bias"));
        }
        if b.shape() != [experts] {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "router_bias",
                got: b.shape().to_vec(),
                expected: format!("[{experts}]"),
            });
        }
    }
    let io = |out: usize, inp: usize| match weights.layout {
        WeightLayout::InOut => vec![experts, inp, out],
        WeightLayout::OutIn => vec![experts, out, inp],
    };
    match &weights.gate_up {
        GateUpTensors::Packed(w) => shape("gate_up", w, &io(2 * intermediate, hidden))?,
        GateUpTensors::Separate { gate, up } => {
            shape("gate", gate, &io(intermediate, hidden))?;
            shape("up", up, &io(intermediate, hidden))?;
        }
    }
    shape("down", &weights.down, &io(hidden, intermediate))?;
    let shared_intermediate = match &weights.shared {
        Some(s) => {
            let si = s.gate.shape().first().copied().unwrap_or(0);
            shape("shared gate", &s.gate, &[si, hidden])?;
            shape("shared up", &s.up, &[si, hidden])?;
            shape("shared down", &s.down, &[hidden, si])?;
            if si == 0 {
                return Err(Error::invalid(OP, "shared intermediate", 0, "must be > 0"));
            }
            si
        }
        None => 0,
    };
    Ok((dtype, shared_intermediate))
}

impl MoeWorkspace {
    /// Plans the buffers for up to `max_tokens` tokens of `dtype` and a shared expert of up to
    /// `shared_intermediate` (0: no shared expert).
    pub fn new(
        device: &Device,
        config: MoeFfnConfig,
        dtype: DType,
        shared_intermediate: usize,
        max_tokens: usize,
    ) -> Result<MoeWorkspace> {
        const OP: &str = OP_FFN;
        let MoeFfnConfig { hidden, intermediate, experts, top_k, routing, .. } = config;
        check_float(OP, "dtype", dtype)?;
        check_routing(OP, experts, top_k, routing)?;
        for (what, v) in [("hidden", hidden), ("intermediate", intermediate)] {
            if v == 0 {
                return Err(Error::invalid(OP, what, 0, "must be > 0"));
            }
        }
        let max_tokens = max_tokens.max(1);
        let slots =
            max_tokens.checked_mul(top_k).ok_or_else(|| Error::invalid(OP, "max_tokens", max_tokens, "too large"))?;
        let rows = padded_rows(slots, experts, BLOCK_M);
        let shared_len = max_tokens
            .checked_mul(shared_intermediate)
            .ok_or_else(|| Error::invalid(OP, "shared intermediate", shared_intermediate, "too large"))?;
        let z = |dt, shape: &[usize]| Tensor::zeros(device, dt, shape);
        Ok(MoeWorkspace {
            device: device.clone(),
            config,
            dtype,
            max_tokens,
            shared_capacity: shared_intermediate,
            logits: z(dtype, &[max_tokens, experts])?,
            ids: z(DType::I32, &[max_tokens, top_k])?,
            route_weights: z(DType::F32, &[max_tokens, top_k])?,
            align: MoeAlign::new(device, experts, slots)?,
            xp: z(dtype, &[rows, hidden])?,
            h: z(dtype, &[rows, intermediate])?,
            y: z(dtype, &[rows, hidden])?,
            shared_h: z(dtype, &[shared_len])?,
            shared_out: z(dtype, &[if shared_intermediate > 0 { max_tokens } else { 0 }, hidden])?,
            last_tokens: 0,
            last_shared: false,
        })
    }

    pub fn config(&self) -> &MoeFfnConfig {
        &self.config
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
    /// The permutation of the last forward (its counts, offsets and rows live on the device).
    pub fn permutation(&self) -> &MoeAlign {
        &self.align
    }

    /// The last forward's router logits, routing and shared-expert output (device views).
    pub fn stages(&self) -> Result<MoeFfnStages> {
        let t = self.last_tokens;
        Ok(MoeFfnStages {
            logits: self.logits.narrow(0, 0, t)?,
            ids: self.ids.narrow(0, 0, t)?,
            weights: self.route_weights.narrow(0, 0, t)?,
            shared: if self.last_shared { Some(self.shared_out.narrow(0, 0, t)?) } else { None },
        })
    }

    /// Reads the device-side error flag of the permutation (waits for the device).
    pub fn check_errors(&self) -> Result<()> {
        self.align.check_errors()
    }

    /// `out = moe(x) (+ residual)` with `weights` (checked against the planned configuration):
    /// the tensor form of [`MoeWorkspace::forward_on`].
    pub fn forward(
        &mut self,
        weights: &MoeFfnWeights,
        x: &Tensor,
        residual: Option<&Tensor>,
        out: &Tensor,
    ) -> Result<()> {
        let rv = residual.map(Tensor::view);
        let in_place = residual.is_some_and(|r| r.shares_storage(out) && r.dims() == out.dims());
        let res = match (&rv, in_place) {
            (_, true) => MoeResidual::InPlace,
            (Some(r), false) => MoeResidual::Separate(r),
            (None, _) => MoeResidual::None,
        };
        let device = x.device().clone();
        self.forward_on(&device, weights, &x.view(), res, &mut TensorViewMut::of_tensor(out))
    }

    /// `out = moe(x) (+ residual)` on borrowed views, queued on `queue`, with `weights` checked
    /// against the planned configuration (host-side shape checks only).
    pub fn forward_on(
        &mut self,
        queue: &impl Queue,
        weights: &MoeFfnWeights,
        x: &TensorView<'_>,
        residual: MoeResidual<'_, '_>,
        out: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        const OP: &str = OP_FFN;
        let (dtype, shared) = check_ffn_weights(&self.device, &self.config, weights)?;
        check_dtype(OP, "weights", dtype, self.dtype)?;
        if shared > self.shared_capacity {
            return Err(Error::invalid(
                OP,
                "shared intermediate",
                shared,
                format!("exceeds the planned {} (MoeWorkspace::new)", self.shared_capacity),
            ));
        }
        self.run(queue, weights, x, residual, out)
    }

    /// The forward, `weights` already checked.
    fn run(
        &mut self,
        queue: &impl Queue,
        weights: &MoeFfnWeights,
        x: &TensorView<'_>,
        residual: MoeResidual<'_, '_>,
        out: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        const OP: &str = OP_FFN;
        let device = queue.queue_device()?;
        if !device.same_context(&self.device) {
            return Err(Error::DeviceMismatch { op: OP, what: "layer" });
        }
        check_dtype(OP, "x", x.dtype(), self.dtype)?;
        check_dtype(OP, "out", out.dtype(), self.dtype)?;
        let hidden = self.config.hidden;
        let tokens = match x.shape() {
            [t, h] if *h == hidden => *t,
            _ => {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what: "x",
                    got: x.shape().to_vec(),
                    expected: format!("[tokens, {hidden}]"),
                });
            }
        };
        if out.shape() != x.shape() {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "out",
                got: out.shape().to_vec(),
                expected: format!("{:?} like x", x.shape()),
            });
        }
        if tokens > self.max_tokens {
            return Err(Error::invalid(
                OP,
                "tokens",
                tokens,
                format!("exceeds the planned {} (MoeFfn::new)", self.max_tokens),
            ));
        }
        self.last_tokens = tokens;
        self.last_shared = weights.shared.is_some();
        if tokens == 0 {
            return Ok(());
        }
        let MoeFfnConfig { experts, top_k, routing, weights_on_input, .. } = self.config;
        let slots = tokens * top_k;
        let block_m = preferred_block_m(slots, experts);
        let rows = padded_rows(slots, experts, block_m);
        let logits = self.logits.narrow(0, 0, tokens)?;
        let ids = self.ids.narrow(0, 0, tokens)?;
        let rw = self.route_weights.narrow(0, 0, tokens)?;
        let (xp, h, y) = (self.xp.narrow(0, 0, rows)?, self.h.narrow(0, 0, rows)?, self.y.narrow(0, 0, rows)?);
        let w = weights;
        let layout = w.layout;
        // Router: logits = x router^T (one group).
        moe_grouped_gemm_on(
            queue,
            x,
            WeightLayout::OutIn,
            ExpertWeights::Plain(&w.router.view()),
            GemmGroups::Dense,
            &mut TensorViewMut::of_tensor(&logits),
        )?;
        let bias = w.router_bias.as_ref().map(Tensor::view);
        moe_route_on(
            queue,
            &logits.view(),
            bias.as_ref(),
            routing,
            &mut TensorViewMut::of_tensor(&ids),
            &mut TensorViewMut::of_tensor(&rw),
        )?;
        self.align.align_on(queue, &ids.view(), block_m)?;
        let rwv = rw.view();
        moe_gather_on(queue, x, &self.align, weights_on_input.then_some(&rwv), &mut TensorViewMut::of_tensor(&xp))?;
        let groups = GemmGroups::Experts(&self.align);
        let mut hv = TensorViewMut::of_tensor(&h);
        match &w.gate_up {
            GateUpTensors::Packed(gu) => moe_grouped_gemm_on(
                queue,
                &xp.view(),
                layout,
                ExpertWeights::SwiGluPacked(&gu.view()),
                groups,
                &mut hv,
            )?,
            GateUpTensors::Separate { gate, up } => moe_grouped_gemm_on(
                queue,
                &xp.view(),
                layout,
                ExpertWeights::SwiGluSeparate { gate: &gate.view(), up: &up.view() },
                groups,
                &mut hv,
            )?,
        }
        moe_grouped_gemm_on(
            queue,
            &h.view(),
            layout,
            ExpertWeights::Plain(&w.down.view()),
            groups,
            &mut TensorViewMut::of_tensor(&y),
        )?;
        let shared = match &w.shared {
            Some(s) => {
                let si = s.gate.shape().first().copied().unwrap_or(0);
                let sh = self.shared_h.narrow(0, 0, tokens * si)?.reshape(&[tokens, si])?;
                let so = self.shared_out.narrow(0, 0, tokens)?;
                moe_grouped_gemm_on(
                    queue,
                    x,
                    WeightLayout::OutIn,
                    ExpertWeights::SwiGluSeparate { gate: &s.gate.view(), up: &s.up.view() },
                    GemmGroups::Dense,
                    &mut TensorViewMut::of_tensor(&sh),
                )?;
                moe_grouped_gemm_on(
                    queue,
                    &sh.view(),
                    WeightLayout::OutIn,
                    ExpertWeights::Plain(&s.down.view()),
                    GemmGroups::Dense,
                    &mut TensorViewMut::of_tensor(&so),
                )?;
                Some(so)
            }
            None => None,
        };
        let sv = shared.as_ref().map(Tensor::view);
        moe_combine_on(queue, &y.view(), &self.align, (!weights_on_input).then_some(&rwv), sv.as_ref(), residual, out)
    }
}

impl MoeFfn {
    /// Checks the weights against `config` and plans the workspace for up to `max_tokens` tokens.
    pub fn new(device: &Device, config: MoeFfnConfig, weights: MoeFfnWeights, max_tokens: usize) -> Result<MoeFfn> {
        let (dtype, shared) = check_ffn_weights(device, &config, &weights)?;
        Ok(MoeFfn { workspace: MoeWorkspace::new(device, config, dtype, shared, max_tokens)?, weights })
    }

    pub fn config(&self) -> &MoeFfnConfig {
        self.workspace.config()
    }
    pub fn dtype(&self) -> DType {
        self.workspace.dtype()
    }
    pub fn max_tokens(&self) -> usize {
        self.workspace.max_tokens()
    }
    pub fn weights(&self) -> &MoeFfnWeights {
        &self.weights
    }
    /// The permutation of the last forward (its counts, offsets and rows live on the device).
    pub fn permutation(&self) -> &MoeAlign {
        self.workspace.permutation()
    }
    /// The last forward's router logits, routing and shared-expert output (device views).
    pub fn stages(&self) -> Result<MoeFfnStages> {
        self.workspace.stages()
    }
    /// Reads the device-side error flag of the permutation (waits for the device).
    pub fn check_errors(&self) -> Result<()> {
        self.workspace.check_errors()
    }

    /// `out = moe(x) (+ residual)`: `x`, `out` (and `residual`) `[tokens, hidden]`,
    /// `tokens <= max_tokens`. `residual` may be `out` itself (`out += moe(x)`).
    pub fn forward(&mut self, x: &Tensor, residual: Option<&Tensor>, out: &Tensor) -> Result<()> {
        self.workspace.forward(&self.weights, x, residual, out)
    }

    /// [`MoeFfn::forward`] on borrowed views, queued on `queue`.
    pub fn forward_on(
        &mut self,
        queue: &impl Queue,
        x: &TensorView<'_>,
        residual: MoeResidual<'_, '_>,
        out: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        self.workspace.run(queue, &self.weights, x, residual, out)
    }
}
