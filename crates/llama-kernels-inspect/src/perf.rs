//! The static performance report: what the sm_90 SASS of each kernel predicts on an H200.
//!
//! **A model, not a measurement.** It reads the embedded cubins (disassembled with `cuobjdump`)
//! and the `ptxas -v` reports, and for each kernel of interest prints its resources, the
//! occupancy they allow, the instruction mix of its hot region, and the bound that mix predicts
//! against an H200 resource model (the constants below, good to about 15%). Tests assert the
//! thresholds the kernels were tuned to (`tests/inspect/perf_report/`), so a change that loses a lever
//! fails CI on a machine without a GPU.
//!
//! Regions. Memory-bound kernels: the main loop (the body of the last backward branch) when the
//! kernel streams through rows, or the straight-line code outside every loop when each thread
//! handles a fixed amount (RMSNorm keeps its row in registers; its tail loop runs only for rows
//! longer than the cache). Elements per region = 128-bit stores in the region x elements per
//! vector / stores per element, so "issue slots per element" is the cost of the code as written,
//! assuming every unrolled slot is active. Matrix kernels: the loop with the most HMMA.

pub use super::attention_model::{
    LaunchPrediction, LoopCounts, MatrixModel, OUR_PREFILL, Workload, matrix_model, predict_launch, schedule_efficiency,
};
pub use super::h200;
pub use super::h200::occupancy;
pub use super::hopper_report::{
    FA3_FIXTURE, OurHopperKernel, WgmmaCalibration, fa3_kernels, hopper_text, our_hopper_kernels, peer_wgmma_loops,
    wgmma_calibration,
};
pub use super::kernel_spec::{Region, SPECS, Spec};
pub use super::memory_model::{
    H100_SXM, H200, LLMC_FIXTURE, MemoryCalibration, MemoryGpu, MemoryLaunch, MemoryPrediction, PeerMemoryCounts,
    memory_calibration, memory_calibration_text, peer_memory_counts, predict_memory_launch,
};
use super::memory_model::{memory_text, predict_memory};
use super::sass::{Mix, Sass, cold_addresses, cold_ranges, disassemble, hot_path, loads_in_flight, loops};
use super::{KernelCode, KernelResources, kernel_code};

/// What the report says about one kernel.
#[derive(Clone, Debug)]
pub struct KernelPerf {
    pub spec: Spec,
    pub resources: KernelResources,
    /// The dynamic shared memory of its launches: its declaration.
    pub dyn_smem: u32,
    pub blocks_per_sm: u32,
    pub warps_per_sm: u32,
    /// The region's mix; for a matrix kernel with marked cold paths, its hot path.
    pub mix: Mix,
    /// The whole loop, cold paths included (matrix kernels with marked cold paths).
    pub whole_loop: Option<Mix>,
    /// Memory-bound: elements per region and issue slots per element; loads in flight.
    pub elements: f64,
    pub slots_per_elem: f64,
    pub loads_in_flight: usize,
    /// Matrix: issue slots and shared-memory bytes per HMMA.
    pub slots_per_hmma: f64,
    pub smem_bytes_per_hmma: f64,
    /// Matrix: the loop's counts, the second-order model of its loop and the launch prediction
    /// for `OUR_PREFILL`.
    pub counts: Option<LoopCounts>,
    pub matrix: Option<MatrixModel>,
    pub prefill: Option<LaunchPrediction>,
    /// Memory-bound: the launch model's prediction for the reference launch.
    pub memory: Option<MemoryPrediction>,
    /// The predicted bound and the predicted fraction of its ceiling the kernel reaches.
    pub bound: &'static str,
    pub predicted: String,
    /// The headline prediction as a number, in `predicted_unit`: the fraction of copy bandwidth
    /// (memory-bound) or the TFLOP/s of the reference launch (matrix).
    pub predicted_value: f64,
    pub predicted_unit: &'static str,
    /// Matrix: the main loop's TFLOP/s at the tensor clock.
    pub predicted_loop_tflops: Option<f64>,
}

