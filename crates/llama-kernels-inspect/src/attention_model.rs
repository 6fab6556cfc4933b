//! The second-order model of a flash-attention main loop on mma.sync (issue 19): what one
//! 64-key tile of one warp issues ([`LoopCounts`]), how its tensor work and its softmax chain
//! share an SMSP ([`MatrixModel`]), and a whole launch with its waves and causal tail
//! ([`predict_launch`]). Calibrated against peers in [`super::perf`].

use super::h200;
use super::sass::Sass;

/// What the matrix model reads from one main-loop iteration (one 64-key tile) of one warp: the
/// instruction classes that set its tensor work, its softmax chain and its issue slots.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoopCounts {
    /// Every instruction except NOP.
    pub total: usize,
    pub hmma: usize,
    pub ldsm: usize,
    pub ldgsts: usize,
    pub mufu: usize,
    pub shfl: usize,
    pub bar: usize,
    /// FP32 pipe: FFMA, FMUL, FADD, FMNMX.
    pub fp32: usize,
}

impl LoopCounts {
    pub fn of<'a>(code: impl IntoIterator<Item = &'a Sass>) -> LoopCounts {
        let mut c = LoopCounts::default();
        for i in code {
            match i.base() {
                "NOP" => continue,
                "HMMA" => c.hmma += 1,
                "LDSM" => c.ldsm += 1,
                "LDGSTS" => c.ldgsts += 1,
                "MUFU" => c.mufu += 1,
                "SHFL" => c.shfl += 1,
                "BAR" => c.bar += 1,
                "FFMA" | "FMUL" | "FADD" | "FMNMX" => c.fp32 += 1,
                _ => {}
            }
            c.total += 1;
        }
        c
    }
}

/// The matrix model of a flash-attention main loop on one SMSP (issue 19). Each warp alternates
/// a GEMM phase (P.V of tile j, then S = Q.K^T of tile j+1: `hmma` mma.sync on the SMSP's tensor
/// pipe) and a chain the tensor pipe cannot overlap within that warp: the drain of the last HMMA,
/// the softmax (row maximum over two SHFL steps, ex2 on the MUFU quad, rescale of O, conversion
/// of P) and the block barriers. The other warps of the SMSP can fill the pipe during a chain:
/// fully when their phases are independent and one of them is in its GEMM phase, not at all when
/// they run in lockstep (identical blocks started together, symmetric contention). The model's
/// figure is the lockstep one: the calibration chose it, since independent phases over-predict
/// every FA2 figure by 9-16% at the tensor clock; that choice is the one thing fitted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatrixModel {
    pub warps_per_smsp: f64,
    /// Tensor-pipe clocks of one warp's tile (HMMA x clocks per HMMA per SMSP).
    pub gemm_clk: f64,
    /// One warp's chain between its GEMMs (clocks).
    pub chain_clk: f64,
    /// Of which: MUFU-pipe clocks and the issue slots of the non-GEMM instructions (they
    /// overlap, the longer counts).
    pub mufu_clk: f64,
    pub softmax_issue: f64,
    /// Issue slots of every warp's tile on the SMSP's one scheduler.
    pub issue_clk: f64,
    /// Clocks per tile of all the SMSP's warps: lockstep (the model's figure) and independent
    /// phases (the upper bound).
    pub period_lockstep: f64,
    pub period_independent: f64,
    /// Tensor-pipe utilization in the main loop, lockstep and independent.
    pub utilization: f64,
    pub utilization_independent: f64,
    /// Main-loop TFLOP/s at the tensor clock (lockstep, independent) and the first-order figure
    /// the report printed before (mma.sync rate at the datasheet-derived clock, no chain).
    pub loop_tflops: f64,
    pub loop_tflops_independent: f64,
    pub first_order_tflops: f64,
}

