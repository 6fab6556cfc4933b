//! The H200 resource model (SXM, compute capability 9.0).

/// Streaming multiprocessors.
pub const SMS: f64 = 132.0;
/// Sustained SM clock under load (GHz); 1.98 was read right after matrix work, 1.83 is the
/// conservative figure used here.
pub const CLOCK_GHZ: f64 = 1.83;
/// Warp instructions issued per SM per clock (4 schedulers).
pub const ISSUE_PER_CLK: f64 = 4.0;
/// Device-to-device copy bandwidth measured on an H200 of this workplace (bytes read plus
/// written per second; the datasheet's 4.8 TB/s is not reached by a copy).
pub const COPY_BYTES_PER_S: f64 = 4.3e12;
/// Shared-memory bandwidth per SM (bytes per clock).
pub const SMEM_BYTES_PER_CLK: f64 = 128.0;
/// Dense bf16 tensor rate for mma.sync (m16n8k16 HMMA per SM per clock): about 63% of the
/// 990 TFLOP/s wgmma peak, which mma.sync cannot reach on Hopper.
pub const HMMA_PER_CLK: f64 = 990e12 * 0.63 / 4096.0 / (SMS * CLOCK_GHZ * 1e9);
pub const REGS_PER_SM: u32 = 65536;
pub const MAX_THREADS_PER_SM: u32 = 2048;
pub const MAX_BLOCKS_PER_SM: u32 = 32;
/// Shared memory per SM usable by blocks, and the per-block reservation.
pub const SMEM_PER_SM: u32 = 228 * 1024;
pub const SMEM_RESERVED_PER_BLOCK: u32 = 1024;
/// Global-memory latency the loads in flight must cover (ns).
pub const DRAM_LATENCY_NS: f64 = 600.0;

// The matrix-loop model's second-order terms (issue 19). Same GH100 die as the H100 SXM the
// calibration peers were measured on: 132 SMs, 4 sub-partitions (SMSPs) each.
/// Sub-partitions per SM: one scheduler, one tensor pipe, one MUFU quad each.
pub const SMSPS: f64 = 4.0;
/// Sustained SM clock of a tensor-saturated GH100 at its 700 W power cap (GHz), the clock the
/// matrix model runs at (the datasheet's 1.83-1.98 GHz is not held under tensor load). An
/// assumption taken from issue 19; the calibration cannot separate it from the phase term
/// (see `matrix_model`).
pub const TENSOR_CLOCK_GHZ: f64 = 1.36;
/// MUFU (ex2, rcp) results per SM per clock (CUDA programming guide, arithmetic instruction
/// throughput, compute capability 9.0): 4 lanes per SMSP, 8 clocks per warp instruction.
pub const MUFU_PER_CLK: f64 = 16.0;
/// Latency of the last mma.sync of a GEMM until its accumulators can be read (clocks).
pub const HMMA_LATENCY_CLK: f64 = 33.0;
/// Latency of one SHFL step of a row reduction (clocks); a row maximum takes two.
pub const SHFL_LATENCY_CLK: f64 = 24.0;
/// Cost of one block barrier on a warp's chain (clocks).
pub const BAR_LATENCY_CLK: f64 = 30.0;
/// Launch and first-wave ramp of one kernel (microseconds).
pub const LAUNCH_US: f64 = 4.0;
/// A block's prologue (Q load) and epilogue (normalize, O store), in main-loop tiles.
pub const BLOCK_OVERHEAD_TILES: f64 = 1.0;

// The wgmma model's terms (issue 20, `wgmma_model`).
/// Dense 16-bit wgmma FLOPs per SM per clock: the datasheet's 989 TFLOP/s is 132 SMs x 4096 at
/// 1.83 GHz ([`CLOCK_GHZ`], the clock the wgmma model runs at).
pub const WGMMA_FLOPS_PER_CLK: f64 = 4096.0;
/// The part of a consumer warpgroup's chain (its softmax issue slots or its MUFU time) that the
/// ping-pong and the in-warpgroup overlap do not hide, net of the latencies the counts leave out.
/// Fitted: the minimax value over FlashAttention-3's three non-causal 16k figures
/// (`perf::wgmma_calibration`, asserted in `tests/inspect/perf_report/`).
pub const WGMMA_EXPOSED_CHAIN: f64 = 0.85;

/// Blocks per SM from registers, threads and shared memory (sm_90 allocation rules: registers
/// per warp in units of 256).
pub fn occupancy(regs: u32, threads: u32, smem: u32) -> u32 {
    let warps = threads.div_ceil(32).max(1);
    let regs_per_warp = (regs.max(1) * 32).div_ceil(256) * 256;
    let by_regs = REGS_PER_SM / (regs_per_warp * warps);
    let by_threads = MAX_THREADS_PER_SM / (warps * 32);
    let by_smem = if smem == 0 { u32::MAX } else { SMEM_PER_SM / (smem + SMEM_RESERVED_PER_BLOCK) };
    by_regs.min(by_threads).min(by_smem).min(MAX_BLOCKS_PER_SM)
}

/// SM clocks per HMMA of a tensor-core loop under each first-order limit: the tensor rate, the
/// shared-memory bandwidth (bytes per HMMA) and the issue rate (slots per HMMA).
pub fn mma_limits(slots_per_hmma: f64, smem_bytes_per_hmma: f64) -> [f64; 3] {
    [1.0 / HMMA_PER_CLK, smem_bytes_per_hmma / SMEM_BYTES_PER_CLK, slots_per_hmma / ISSUE_PER_CLK]
}