/// Analyzes one kernel.
pub fn analyze(spec: &Spec) -> Result<KernelPerf, String> {
    let KernelCode { resources, code, cubin } = kernel_code(spec.module, spec.kernel)?;
    let (region, whole_loop) = region_of(spec, cubin, &code)?;
    let mix = Mix::of(region.iter().copied());
    let dyn_smem = spec.dyn_smem()?;
    let smem = resources.smem_bytes + dyn_smem;
    let blocks_per_sm = occupancy(resources.registers, spec.threads, smem);
    let warps_per_sm = blocks_per_sm * spec.threads.div_ceil(32);
    let lif = loads_in_flight(&code);
    let (mut elements, mut slots_per_elem, mut slots_per_hmma, mut smem_per_hmma) = (0.0, 0.0, 0.0, 0.0);
    let (mut counts, mut matrix, mut prefill, mut memory, mut loop_tflops) = (None, None, None, None, None);
    let (bound, predicted, predicted_value, predicted_unit) = if let Region::MatrixLoop = spec.region {
        let c = LoopCounts::of(region.iter().copied());
        let model = matrix_model(&c, warps_per_sm);
        let launch = predict_launch(&model, &OUR_PREFILL, blocks_per_sm);
        (counts, matrix, prefill) = (Some(c), Some(model), Some(launch));
        let p = predict_matrix(&region, &mix, &model, &launch);
        (slots_per_hmma, smem_per_hmma, loop_tflops) = (p.2, p.3, Some(p.4));
        (p.0, p.1, p.5, "TFLOP/s")
    } else {
        let (p, e, slots) = predict_memory(spec, &mix, warps_per_sm, &code);
        (elements, slots_per_elem, memory) = (e, slots, Some(p));
        (p.bound, memory_text(&p), p.fraction_of_copy, "fraction of copy bandwidth")
    };
    Ok(KernelPerf {
        spec: *spec,
        resources,
        dyn_smem,
        blocks_per_sm,
        warps_per_sm,
        mix,
        whole_loop,
        elements,
        slots_per_elem,
        loads_in_flight: lif,
        slots_per_hmma,
        smem_bytes_per_hmma: smem_per_hmma,
        counts,
        matrix,
        prefill,
        memory,
        bound,
        predicted,
        predicted_value,
        predicted_unit,
        predicted_loop_tflops: loop_tflops,
    })
}

/// The analyzed region of `code` (and, for a matrix kernel with marked cold paths, the whole loop
/// beside its hot path).
fn region_of<'a>(spec: &Spec, cubin: &[u8], code: &'a [Sass]) -> Result<(Vec<&'a Sass>, Option<Mix>), String> {
    let loops = loops(code);
    let in_loop = |a: u32| loops.iter().any(|&(s, e)| (s..=e).contains(&a));
    let region: Vec<&Sass> = match spec.region {
        Region::StraightLine => code.iter().filter(|i| !in_loop(i.addr)).collect(),
        Region::LastLoop => {
            let (s, e) = loops.iter().max_by_key(|l| l.1).copied().ok_or("no loop")?;
            code.iter().filter(|i| (s..=e).contains(&i.addr)).collect()
        }
        Region::MatrixLoop => {
            let hmma_in =
                |&(s, e): &(u32, u32)| code.iter().filter(|i| (s..=e).contains(&i.addr) && i.base() == "HMMA").count();
            let (s, e) = loops.iter().max_by_key(|l| hmma_in(l)).copied().ok_or("no loop")?;
            code.iter().filter(|i| (s..=e).contains(&i.addr)).collect()
        }
    };
    // Matrix kernels with marked cold paths: the hot path (what an interior tile of the reference
    // shape runs) is the loop without the instructions compiled from cold lines.
    Ok(match (spec.region, spec.cold_source) {
        (Region::MatrixLoop, Some(source)) => {
            let cold = cold_addresses(cubin, spec.kernel, &format!("{}.cu", spec.module), &cold_ranges(source))?;
            let whole = Mix::of(region.iter().copied());
            (hot_path(&region, &cold), Some(whole))
        }
        _ => (region, None),
    })
}