/// The matrix model of loop `c` with `warps_per_sm` resident warps.
pub fn matrix_model(c: &LoopCounts, warps_per_sm: u32) -> MatrixModel {
    let w = (warps_per_sm as f64 / h200::SMSPS).max(1.0);
    let hmma = c.hmma.max(1) as f64;
    let clk_per_hmma = h200::SMSPS / h200::HMMA_PER_CLK;
    let gemm = hmma * clk_per_hmma;
    let mufu_clk = c.mufu as f64 * h200::SMSPS * 32.0 / h200::MUFU_PER_CLK;
    let softmax_issue = c.total.saturating_sub(c.hmma + c.ldsm + c.ldgsts) as f64;
    let chain = h200::HMMA_LATENCY_CLK
        + mufu_clk.max(softmax_issue)
        + 2.0 * h200::SHFL_LATENCY_CLK
        + c.bar as f64 * h200::BAR_LATENCY_CLK;
    let issue = w * c.total as f64;
    // Lockstep: the warps share the pipe through their GEMM phases, then all wait out the chain.
    let period_lockstep = (w * gemm + chain).max(issue);
    // Independent phases: the pipe idles only while every warp is in its chain, a fraction
    // (chain / period)^w; busy time w * gemm = period * (1 - (chain / period)^w).
    let (mut lo, mut hi) = (w * gemm, w * gemm + chain);
    for _ in 0..100 {
        let p = 0.5 * (lo + hi);
        if w * gemm / p < 1.0 - (chain / p).powf(w) {
            hi = p;
        } else {
            lo = p;
        }
    }
    let period_independent = hi.max(issue);
    let rate = |period: f64, ghz: f64| 4096.0 * hmma * w * h200::SMSPS * h200::SMS * ghz * 1e9 / period / 1e12;
    MatrixModel {
        warps_per_smsp: w,
        gemm_clk: gemm,
        chain_clk: chain,
        mufu_clk,
        softmax_issue,
        issue_clk: issue,
        period_lockstep,
        period_independent,
        utilization: w * gemm / period_lockstep,
        utilization_independent: w * gemm / period_independent,
        loop_tflops: rate(period_lockstep, h200::TENSOR_CLOCK_GHZ),
        loop_tflops_independent: rate(period_independent, h200::TENSOR_CLOCK_GHZ),
        first_order_tflops: rate(w * gemm, h200::CLOCK_GHZ),
    }
}

/// An attention launch the model predicts whole: grid, causal structure, block order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Workload {
    pub seq: usize,
    pub batch: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// Causal row blocks dispatched heaviest first (ours) or in row order, lightest first (FA2).
    pub heaviest_first: bool,
}

/// The reference launch the report predicts for our attention kernel: a 16k-token causal
/// prefill of Llama 3 8B (32 q heads, head_dim 128, one q head per 128-row block), heaviest row
/// block first as `locate` dispatches them.
pub const OUR_PREFILL: Workload =
    Workload { seq: 16384, batch: 1, heads: 32, head_dim: 128, causal: true, heaviest_first: true };

/// Launch-level prediction: TFLOP/s as benchmarks count it (4 s^2 d h b, halved when causal).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaunchPrediction {
    pub tflops: f64,
    /// Busy fraction of the block slots over the launch (wave quantization, causal tail).
    pub schedule: f64,
    /// Credited FLOPs over the FLOPs of the tiles computed (causal diagonal tiles are whole).
    pub credited: f64,
}

/// Greedy dispatch of `jobs` (durations, in dispatch order) onto `slots` resident blocks: the
/// busy fraction until the last block ends.
pub fn schedule_efficiency(jobs: &[f64], slots: usize) -> f64 {
    let mut free = vec![0.0f64; slots.max(1)];
    for &j in jobs {
        let (k, _) = free.iter().enumerate().fold((0, f64::INFINITY), |b, (k, &t)| if t < b.1 { (k, t) } else { b });
        free[k] += j;
    }
    let end = free.iter().cloned().fold(0.0, f64::max);
    jobs.iter().sum::<f64>() / (free.len() as f64 * end)
}

/// The launch prediction of `w` for a kernel of `model` with 128-row blocks, 64-key tiles and
/// `blocks_per_sm` resident blocks.
pub fn predict_launch(model: &MatrixModel, w: &Workload, blocks_per_sm: u32) -> LaunchPrediction {
    let (bm, bn) = (128usize, 64usize);
    let row_blocks = w.seq.div_ceil(bm);
    let tiles = |m: usize| if w.causal { ((m + 1) * bm).min(w.seq).div_ceil(bn) } else { w.seq.div_ceil(bn) };
    let mut jobs = Vec::with_capacity(row_blocks * w.heads * w.batch);
    for _ in 0..w.heads * w.batch {
        for k in 0..row_blocks {
            let m = if w.causal && w.heaviest_first { row_blocks - 1 - k } else { k };
            jobs.push(tiles(m) as f64 + h200::BLOCK_OVERHEAD_TILES);
        }
    }
    let slots = (h200::SMS as usize) * blocks_per_sm.max(1) as usize;
    let schedule = schedule_efficiency(&jobs, slots);
    let computed: f64 = jobs.iter().map(|j| j - h200::BLOCK_OVERHEAD_TILES).sum::<f64>() * (bm * bn) as f64;
    let full = (w.seq * w.seq) as f64 * (w.heads * w.batch) as f64;
    let credited_pairs = if w.causal { full / 2.0 } else { full };
    // Seconds: the busiest slot's tiles at the lockstep period, plus the launch.
    let tile_s = model.period_lockstep / (h200::TENSOR_CLOCK_GHZ * 1e9);
    let busiest = jobs.iter().sum::<f64>() / (slots as f64 * schedule);
    let seconds = busiest * tile_s + h200::LAUNCH_US * 1e-6;
    let flops = 4.0 * credited_pairs * w.head_dim as f64;
    LaunchPrediction { tflops: flops / seconds / 1e12, schedule, credited: credited_pairs / computed }
}
