//! The packed linear kernels in the static report: what the sm_90 SASS of `qgemv_*` and
//! `qgemm_*` predicts on an H200, at Llama 3 8B's projection shapes with bf16 activations.
//!
//! **GEMV (decode).** A memory-bound launch in the calibrated model of
//! [`memory_model`](super::memory_model): the bytes are the packed weight
//! ([`QuantLayout::total_bytes`]: values, high bits, block headers) plus the activations and the
//! output; the bytes in flight per lane are the packed loads of one loop iteration (the
//! `.CONSTANT` loads of the main loop, read from the SASS) times the loop's pipeline depth
//! (`LLK_QGEMV_DEPTH`: the next chunk is loaded before the current one is decoded); resident
//! warps per SM are the occupancy, or fewer when the grid does not fill the GPU (split-K, from
//! [`gemv_split`], multiplies them). Issue: the main loop is compiled for 16 activation rows: the
//! chunk's loads and decode (up to the first activation load), then 16 row blocks, each left early
//! when the rows run out; at `rows` rows the model counts the decode and `rows` sixteenths of the
//! rest (the scheduler may move a few instructions across that line).
//!
//! **Tensor-core GEMV (decode, Q4_0, Q4_1, Q4_K, Q6_K, NF4).** The same memory model: one loop
//! iteration is one warp's group (16 weight rows x 4 chunks, 2048 weights), its issue slots the
//! loop with the most HMMA (they do not depend on the rows, 1 to 8: the rows are the MMA's
//! columns), its bytes in flight the iteration's `.CONSTANT` loads times `LLK_QMMV_DEPTH`; the
//! grid is one 4-warp block per 16-row tile per split of `in` ([`mma_gemv_splits`]), whose f32
//! partials (written and read back by the reduce kernel) count as extra DRAM bytes. The reduce
//! kernel's own launch is not in the figures.
//!
//! **GEMM (prefill).** First order, as for attention's first-order line: clocks per HMMA under
//! the tensor, shared-memory and issue limits of the loop with the most HMMA, at the tensor-loaded
//! clock; next to our own dense `mma.sync` GEMM (the MoE grouped GEMM's 64-row `[n, k]` kernel)
//! read the same way, so the ratio between them does not depend on the clock. Left out: the
//! chain from a weight load to its use (hidden by the one-step-ahead load at these occupancies),
//! waves and tails, L2 traffic of the weight's rereads by the row blocks.

use super::h200::{self, occupancy};
use super::memory_model::{H200, MemoryLaunch, MemoryPrediction, predict_memory_launch};
use super::sass::{Sass, loops};
use super::{KernelCode, KernelResources, kernel_code};
use llama_kernels::dev::geometry::params::{
    LLK_QGEMM_THREADS, LLK_QGEMV_DEPTH, LLK_QGEMV_MAX_ROWS, LLK_QGEMV_WARPS, LLK_QMMV_DEPTH, LLK_QMMV_GROUP,
    LLK_QMMV_WARPS, LLK_QUANT_CHUNK,
};
use llama_kernels::dtype::DType;
use llama_kernels::ops::qlinear::{MAX_MMA_GEMV_ROWS, gemv_split, has_mma_gemv, mma_gemv_splits};
use llama_kernels::spec::quant::{QuantFormat, QuantLayout};

/// Llama 3 8B's projections as `[out, in]`: q and o, k and v, gate and up, down.
pub const SHAPES: [(&str, usize, usize); 4] = [
    ("q/o 4096x4096", 4096, 4096),
    ("k/v 1024x4096", 1024, 4096),
    ("gate/up 14336x4096", 14336, 4096),
    ("down 4096x14336", 4096, 14336),
];

/// The dense mma.sync GEMM the packed GEMM is compared with (same tile: 64 rows x 128 weight
/// rows x 64 deep, 4 warps, the weight in `[n, k]` layout).
pub const DENSE_PEER: (&str, &str) = ("moe", "moe_grouped_gemm_nk_plain_m64_bf16");

/// The instructions of the loop of `code` with the most instructions of base `op`.
fn loop_with_most<'a>(code: &'a [Sass], op: &str) -> Result<Vec<&'a Sass>, String> {
    let count = |&(s, e): &(u32, u32)| code.iter().filter(|i| (s..=e).contains(&i.addr) && i.base() == op).count();
    let (s, e) = loops(code).into_iter().max_by_key(count).ok_or("no loop")?;
    Ok(code.iter().filter(|i| (s..=e).contains(&i.addr) && i.base() != "NOP").collect())
}