/// The bound of a matrix kernel's hot loop: tensor, shared memory or issue, in clocks per HMMA.
/// Returns (bound, prediction, issue slots per HMMA, shared-memory bytes per HMMA, main-loop
/// TFLOP/s, TFLOP/s of the reference launch).
fn predict_matrix(
    region: &[&Sass],
    mix: &Mix,
    model: &MatrixModel,
    launch: &LaunchPrediction,
) -> (&'static str, String, f64, f64, f64, f64) {
    let hmma = mix.hmma.max(1) as f64;
    let slots_per_hmma = mix.total as f64 / hmma;
    // ldmatrix.x4: 512 bytes per warp; cp.async 16 bytes per lane; LDS/STS 128 bytes per warp
    // (a lower bound: 32-bit accesses).
    let ldsm_bytes: f64 = region
        .iter()
        .filter(|i| i.base() == "LDSM")
        .map(|i| {
            if i.op.contains(".4") {
                512.0
            } else if i.op.contains(".2") {
                256.0
            } else {
                128.0
            }
        })
        .sum();
    let smem_per_hmma = (ldsm_bytes + 512.0 * mix.ldgsts as f64 + 128.0 * (mix.lds + mix.sts) as f64) / hmma;
    // Clocks per HMMA per SM under each limit (the SM interleaves its warps).
    let [t_tensor, t_smem, t_issue] = h200::mma_limits(slots_per_hmma, smem_per_hmma);
    let worst = t_tensor.max(t_smem).max(t_issue);
    let bound = if worst == t_smem {
        "shared memory"
    } else if worst == t_issue || model.issue_clk >= model.period_lockstep {
        "issue"
    } else {
        "tensor, less the softmax chain"
    };
    // Second order (issue 19): the softmax chain the SMSP's warps do not hide, at the tensor clock.
    let smem_cap = model.loop_tflops * (t_tensor / worst);
    (
        bound,
        format!(
            "about {:.0} TFLOP/s in the main loop at {:.2} GHz ({:.0}% of the mma.sync rate at that clock: {:.0} clk of \
             softmax chain per {:.0} clk of tensor work, {:.0} warps per SMSP in lockstep; independent phases would \
             give {:.0}), {:.0} TFLOP/s for {} (schedule {:.0}% busy); first order at {:.2} GHz: {:.0} TFLOP/s",
            smem_cap,
            h200::TENSOR_CLOCK_GHZ,
            100.0 * model.utilization * (t_tensor / worst),
            model.chain_clk,
            model.gemm_clk,
            model.warps_per_smsp,
            model.loop_tflops_independent * (t_tensor / worst),
            launch.tflops * (t_tensor / worst),
            "the 16k causal prefill",
            100.0 * launch.schedule,
            h200::CLOCK_GHZ,
            4096.0 / worst * h200::SMS * h200::CLOCK_GHZ * 1e9 / 1e12,
        ),
        slots_per_hmma,
        smem_per_hmma,
        smem_cap,
        launch.tflops * (t_tensor / worst),
    )
}

/// A published measurement of a peer kernel compiled here (tests/fixtures/perf/).
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    pub peer: String,
    pub workload: Workload,
    pub source: String,
    pub published_tflops: f64,
    pub predicted: LaunchPrediction,
    /// Independent-phase upper bound for the same launch.
    pub predicted_independent_tflops: f64,
    /// (predicted - published) / published.
    pub error: f64,
}

/// The FA2 hd128 forward peer: its main-loop counts and resources, read from its sm_90 SASS with
/// this module's code (`tests/inspect/perf_report/`, `regenerate_peer_counts`), and its published
/// figures.
pub const FA2_FIXTURE: &str = include_str!("../tests/fixtures/perf/fa2_hd128_bf16_fwd_sm90.json");

/// The calibration table: every published figure of every peer against the model.
pub fn calibration() -> Result<Vec<Calibration>, String> {
    let v: serde_json::Value = serde_json::from_str(FA2_FIXTURE).map_err(|e| format!("fixture: {e}"))?;
    let mut out = Vec::new();
    for k in v["kernels"].as_array().ok_or("fixture: no kernels")? {
        let n = |f: &str| k["main_loop"][f].as_u64().map(|x| x as usize).ok_or(format!("fixture: no main_loop.{f}"));
        let counts = LoopCounts {
            total: n("total")?,
            hmma: n("hmma")?,
            ldsm: n("ldsm")?,
            ldgsts: n("ldgsts")?,
            mufu: n("mufu")?,
            shfl: n("shfl")?,
            bar: n("bar")?,
            fp32: n("fp32")?,
        };
        let num = |f: &str| k[f].as_u64().map(|x| x as u32).ok_or(format!("fixture: no {f}"));
        let blocks = occupancy(num("registers")?, num("threads")?, num("smem_bytes")?);
        let model = matrix_model(&counts, blocks * num("threads")?.div_ceil(32));
        let causal = k["causal"].as_bool().ok_or("fixture: no causal")?;
        for p in k["published"].as_array().ok_or("fixture: no published")? {
            let u = |f: &str| p[f].as_u64().map(|x| x as usize).ok_or(format!("fixture: no published.{f}"));
            let w = Workload {
                seq: u("seq")?,
                batch: u("batch")?,
                heads: u("heads")?,
                head_dim: 128,
                causal,
                heaviest_first: false,
            };
            let published = p["tflops"].as_f64().ok_or("fixture: no tflops")?;
            let predicted = predict_launch(&model, &w, blocks);
            let independent = MatrixModel { period_lockstep: model.period_independent, ..model };
            out.push(Calibration {
                peer: k["name"].as_str().unwrap_or("?").to_string(),
                workload: w,
                source: p["source"].as_str().unwrap_or("?").to_string(),
                published_tflops: published,
                predicted,
                predicted_independent_tflops: predict_launch(&independent, &w, blocks).tflops,
                error: (predicted.tflops - published) / published,
            });
        }
    }
    Ok(out)
}

