//! The static performance report: what the sm_90 SASS of each kernel predicts on an H200.
//!
//! **A model, not a measurement.** It reads the embedded cubins (disassembled with `cuobjdump`)
//! and the `ptxas -v` reports, and for each kernel of interest prints its resources, the
//! occupancy they allow, the instruction mix of its hot region, and the bound that mix predicts
//! against an H200 resource model (the constants below, good to about 15%). Tests assert the
//! thresholds the kernels were tuned to (`tests/perf_report.rs`), so a change that loses a lever
//! fails CI on a machine without a GPU.
//!
//! Regions. Memory-bound kernels: the main loop (the body of the last backward branch) when the
//! kernel streams through rows, or the straight-line code outside every loop when each thread
//! handles a fixed amount (RMSNorm keeps its row in registers; its tail loop runs only for rows
//! longer than the cache). Elements per region = 128-bit stores in the region x elements per
//! vector / stores per element, so "issue slots per element" is the cost of the code as written,
//! assuming every unrolled slot is active. Matrix kernels: the loop with the most HMMA.

use super::sass::{Mix, Sass, cold_addresses, cold_ranges, disassemble, hot_path, loads_in_flight, loops};
use super::{KernelResources, parse_ptxas};
use crate::backend::kernel_modules;

/// The H200 resource model (SXM, compute capability 9.0).
pub mod h200 {
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
}

/// How the report reads one kernel.
#[derive(Clone, Copy, Debug)]
pub enum Region {
    /// Code outside every loop (each thread handles a fixed amount).
    StraightLine,
    /// The body of the last loop (the kernel streams).
    LastLoop,
    /// The loop with the most HMMA.
    MatrixLoop,
}

/// A kernel the report describes, at a reference shape.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub module: &'static str,
    pub kernel: &'static str,
    /// The reference shape, in words.
    pub shape: &'static str,
    pub region: Region,
    /// Threads per block and dynamic shared memory of the reference launch.
    pub threads: u32,
    pub dyn_smem: u32,
    /// Memory-bound kernels: elements per 128-bit vector, 128-bit stores per element, and the
    /// bytes each element moves (reads plus writes).
    pub vec: usize,
    pub stores_per_elem: usize,
    pub bytes_per_elem: f64,
    /// Matrix kernels: the family's source, whose lines between `// perf-model: cold {` and
    /// `// perf-model: cold }` are paths the reference shape does not run (masked boundary tiles,
    /// paged K/V); the hot-path mix leaves out the instructions compiled from them.
    pub cold_source: Option<&'static str>,
}

/// The kernels the report covers (Llama 3 8B shapes, bf16).
pub const SPECS: &[Spec] = &[
    Spec {
        module: "rms_norm",
        kernel: "rms_norm_vec_bf16",
        shape: "hidden 4096, 16k rows (128 threads per row, 4 vectors each)",
        region: Region::StraightLine,
        threads: 128,
        dyn_smem: 0,
        vec: 8,
        stores_per_elem: 1,
        bytes_per_elem: 4.0,
        cold_source: None,
    },
    Spec {
        module: "rms_norm",
        kernel: "fused_add_rms_norm_vec_bf16",
        shape: "hidden 4096, 16k rows",
        region: Region::StraightLine,
        threads: 128,
        dyn_smem: 0,
        vec: 8,
        stores_per_elem: 2,
        bytes_per_elem: 8.0,
        cold_source: None,
    },
    Spec {
        module: "rope",
        kernel: "rope_half_split_vec_bf16",
        shape: "head_dim 128, 32 q + 8 kv heads (Llama 3, no qk-norm)",
        region: Region::LastLoop,
        threads: 320,
        dyn_smem: 0,
        vec: 8,
        stores_per_elem: 1,
        bytes_per_elem: 4.0,
        cold_source: None,
    },
    Spec {
        module: "rope",
        kernel: "rope_interleaved_vec_bf16",
        shape: "head_dim 128, 40 q + 8 kv heads (Llama 4, no qk-norm)",
        region: Region::LastLoop,
        threads: 256,
        dyn_smem: 0,
        vec: 8,
        stores_per_elem: 1,
        bytes_per_elem: 4.0,
        cold_source: None,
    },
    Spec {
        module: "rope",
        kernel: "rope_interleaved_norm_vec_bf16",
        shape: "head_dim 128, 40 q + 8 kv heads (Llama 4 RoPE layer, qk-norm)",
        region: Region::LastLoop,
        threads: 256,
        dyn_smem: 0,
        vec: 8,
        stores_per_elem: 1,
        bytes_per_elem: 4.0,
        cold_source: None,
    },
    Spec {
        module: "swiglu",
        kernel: "swiglu_vec_bf16",
        shape: "ffn 14336, packed gate|up",
        region: Region::LastLoop,
        threads: 256,
        dyn_smem: 0,
        vec: 8,
        stores_per_elem: 1,
        bytes_per_elem: 6.0,
        cold_source: None,
    },
    Spec {
        module: "attention",
        kernel: "attention_hd128_bf16",
        shape: "causal prefill, head_dim 128",
        region: Region::MatrixLoop,
        threads: 128,
        dyn_smem: crate::ops::attention::mma_smem_bytes(128),
        vec: 0,
        stores_per_elem: 0,
        bytes_per_elem: 0.0,
        cold_source: Some(include_str!("../../../kernels/attention.cu")),
    },
];