/// Bytes one global access of `op` moves per thread (`LDG.E.128` 16, `LDG.E.U16` 2, ...).
fn access_bytes(op: &str) -> usize {
    op.split('.')
        .find_map(|m| match m {
            "128" => Some(16),
            "64" => Some(8),
            "U16" | "S16" => Some(2),
            "U8" | "S8" => Some(1),
            _ => None,
        })
        .unwrap_or(4)
}

/// What the report predicts for one packed GEMV launch.
#[derive(Clone, Debug)]
pub struct GemvPrediction {
    pub kernel: String,
    pub shape: &'static str,
    pub rows: usize,
    pub split: usize,
    pub bits_per_weight: f64,
    pub warps_per_sm: u32,
    /// Packed bytes per lane and loop iteration, and the bytes in flight per lane.
    pub weight_bytes_per_iteration: usize,
    pub bytes_in_flight_per_thread: f64,
    /// Issue slots per loop iteration at `rows` rows.
    pub slots_per_iteration: f64,
    pub memory: MemoryPrediction,
}

/// A GEMV kernel's main loop as the model reads it: the loop with the most `op`, its
/// instructions, and the packed bytes (`.CONSTANT` loads) one lane loads per iteration.
struct GemvLoop<'a> {
    body: Vec<&'a Sass>,
    weight_bytes: usize,
}

fn gemv_loop<'a>(code: &'a [Sass], op: &str) -> Result<GemvLoop<'a>, String> {
    let body = loop_with_most(code, op)?;
    let packed = |i: &&&Sass| i.base() == "LDG" && i.op.contains("CONSTANT");
    let weight_bytes = body.iter().filter(packed).map(|i| access_bytes(&i.op)).sum();
    Ok(GemvLoop { body, weight_bytes })
}

/// How a GEMV launch is laid out, for the memory model.
struct GemvGrid {
    /// Warps per block, blocks, and the split of `in` the prediction reports.
    warps: u32,
    blocks: f64,
    split: usize,
    /// Packed loads each lane keeps in flight, in loop iterations.
    depth: usize,
    /// Warp instructions of the whole launch, and DRAM bytes beyond the counted ones.
    warp_instructions: f64,
    extra_bytes: f64,
}