/// The main-loop counts of the matrix loop (the loop with the most HMMA) of `kernel` in an
/// external sm_90 cubin (a peer compiled here), read with the report's code.
pub fn peer_loop_counts(cubin: &[u8], kernel: &str) -> Result<LoopCounts, String> {
    let code = disassemble(cubin, kernel)?;
    let spec = Spec { region: Region::MatrixLoop, cold_source: None, ..SPECS[SPECS.len() - 1] };
    let (region, _) = region_of(&spec, cubin, &code)?;
    Ok(LoopCounts::of(region.iter().copied()))
}

/// Our prefill attention kernel's calibrated matrix model and blocks per SM, for the layer model
/// (read from the SASS once).
pub fn prefill_attention_model() -> Result<(MatrixModel, u32), String> {
    static MODEL: std::sync::OnceLock<Result<(MatrixModel, u32), String>> = std::sync::OnceLock::new();
    MODEL
        .get_or_init(|| {
            let spec = SPECS.iter().find(|s| s.kernel == "attention_hd128_bf16").ok_or("no attention spec")?;
            let k = analyze(spec)?;
            Ok((k.matrix.ok_or("attention has no matrix model")?, k.blocks_per_sm))
        })
        .clone()
}

/// The report as text.
pub fn report() -> String {
    let mut s = String::from(
        "Static performance report (sm_90 SASS, H200 resource model) -- a MODEL, not a measurement.\n\
         Model: 132 SMs at 1.83 GHz, 4 issue/clk/SM, copy 4.3 TB/s, shared memory 128 B/clk/SM,\n\
         mma.sync at 63% of the 990 TFLOP/s dense bf16 peak. Memory-bound kernels (calibrated on\n\
         llm.c's LayerNorm, table at the end): a 4 us launch latency plus the slowest of DRAM (the\n\
         bytes at the copy bandwidth), latency (Little's law: the bytes the resident threads keep in\n\
         flight over a 600 ns DRAM latency) and issue, over a 16k-token launch, with no loss from\n\
         imperfect overlap (no tail or L2 term: the inputs exceed L2), so real kernels land at or\n\
         below these figures. Matrix kernels: the hot path is the loop without the\n\
         source lines marked cold (masking of tiles that cross a boundary, paged K/V), which an\n\
         interior tile of the shape does not run; the whole loop, every path, is printed above it.\n\
         Matrix kernels, second order (calibrated on FlashAttention-2, table at the end): the\n\
         tensor-loaded clock (1.36 GHz at the power cap), each warp's chain between its two GEMMs\n\
         (HMMA drain, row maximum over SHFL, ex2 on the MUFU quad at 16/clk/SM overlapping the\n\
         softmax's issue slots, barriers), the SMSP's warps in lockstep (none hides another's\n\
         chain), the issue slots of all warps on one scheduler, and the launch: wave quantization\n\
         and causal tail by greedy dispatch of the row blocks, prologue/epilogue, launch latency.\n\n",
    );
    for spec in SPECS {
        match analyze(spec) {
            Ok(k) => {
                let r = &k.resources;
                s += &format!("{} ({}): {}\n", k.spec.kernel, k.spec.module, k.spec.shape);
                s += &format!(
                    "  resources: {} registers, {} B smem (+{} dynamic), {}/{} spill st/ld; {} blocks/SM x {} threads = {} warps/SM\n",
                    r.registers,
                    r.smem_bytes,
                    k.dyn_smem,
                    r.spill_stores,
                    r.spill_loads,
                    k.blocks_per_sm,
                    k.spec.threads,
                    k.warps_per_sm
                );
                let line = |what: &str, m: &Mix| {
                    format!(
                        "  {what}: {} instructions; HMMA {}, LDSM {}, LDGSTS {}, LDG {}, STG {}, LDS {}, STS {}, MUFU {}, local {} ({} stores)\n",
                        m.total,
                        m.hmma,
                        m.ldsm,
                        m.ldgsts,
                        Mix::widths(&m.ldg),
                        Mix::widths(&m.stg),
                        m.lds,
                        m.sts,
                        m.mufu,
                        m.local,
                        m.local_stores
                    )
                };
                let region = match k.spec.region {
                    Region::StraightLine => "straight-line region",
                    Region::LastLoop => "main-loop region",
                    Region::MatrixLoop if k.whole_loop.is_some() => "matrix-loop hot path (interior tile)",
                    Region::MatrixLoop => "matrix-loop region",
                };
                if let Some(whole) = &k.whole_loop {
                    s += &line("matrix-loop region (every path)", whole);
                }
                s += &line(region, &k.mix);
                let m = &k.mix;
                if let Region::MatrixLoop = k.spec.region {
                    s += &format!(
                        "  per HMMA: {:.2} issue slots, {:.0} B of shared memory; HMMA per LDSM {:.2}\n",
                        k.slots_per_hmma,
                        k.smem_bytes_per_hmma,
                        m.hmma as f64 / m.ldsm.max(1) as f64
                    );
                } else {
                    s += &format!(
                        "  per element: {:.1} issue slots, {} bytes moved; {} 128-bit loads in flight per thread at start\n",
                        k.slots_per_elem, k.spec.bytes_per_elem, k.loads_in_flight
                    );
                }
                s += &format!("  bound: {}; predicted {}\n\n", k.bound, k.predicted);
            }
            Err(e) => s += &format!("{}: cannot analyze: {e}\n\n", spec.kernel),
        }
    }
    s += &hopper_text(prefill_attention_model().ok());
    s += &super::qlinear_model::qlinear_text();
    s += &super::backward_model::backward_text();
    s += &super::coverage::coverage_text();
    s += "Shared memory per architecture (bytes per block; per GPU: blocks per SM by shared memory, \
          and for attention whether the op uses that configuration there):\n";
    match super::smem::table() {
        Ok(t) => s += &t,
        Err(e) => s += &format!("  cannot read the ptxas reports: {e}\n"),
    }
    s += &super::layer_model::layer_text(prefill_attention_model());
    s += &calibration_text();
    s += &memory_calibration_text();
    s += "No GPU measurement exists for these kernels yet: when benches/results holds a GPU run, compare\n\
          its fractions of copy bandwidth and TFLOP/s with the predictions above.\n";
    s
}