/// What the report says about one kernel.
#[derive(Clone, Debug)]
pub struct KernelPerf {
    pub spec: Spec,
    pub resources: KernelResources,
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
    /// The predicted bound and the predicted fraction of its ceiling the kernel reaches.
    pub bound: &'static str,
    pub predicted: String,
}

/// Blocks per SM from registers, threads and shared memory (sm_90 allocation rules: registers
/// per warp in units of 256).
pub fn occupancy(regs: u32, threads: u32, smem: u32) -> u32 {
    let warps = threads.div_ceil(32).max(1);
    let regs_per_warp = (regs.max(1) * 32).div_ceil(256) * 256;
    let by_regs = h200::REGS_PER_SM / (regs_per_warp * warps);
    let by_threads = h200::MAX_THREADS_PER_SM / (warps * 32);
    let by_smem = if smem == 0 { u32::MAX } else { h200::SMEM_PER_SM / (smem + h200::SMEM_RESERVED_PER_BLOCK) };
    by_regs.min(by_threads).min(by_smem).min(h200::MAX_BLOCKS_PER_SM)
}

/// Analyzes one kernel.
pub fn analyze(spec: &Spec) -> Result<KernelPerf, String> {
    let module = kernel_modules()
        .map_err(|e| e.to_string())?
        .find(|m| m.name == spec.module)
        .ok_or(format!("no module {}", spec.module))?;
    let resources = parse_ptxas(module.ptxas_sm90)
        .into_iter()
        .find(|k| k.name == spec.kernel)
        .ok_or(format!("{} not in the ptxas report", spec.kernel))?;
    let code = disassemble(module.cubin_sm90, spec.kernel)?;
    let (region, whole_loop) = region_of(spec, module.cubin_sm90, &code)?;
    let mix = Mix::of(region.iter().copied());
    let smem = resources.smem_bytes + spec.dyn_smem;
    let blocks_per_sm = occupancy(resources.registers, spec.threads, smem);
    let warps_per_sm = blocks_per_sm * spec.threads.div_ceil(32);
    let lif = loads_in_flight(&code);
    let clk = h200::CLOCK_GHZ * 1e9;
    let (mut elements, mut slots_per_elem, mut slots_per_hmma, mut smem_per_hmma) = (0.0, 0.0, 0.0, 0.0);
    let (bound, predicted) = if let Region::MatrixLoop = spec.region {
        let p = predict_matrix(&region, &mix, clk);
        (slots_per_hmma, smem_per_hmma) = (p.2, p.3);
        (p.0, p.1)
    } else {
        let p = predict_memory(spec, &mix, warps_per_sm, lif, clk);
        (elements, slots_per_elem) = (p.2, p.3);
        (p.0, p.1)
    };
    Ok(KernelPerf {
        spec: *spec,
        resources,
        blocks_per_sm,
        warps_per_sm,
        mix,
        whole_loop,
        elements,
        slots_per_elem,
        loads_in_flight: lif,
        slots_per_hmma,
        smem_bytes_per_hmma: smem_per_hmma,
        bound,
        predicted,
    })
}