/// The memory model of one GEMV launch of `kernel` over a packed `[out, inp]` weight of `format`
/// at `rows` rows: the packed bytes plus the activations are counted, the packed bytes read.
fn predict_packed_launch(
    res: &KernelResources,
    name: String,
    (format, shape, out, inp, rows): (QuantFormat, &'static str, usize, usize, usize),
    l: &GemvLoop<'_>,
    slots: f64,
    g: GemvGrid,
) -> Result<GemvPrediction, String> {
    let per_sm = occupancy(res.registers, g.warps * 32, res.smem_bytes) as f64;
    let warps_per_sm = (per_sm.min(g.blocks / h200::SMS) * g.warps as f64).round().max(1.0) as u32;
    let layout = QuantLayout::new(format, format.default_block(), out, inp).map_err(|e| e.to_string())?;
    let launch = MemoryLaunch {
        counted_bytes: layout.total_bytes() as f64 + 2.0 * rows as f64 * (inp + out) as f64,
        read_bytes: layout.total_bytes() as f64,
        harness_bytes: g.extra_bytes,
        warps_per_sm,
        bytes_in_flight_per_thread: (g.depth * l.weight_bytes) as f64,
        warp_instructions: g.warp_instructions,
    };
    Ok(GemvPrediction {
        kernel: name,
        shape,
        rows,
        split: g.split,
        bits_per_weight: layout.bits_per_weight(),
        warps_per_sm,
        weight_bytes_per_iteration: l.weight_bytes,
        bytes_in_flight_per_thread: launch.bytes_in_flight_per_thread,
        slots_per_iteration: slots,
        memory: predict_memory_launch(&H200, &launch),
    })
}

/// The model of `qgemv_<format>_bf16` over an `[out, inp]` weight at `rows` activation rows (1 to 16).
pub fn predict_gemv(
    format: QuantFormat,
    shape: &'static str,
    out: usize,
    inp: usize,
    rows: usize,
) -> Result<GemvPrediction, String> {
    let name = format!("qgemv_{}_bf16", format.name());
    let kernel = kernel_code("qlinear", &name)?;
    let l = gemv_loop(&kernel.code, "FFMA")?;
    // The chunk's loads and decode come first in the body; the first activation load starts the
    // 16 row blocks, each left early when the rows run out.
    let decode = l.body.iter().position(|i| i.base() == "LDG" && !i.op.contains("CONSTANT")).unwrap_or(l.body.len());
    let per_row = (l.body.len() - decode) as f64 / LLK_QGEMV_MAX_ROWS as f64;
    let slots = decode as f64 + rows as f64 * per_row;
    let split = gemv_split(out, inp);
    let iterations = (inp / 32).div_ceil(32 * split) as f64;
    let grid = GemvGrid {
        warps: LLK_QGEMV_WARPS,
        blocks: out.div_ceil(LLK_QGEMV_WARPS as usize / split) as f64,
        split,
        depth: LLK_QGEMV_DEPTH as usize,
        warp_instructions: (out * split) as f64 * iterations * slots,
        extra_bytes: 0.0,
    };
    predict_packed_launch(&kernel.resources, name, (format, shape, out, inp, rows), &l, slots, grid)
}

/// Weights one warp iteration of the tensor-core GEMV covers: 16 rows x one group of chunks.
pub const MMA_GEMV_WEIGHTS_PER_ITERATION: usize = 16 * LLK_QMMV_GROUP as usize * LLK_QUANT_CHUNK as usize;

/// The model of `qmmv_<format>_bf16` over an `[out, inp]` weight at `rows` activation rows (1 to 8).
pub fn predict_mma_gemv(
    format: QuantFormat,
    shape: &'static str,
    out: usize,
    inp: usize,
    rows: usize,
) -> Result<GemvPrediction, String> {
    if !has_mma_gemv(format, DType::BF16) || !(1..=MAX_MMA_GEMV_ROWS).contains(&rows) {
        return Err(format!("no tensor-core GEMV for {format} at {rows} rows"));
    }
    let name = format!("qmmv_{}_bf16", format.name());
    let kernel = kernel_code("qmmv", &name)?;
    let l = gemv_loop(&kernel.code, "HMMA")?;
    let slots = l.body.len() as f64;
    let k_splits = mma_gemv_splits(out, inp);
    let tiles = out.div_ceil(16);
    let groups = inp.div_ceil(LLK_QMMV_GROUP as usize * LLK_QUANT_CHUNK as usize) as f64;
    let grid = GemvGrid {
        warps: LLK_QMMV_WARPS,
        blocks: (tiles * k_splits) as f64,
        split: k_splits,
        depth: LLK_QMMV_DEPTH as usize,
        warp_instructions: tiles as f64 * groups * slots,
        // Split products write f32 partials and the reduce kernel reads them back.
        extra_bytes: if k_splits > 1 { 8.0 * (k_splits * rows * out) as f64 } else { 0.0 },
    };
    predict_packed_launch(&kernel.resources, name, (format, shape, out, inp, rows), &l, slots, grid)
}

/// Issue slots per 1024 weights of the tensor-core GEMV's loop and of the tensor-core GEMM's
/// (bf16; the GEMM's whole loop per 2048 weights, as in [`gemm_crossover_rows`]). The GEMV's
/// cost does not grow with the rows, so where it is the cheaper the GEMM takes over only past
/// its last row (`MAX_MMA_GEMV_ROWS + 1`).
pub fn mma_gemv_and_gemm_slots(format: QuantFormat) -> Result<(f64, f64), String> {
    let g = predict_mma_gemv(format, SHAPES[0].0, SHAPES[0].1, SHAPES[0].2, 1)?;
    let gemm = predict_gemm(format)?;
    let per = 1024.0 / MMA_GEMV_WEIGHTS_PER_ITERATION as f64;
    Ok((g.slots_per_iteration * per, gemm.slots_per_hmma * gemm.hmma as f64 / 2.0))
}

/// The first-order model of a tensor-core loop.
#[derive(Clone, Debug)]
pub struct MmaLoopPrediction {
    pub kernel: String,
    pub registers: u32,
    pub blocks_per_sm: u32,
    pub hmma: usize,
    pub slots_per_hmma: f64,
    pub smem_bytes_per_hmma: f64,
    /// SM clocks per HMMA under each limit.
    pub t_tensor: f64,
    pub t_smem: f64,
    pub t_issue: f64,
    pub bound: &'static str,
    /// At the tensor-loaded clock.
    pub tflops: f64,
}

/// The loop with the most HMMA of `kernel`, launched with `threads` threads and `dyn_smem` bytes.
pub fn predict_mma_loop(module: &str, name: &str, threads: u32, dyn_smem: u32) -> Result<MmaLoopPrediction, String> {
    let KernelCode { resources: res, code, .. } = kernel_code(module, name)?;
    let body = loop_with_most(&code, "HMMA")?;
    let hmma = body.iter().filter(|i| i.base() == "HMMA").count();
    // Shared-memory bytes per warp: ldmatrix.x4 512, cp.async 16 per lane, LDS/STS by width.
    let smem: f64 = body
        .iter()
        .map(|i| match i.base() {
            "LDSM" if i.op.contains(".4") => 512.0,
            "LDSM" if i.op.contains(".2") => 256.0,
            "LDSM" => 128.0,
            "LDGSTS" => 512.0,
            "LDS" | "STS" => 32.0 * access_bytes(&i.op) as f64,
            _ => 0.0,
        })
        .sum();
    let per = hmma.max(1) as f64;
    let (slots_per_hmma, smem_bytes_per_hmma) = (body.len() as f64 / per, smem / per);
    let [t_tensor, t_smem, t_issue] = h200::mma_limits(slots_per_hmma, smem_bytes_per_hmma);
    let worst = t_tensor.max(t_smem).max(t_issue);
    let bound = if worst == t_tensor {
        "tensor"
    } else if worst == t_smem {
        "shared memory"
    } else {
        "issue"
    };
    Ok(MmaLoopPrediction {
        kernel: name.to_string(),
        registers: res.registers,
        blocks_per_sm: occupancy(res.registers, threads, res.smem_bytes + dyn_smem),
        hmma,
        slots_per_hmma,
        smem_bytes_per_hmma,
        t_tensor,
        t_smem,
        t_issue,
        bound,
        tflops: 4096.0 / worst * h200::SMS * h200::TENSOR_CLOCK_GHZ * 1e9 / 1e12,
    })
}

/// `qgemm_<format>_bf16`'s loop.
pub fn predict_gemm(format: QuantFormat) -> Result<MmaLoopPrediction, String> {
    let kernel = format!("qgemm_{}_bf16", format.name());
    predict_mma_loop("qlinear", &kernel, LLK_QGEMM_THREADS, super::declared_smem(&kernel)?)
}

/// `qgemm_dx_<format>_bf16`'s loop: the input gradient `dx = dy W` (the same kernel with W's
/// dimensions exchanged, its weight tile read with ldmatrix.trans).
pub fn predict_gemm_input_grad(format: QuantFormat) -> Result<MmaLoopPrediction, String> {
    let kernel = format!("qgemm_dx_{}_bf16", format.name());
    predict_mma_loop("qlinear", &kernel, LLK_QGEMM_THREADS, super::declared_smem(&kernel)?)
}

/// The dense peer's loop ([`DENSE_PEER`]).
pub fn predict_dense_peer() -> Result<MmaLoopPrediction, String> {
    use llama_kernels::dev::geometry::params::LLK_MOE_GEMM_THREADS;
    predict_mma_loop(DENSE_PEER.0, DENSE_PEER.1, LLK_MOE_GEMM_THREADS, super::declared_smem(DENSE_PEER.1)?)
}

/// Rows at which the tensor-core GEMM's main loop costs fewer issue slots per weight than the
/// GEMV's (bf16): the GEMV pays its decode once and each row's fmas and unpacking
/// (`decode + rows x per_row` slots per 1024 weights, one warp iteration), the GEMM its whole
/// loop per 2048 weights (a warp's share of a 128 x 64 step, every HMMA counted: an upper bound
/// for rows a block does not fill).
pub fn gemm_crossover_rows(format: QuantFormat) -> Result<f64, String> {
    let one = predict_gemv(format, SHAPES[0].0, SHAPES[0].1, SHAPES[0].2, 1)?;
    let two = predict_gemv(format, SHAPES[0].0, SHAPES[0].1, SHAPES[0].2, 2)?;
    let per_row = two.slots_per_iteration - one.slots_per_iteration;
    let decode = one.slots_per_iteration - per_row;
    let gemm = predict_gemm(format)?;
    let gemm_per_1024 = gemm.slots_per_hmma * gemm.hmma as f64 / 2.0;
    Ok((gemm_per_1024 - decode) / per_row.max(1e-9))
}

/// One GEMV row of the report's tables.
fn gemv_row(g: &GemvPrediction, rows: &str) -> String {
    format!(
        "  {:<16} {:<19} {:>4} {:>5} {:>5.2} {:>6} {:>5}B {:>8.0}% {:>7.0}%  {}\n",
        g.kernel,
        g.shape,
        rows,
        g.split,
        g.bits_per_weight,
        g.warps_per_sm,
        g.bytes_in_flight_per_thread,
        100.0 * g.memory.steady_fraction,
        100.0 * g.memory.fraction_of_copy,
        g.memory.bound
    )
}

/// The report's section on the packed kernels.
pub fn qlinear_text() -> String {
    let mut s = String::from(
        "Packed linear layers (bf16 activations, Llama 3 8B projections) -- a MODEL, not a measurement.\n\
         GEMV: the memory model above on the packed bytes; issue from the main loop's decode and the\n\
         row blocks that run.\n",
    );
    s += &format!(
        "  {:<16} {:<19} {:>4} {:>5} {:>5} {:>6} {:>7} {:>9} {:>8}  bound\n",
        "kernel", "shape", "rows", "split", "bits", "warps", "flight", "steady", "w/launch"
    );
    for format in QuantFormat::ALL {
        for &(shape, out, inp) in &SHAPES {
            for rows in [1, 16] {
                match predict_gemv(format, shape, out, inp, rows) {
                    Ok(g) => s += &gemv_row(&g, &rows.to_string()),
                    Err(e) => s += &format!("  qgemv {format} {shape}: cannot analyze: {e}\n"),
                }
            }
        }
    }
    s += "  steady: of copy bandwidth on the packed bytes plus activations, without the launch latency\n\
          \x20 (a CUDA graph hides most of it); w/launch: with the model's 4 us.\n\
          Tensor-core GEMV (bf16, the formats that have it; 1 to 8 rows cost the same issue slots;\n\
          split: of `in` over the grid, f32 partials counted as extra DRAM bytes, the reduce launch not):\n";
    s += &format!(
        "  {:<16} {:<19} {:>4} {:>5} {:>5} {:>6} {:>7} {:>9} {:>8}  bound\n",
        "kernel", "shape", "rows", "split", "bits", "warps", "flight", "steady", "w/launch"
    );
    for format in QuantFormat::ALL.into_iter().filter(|&f| has_mma_gemv(f, DType::BF16)) {
        for &(shape, out, inp) in &SHAPES {
            match predict_mma_gemv(format, shape, out, inp, 1) {
                Ok(g) => s += &gemv_row(&g, "1-8"),
                Err(e) => s += &format!("  qmmv {format} {shape}: cannot analyze: {e}\n"),
            }
        }
        if let Ok((gemv, gemm)) = mma_gemv_and_gemm_slots(format) {
            s += &format!(
                "    {format}: {gemv:.0} issue slots per 1024 weights (the CUDA-core GEMV's at 1 row: {:.0}; the GEMM loop's: {gemm:.0})\n",
                predict_gemv(format, SHAPES[0].0, SHAPES[0].1, SHAPES[0].2, 1)
                    .map(|g| g.slots_per_iteration)
                    .unwrap_or(f64::NAN)
            );
        }
    }
    s += "GEMM (prefill, and the input gradient dx = dy W as qgemm_dx_; first order at the tensor-loaded clock,\n\
          \x20 next to our dense mma.sync GEMM):\n";
    let peer = predict_dense_peer();
    let mut rows: Vec<Result<MmaLoopPrediction, String>> = vec![peer.clone()];
    rows.extend(QuantFormat::ALL.iter().map(|&f| predict_gemm(f)));
    rows.extend(QuantFormat::ALL.iter().map(|&f| predict_gemm_input_grad(f)));
    for r in rows {
        match r {
            Ok(p) => {
                let ratio = peer.as_ref().map(|d| p.tflops / d.tflops).unwrap_or(f64::NAN);
                s += &format!(
                    "  {:<36} {:>3} regs {} blocks/SM, {:>3} HMMA/loop, {:>5.2} slots and {:>4.0} B smem per HMMA; \
                     {} bound, {:>4.0} TFLOP/s ({:.0}% of the dense kernel)\n",
                    p.kernel,
                    p.registers,
                    p.blocks_per_sm,
                    p.hmma,
                    p.slots_per_hmma,
                    p.smem_bytes_per_hmma,
                    p.bound,
                    p.tflops,
                    100.0 * ratio
                );
            }
            Err(e) => s += &format!("  cannot analyze: {e}\n"),
        }
    }
    s += "  Crossover (issue slots per weight, bf16): the GEMM's loop beats the CUDA-core GEMV's from about\n";
    for format in QuantFormat::ALL {
        if let Ok(r) = gemm_crossover_rows(format) {
            s += &format!("    {format}: {r:.1} rows\n");
        }
    }
    s += &format!(
        "  so bf16/f16 products of {} rows or more take the GEMM where there is no tensor-core GEMV, and of {}\n\
         \x20 or more where there is one (split along `in` up to one row block).\n",
        llama_kernels::ops::qlinear::GEMM_FROM_ROWS,
        MAX_MMA_GEMV_ROWS + 1
    );
    s += "  Left out: the weight-load chain (issued a step ahead), waves and tails, the weight's L2 rereads.\n\n";
    s
}