/// The calibration table and what the evidence cannot separate.
pub fn calibration_text() -> String {
    let mut s = String::from(
        "Calibration: peers compiled here with the same nvcc, read with this report's code\n\
         (tests/fixtures/perf/), against published H100 SXM figures (same GH100 SM as the H200).\n",
    );
    match calibration() {
        Ok(rows) => {
            s += &format!(
                "  {:<34} {:>6} {:>5} {:>9} {:>9} {:>7} {:>11}  source\n",
                "peer", "seq", "batch", "published", "predicted", "error", "independent"
            );
            for r in &rows {
                s += &format!(
                    "  {:<34} {:>6} {:>5} {:>9.0} {:>9.0} {:>+6.1}% {:>11.0}  {}\n",
                    r.peer,
                    r.workload.seq,
                    r.workload.batch,
                    r.published_tflops,
                    r.predicted.tflops,
                    100.0 * r.error,
                    r.predicted_independent_tflops,
                    r.source
                );
            }
        }
        Err(e) => s += &format!("  cannot calibrate: {e}\n"),
    }
    let ratio = |rows: &[Calibration], seq: usize, pick: &dyn Fn(&Calibration) -> f64| {
        let at = |causal: bool| rows.iter().find(|r| r.workload.seq == seq && r.workload.causal == causal).map(pick);
        at(true).zip(at(false)).map(|(c, n)| c / n)
    };
    let rows = calibration().unwrap_or_default();
    let shape = [16384, 8192]
        .iter()
        .filter_map(|&seq| {
            let p = ratio(&rows, seq, &|r| r.published_tflops)?;
            let m = ratio(&rows, seq, &|r| r.predicted.tflops)?;
            Some(format!("{}k: predicted {m:.2}, published {p:.2}", seq / 1024))
        })
        .collect::<Vec<_>>()
        .join("; ");
    // The clock at which independent phases would match each figure (the model scales with it).
    let clocks: Vec<f64> =
        rows.iter().map(|r| h200::TENSOR_CLOCK_GHZ * r.published_tflops / r.predicted_independent_tflops).collect();
    let (lo, hi) = clocks.iter().fold((f64::INFINITY, 0.0f64), |(a, b), &c| (a.min(c), b.max(c)));
    s += "  TFLOP/s as the benchmarks count them; \"independent\": the same model with the SMSP's warps\n\
          \x20 in independent phases, hiding part of each other's chain (an upper bound).\n\
          What the evidence cannot separate: one published figure per launch fixes the product of the\n\
          clock and the loop's efficiency, not each. At 1.36 GHz the figures sit at the lockstep bound,\n\
          the model's worst case for hiding; independent phases would match them only at ";
    s += &format!("{lo:.2}-{hi:.2} GHz");
    s += ";\n\
          a higher sustained clock (an mma.sync loop may draw less power than wgmma) would need a loss\n\
          the model does not have (an mma.sync rate below the 63% assumed, HMMA operand conflicts with\n\
          the softmax's FP32 work). The causal/non-causal ratio does not depend on that product (the\n\
          light-first row blocks leave a tail): ";
    s += &shape;
    s += ".\n\
          Left out: L2 and HBM traffic of K/V (reread once per row block, hidden at these shapes), the\n\
          masked diagonal tiles' extra instructions, register-bank and operand-collector conflicts of\n\
          HMMA with FP32 work beyond issue slots, clock variation within a run.\n\n";
    s
}