/// The analyzed region of `code` (and, for a matrix kernel with marked cold paths, the whole loop
/// beside its hot path).
fn region_of<'a>(spec: &Spec, cubin: &[u8], code: &'a [Sass]) -> Result<(Vec<&'a Sass>, Option<Mix>), String> {
    let loops = loops(&code);
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
/// Returns (bound, prediction, issue slots per HMMA, shared-memory bytes per HMMA).
fn predict_matrix(region: &[&Sass], mix: &Mix, clk: f64) -> (&'static str, String, f64, f64) {
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
    let t_tensor = 1.0 / h200::HMMA_PER_CLK;
    let t_smem = smem_per_hmma / h200::SMEM_BYTES_PER_CLK;
    let t_issue = slots_per_hmma / h200::ISSUE_PER_CLK;
    let worst = t_tensor.max(t_smem).max(t_issue);
    let bound = if worst == t_tensor {
        "tensor"
    } else if worst == t_smem {
        "shared memory"
    } else {
        "issue"
    };
    let tflops = 4096.0 / worst * h200::SMS * clk / 1e12;
    (
        bound,
        format!("about {tflops:.0} TFLOP/s in the main loop ({:.0}% of the mma.sync rate)", 100.0 * t_tensor / worst),
        slots_per_hmma,
        smem_per_hmma,
    )
}

/// The bound of a memory-bound kernel's region: bandwidth, issue or latency cover.
/// Returns (bound, prediction, elements per region, issue slots per element).
fn predict_memory(spec: &Spec, mix: &Mix, warps_per_sm: u32, lif: usize, clk: f64) -> (&'static str, String, f64, f64) {
    let stores128 = *mix.stg.get(&128).unwrap_or(&0) as f64;
    let elements = stores128 * spec.vec as f64 / spec.stores_per_elem.max(1) as f64;
    let slots_per_elem = if elements > 0.0 { mix.total as f64 / elements } else { f64::INFINITY };
    // Seconds per element under each limit, over the whole GPU.
    let t_mem = spec.bytes_per_elem / h200::COPY_BYTES_PER_S;
    let t_issue = slots_per_elem / 32.0 / (h200::ISSUE_PER_CLK * h200::SMS * clk);
    // Latency cover: bytes in flight per SM against bandwidth x latency.
    let in_flight = warps_per_sm as f64 * 32.0 * lif.max(1) as f64 * 16.0;
    let needed = h200::COPY_BYTES_PER_S / h200::SMS * h200::DRAM_LATENCY_NS * 1e-9;
    let cover = (in_flight / needed).min(1.0);
    let bound = if t_issue > t_mem {
        "issue"
    } else if cover < 1.0 {
        "latency"
    } else {
        "bandwidth"
    };
    let fraction = (t_mem / t_issue.max(t_mem)) * cover;
    (
        bound,
        format!(
            "{:.0}% of copy bandwidth (memory {:.2} ps/elem, issue {:.2} ps/elem, latency cover {:.1}x)",
            100.0 * fraction,
            t_mem * 1e12,
            t_issue * 1e12,
            in_flight / needed
        ),
        elements,
        slots_per_elem,
    )
}

/// The report as text.
pub fn report() -> String {
    let mut s = String::from(
        "Static performance report (sm_90 SASS, H200 resource model) -- a MODEL, not a measurement.\n\
         Model: 132 SMs at 1.83 GHz, 4 issue/clk/SM, copy 4.3 TB/s, shared memory 128 B/clk/SM,\n\
         mma.sync at 63% of the 990 TFLOP/s dense bf16 peak. First order: the slowest limit wins, with\n\
         no loss from imperfect overlap, so real kernels land at or below these figures. Matrix\n\
         kernels: the hot path is the loop without the source lines marked cold (masking of tiles\n\
         that cross a boundary, paged K/V), which an interior tile of the shape does not run; the\n\
         whole loop, every path, is printed above it.\n\n",
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
                    k.spec.dyn_smem,
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
    s += "No GPU measurement exists for these kernels yet: when benches/results holds a GPU run, compare\n\
          its fractions of copy bandwidth and TFLOP/s with the predictions above.\n";
    s
}

/// On a CUDA device: each kernel's blocks per SM from the driver's occupancy calculator (after
/// the same shared-memory opt-in and carveout a launch sets) next to the model's; `None` on the
/// emulated target.
pub fn driver_occupancy(device: &crate::Device) -> Option<String> {
    if device.target() != crate::backend::Target::Cuda {
        return None;
    }
    let mut s = String::from("Occupancy on this device (cuOccupancyMaxActiveBlocksPerMultiprocessor) vs the model:\n");
    for spec in SPECS {
        let kernel = crate::backend::KernelRef { module: spec.module, symbol: spec.kernel };
        let driver = match device.blocks_per_sm(kernel, spec.threads, spec.dyn_smem) {
            Ok(Some(n)) => n.to_string(),
            Ok(None) => "-".into(),
            Err(e) => format!("error: {e}"),
        };
        let model = analyze(spec).map_or_else(|e| format!("cannot analyze: {e}"), |k| k.blocks_per_sm.to_string());
        s += &format!(
            "  {:<36} {} threads, {} B dynamic smem: driver {} blocks/SM, model {}\n",
            spec.kernel, spec.threads, spec.dyn_smem, driver, model
        );
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::inspect::sass::parse_sass;

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