/// On a CUDA device: each kernel's blocks per SM from the driver's occupancy calculator (after
/// the same shared-memory opt-in and carveout a launch sets) next to the model's; `None` on the
/// emulated target.
pub fn driver_occupancy(device: &llama_kernels::Device) -> Option<String> {
    if device.target() != llama_kernels::backend::Target::Cuda {
        return None;
    }
    let mut s = String::from("Occupancy on this device (cuOccupancyMaxActiveBlocksPerMultiprocessor) vs the model:\n");
    for spec in SPECS {
        let kernel = llama_kernels::backend::KernelRef { module: spec.module, symbol: spec.kernel };
        let (dyn_smem, driver) = match spec.dyn_smem() {
            Ok(dyn_smem) => match device.blocks_per_sm(kernel, spec.threads, dyn_smem) {
                Ok(Some(n)) => (dyn_smem, n.to_string()),
                Ok(None) => (dyn_smem, "-".into()),
                Err(e) => (dyn_smem, format!("error: {e}")),
            },
            Err(e) => (0, format!("error: {e}")),
        };
        let model = analyze(spec).map_or_else(|e| format!("cannot analyze: {e}"), |k| k.blocks_per_sm.to_string());
        s += &format!(
            "  {:<36} {} threads, {} B dynamic smem: driver {} blocks/SM, model {}\n",
            spec.kernel, spec.threads, dyn_smem, driver, model
        );
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sass::parse_sass;

    #[test]
    fn parses_sass_and_finds_loops_and_loads_in_flight() {
        let text = "\
        /*0000*/                   MOV R1, c[0x0][0x28] ;\n\
        /*0010*/               @P0 LDG.E.128 R4, desc[UR4][R2.64] ;\n\
        /*0020*/                   LDG.E.128 R8, desc[UR4][R20.64] ;\n\
        /*0030*/                   FADD R12, R4, R5 ;\n\
        /*0040*/                   LDG.E.128 R16, desc[UR4][R20.64+0x10] ;\n\
        /*0050*/                   STG.E.128 desc[UR4][R2.64], R8 ;\n\
        /*0060*/              @!P1 BRA 0x20 ;\n\
        /*0070*/                   EXIT ;\n";
        let code = parse_sass(text);
        assert_eq!(code.len(), 8);
        assert_eq!(code[1].op, "LDG.E.128");
        assert_eq!(loops(&code), vec![(0x20, 0x60)]);
        // The FADD reads R4 (first load's destination): two loads were in flight before it.
        assert_eq!(loads_in_flight(&code), 2);
        let m = Mix::of(&code);
        assert_eq!((m.total, m.ldg.get(&128), m.stg.get(&128)), (8, Some(&3), Some(&1)));
        assert_eq!(occupancy(64, 128, 0), 8);
        assert_eq!(occupancy(255, 128, 96 * 1024), 2);
    }
}
