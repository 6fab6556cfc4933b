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

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

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

/// One SASS instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sass {
    pub addr: u32,
    /// Mnemonic with modifiers (`LDG.E.128`), predicate stripped.
    pub op: String,
    /// The operand text.
    pub operands: String,
    /// Whether a guard predicate (`@P0`, `@!P1`) was stripped.
    pub predicated: bool,
}

impl Sass {
    /// The mnemonic without modifiers (`LDG`).
    pub fn base(&self) -> &str {
        self.op.split('.').next().unwrap_or("")
    }
}

/// Runs the toolchain's `tool` (`cuobjdump`, `nvdisasm`) with `args` on `cubin`, written to a
/// temporary file named after `tag`; its standard output.
fn run_on_cubin(tool: &str, args: &[&str], cubin: &[u8], tag: &str) -> Result<String, String> {
    let bin = std::path::PathBuf::from(env!("LLK_CUDA_BIN")).join(tool);
    let dir = std::env::temp_dir().join(format!("llk-perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir: {e}"))?;
    let path = dir.join(format!("{tag}.{tool}.cubin"));
    std::fs::write(&path, cubin).map_err(|e| format!("write cubin: {e}"))?;
    let out = Command::new(&bin)
        .args(args)
        .arg(&path)
        .output()
        .map_err(|e| format!("cannot run {} (scripts/setup.sh installs it): {e}", bin.display()))?;
    let _ = std::fs::remove_file(&path);
    if !out.status.success() {
        return Err(format!("{tool} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Disassembles `function` of a cubin with the toolchain's `cuobjdump`.
pub fn disassemble(cubin: &[u8], function: &str) -> Result<Vec<Sass>, String> {
    Ok(parse_sass(&run_on_cubin("cuobjdump", &["-sass", "-fun", function], cubin, function)?))
}

/// Line ranges (1-based, inclusive) of `source` between `// perf-model: cold {` and
/// `// perf-model: cold }` markers.
pub fn cold_ranges(source: &str) -> Vec<(u32, u32)> {
    let mut ranges = Vec::new();
    let mut open = None;
    for (i, line) in source.lines().enumerate() {
        let n = i as u32 + 1;
        if line.contains("perf-model: cold {") {
            open = Some(n);
        } else if line.contains("perf-model: cold }") {
            if let Some(start) = open.take() {
                ranges.push((start, n));
            }
        }
    }
    ranges
}

/// Addresses of `function`'s instructions compiled from a cold line of `file` (a file name such as
/// `attention.cu`), directly or through an inlined call made there: read from the line table the
/// `-lineinfo` build keeps in the cubin (`nvdisasm -gi` prints each instruction's inline chain).
pub fn cold_addresses(cubin: &[u8], function: &str, file: &str, ranges: &[(u32, u32)]) -> Result<BTreeSet<u32>, String> {
    let text = run_on_cubin("nvdisasm", &["-gi"], cubin, function)?;
    let header = format!(".text.{function}:");
    let body = text.split_once(header.as_str()).ok_or(format!("{function} not in the nvdisasm output"))?.1;
    let is_cold = |f: &str, line: u32| f.rsplit('/').next() == Some(file) && ranges.iter().any(|&(a, b)| (a..=b).contains(&line));
    // Each `//## File "f", line n [inlined at "g", line m]` line is one frame of the next
    // instruction's chain; an instruction without its own chain keeps the previous one.
    let frame = |l: &str| -> Vec<(String, u32)> {
        l.split("File \"")
            .chain(l.split(" at \"").skip(1))
            .filter_map(|part| {
                let (f, rest) = part.split_once('"')?;
                let n = rest.trim_start_matches(',').trim().strip_prefix("line ")?;
                let n: u32 = n.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
                Some((f.to_string(), n))
            })
            .collect()
    };
    let mut cold = BTreeSet::new();
    let (mut chain_cold, mut fresh) = (false, true);
    for l in body.lines() {
        let t = l.trim_start();
        if t.starts_with(".section") || t.starts_with("//----") {
            break; // the next function
        }
        if let Some(rest) = t.strip_prefix("//##") {
            if fresh {
                chain_cold = false;
                fresh = false;
            }
            chain_cold |= frame(rest).iter().any(|(f, n)| is_cold(f, *n));
        } else if let Some(rest) = t.strip_prefix("/*") {
            let Some((addr, _)) = rest.split_once("*/") else { continue };
            let Ok(addr) = u32::from_str_radix(addr.trim(), 16) else { continue };
            if chain_cold {
                cold.insert(addr);
            }
            fresh = true;
        }
    }
    Ok(cold)
}

/// Parses `cuobjdump -sass` text (one function) into instructions.
pub fn parse_sass(text: &str) -> Vec<Sass> {
    let mut v = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let Some(rest) = t.strip_prefix("/*") else { continue };
        let Some((addr, code)) = rest.split_once("*/") else { continue };
        let Ok(addr) = u32::from_str_radix(addr.trim(), 16) else { continue };
        let code = code.trim().trim_end_matches(|c| c != ';').trim_end_matches(';').trim();
        let mut words = code.split_whitespace().peekable();
        let predicated = words.peek().is_some_and(|w| w.starts_with('@'));
        if predicated {
            words.next();
        }
        let Some(op) = words.next() else { continue };
        let operands = words.collect::<Vec<_>>().join(" ");
        v.push(Sass { addr, op: op.to_string(), operands, predicated });
    }
    v
}

/// The address a branch (`BRA 0x1a50`, `BRA P2, 0x1a50`) jumps to.
fn branch_target(i: &Sass) -> Option<u32> {
    if i.base() != "BRA" {
        return None;
    }
    let target = i.operands.split_whitespace().last()?.trim_start_matches("0x");
    u32::from_str_radix(target.trim_end_matches(';'), 16).ok()
}

/// `[start, end]` address ranges of loop bodies (a branch back to an earlier address).
pub fn loops(code: &[Sass]) -> Vec<(u32, u32)> {
    code.iter().filter_map(|i| branch_target(i).filter(|&t| t < i.addr).map(|t| (t, i.addr))).collect()
}

/// The hot path of a loop body (`region`, in address order): the basic blocks one iteration can
/// reach from the loop head along forward edges without entering a cold block, a block whose
/// instructions mostly come from cold source lines. Deciding per block rather than per
/// instruction keeps out the values ptxas rematerializes inside cold code, which the line table
/// attributes to the line that defined them. Both sides of a branch between hot blocks count
/// (the O rescale a warp skips when no row maximum moved, for one), so the path is an upper
/// bound on what an interior tile issues.
pub fn hot_path<'a>(region: &[&'a Sass], cold: &BTreeSet<u32>) -> Vec<&'a Sass> {
    let Some(first) = region.first() else { return Vec::new() };
    let mut leaders = BTreeSet::from([first.addr]);
    for (k, i) in region.iter().enumerate() {
        if let Some(t) = branch_target(i) {
            leaders.insert(t);
            if let Some(next) = region.get(k + 1) {
                leaders.insert(next.addr);
            }
        }
    }
    let mut blocks: Vec<Vec<&'a Sass>> = Vec::new();
    for &i in region {
        match blocks.last_mut() {
            Some(b) if !leaders.contains(&i.addr) => b.push(i),
            _ => blocks.push(vec![i]),
        }
    }
    let start: BTreeMap<u32, usize> = blocks.iter().enumerate().map(|(k, b)| (b[0].addr, k)).collect();
    let is_cold: Vec<bool> = blocks
        .iter()
        .map(|b| {
            let body: Vec<_> = b.iter().filter(|i| i.base() != "BRA" && i.base() != "NOP").collect();
            let n = body.iter().filter(|i| cold.contains(&i.addr)).count();
            2 * n > body.len()
        })
        .collect();
    let mut reach = vec![false; blocks.len()];
    reach[0] = true;
    for k in 0..blocks.len() {
        if !reach[k] || is_cold[k] {
            continue;
        }
        let Some(last) = blocks[k].last() else { continue };
        let target = branch_target(last);
        if (target.is_none() || last.predicated) && k + 1 < blocks.len() {
            reach[k + 1] = true;
        }
        if let Some(&j) = target.filter(|&t| t > last.addr).and_then(|t| start.get(&t)) {
            reach[j] = true;
        }
    }
    blocks
        .iter()
        .enumerate()
        .filter(|&(k, _)| reach[k] && !is_cold[k])
        .flat_map(|(_, b)| b.iter().copied())
        .collect()
}

/// Instruction counts of a region.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mix {
    /// Every instruction except NOP.
    pub total: usize,
    pub hmma: usize,
    pub ldsm: usize,
    pub ldgsts: usize,
    pub mufu: usize,
    pub lds: usize,
    pub sts: usize,
    /// Global loads and stores by width in bits.
    pub ldg: BTreeMap<u32, usize>,
    pub stg: BTreeMap<u32, usize>,
    /// Local-memory accesses (spills or stack arrays).
    pub local: usize,
    /// Of which stores (STL).
    pub local_stores: usize,
}

fn width(op: &str) -> u32 {
    op.split('.').find_map(|m| m.parse::<u32>().ok().filter(|w| [8, 16, 32, 64, 128].contains(w))).unwrap_or(32)
}

impl Mix {
    pub fn of<'a>(code: impl IntoIterator<Item = &'a Sass>) -> Mix {
        let mut m = Mix::default();
        for i in code {
            match i.base() {
                "NOP" => continue,
                "HMMA" => m.hmma += 1,
                "LDSM" => m.ldsm += 1,
                "LDGSTS" => m.ldgsts += 1,
                "MUFU" => m.mufu += 1,
                "LDS" => m.lds += 1,
                "STS" => m.sts += 1,
                "LDG" => *m.ldg.entry(width(&i.op)).or_default() += 1,
                "STG" => *m.stg.entry(width(&i.op)).or_default() += 1,
                "LDL" => m.local += 1,
                "STL" => {
                    m.local += 1;
                    m.local_stores += 1;
                }
                _ => {}
            }
            m.total += 1;
        }
        m
    }
    fn widths(map: &BTreeMap<u32, usize>) -> String {
        if map.is_empty() {
            return "-".into();
        }
        map.iter().map(|(w, n)| format!("{n}x{w}")).collect::<Vec<_>>().join(" ")
    }
}

/// The number of 128-bit global loads issued before the first instruction that reads one of
/// their destination registers: the loads one thread keeps in flight at the start of the kernel.
pub fn loads_in_flight(code: &[Sass]) -> usize {
    let reg = |s: &str| -> Option<u32> {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric()).strip_prefix('R')?.parse().ok()
    };
    let mut pending: Vec<(u32, u32)> = Vec::new(); // destination register ranges
    let mut best = 0;
    for i in code {
        let mut ops = i.operands.split(',').map(str::trim);
        let (dest, sources): (Option<&str>, Vec<&str>) = match i.base() {
            "STG" | "STS" | "STL" | "BRA" | "EXIT" | "BAR" => (None, i.operands.split(',').map(str::trim).collect()),
            _ => (ops.next(), ops.collect()),
        };
        // Address operands of loads ([R10.64]) are sources too.
        let mut read = false;
        for s in sources.iter().chain(dest.filter(|d| d.starts_with('[')).iter()) {
            for tok in s.split(['[', ']', ' ', '.']) {
                if let Some(r) = reg(tok) {
                    read |= pending.iter().any(|&(lo, hi)| (lo..=hi).contains(&r));
                }
            }
        }
        if read {
            break;
        }
        if i.op.starts_with("LDG") && width(&i.op) == 128 {
            if let Some(r) = dest.and_then(reg) {
                pending.push((r, r + 3));
                best = pending.len();
            }
        }
    }
    best
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
        dyn_smem: (128 + 4 * 64) * 128 * 2,
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
    let module = kernel_modules().find(|m| m.name == spec.module).ok_or(format!("no module {}", spec.module))?;
    let resources = parse_ptxas(module.ptxas_sm90)
        .into_iter()
        .find(|k| k.name == spec.kernel)
        .ok_or(format!("{} not in the ptxas report", spec.kernel))?;
    let code = disassemble(module.cubin_sm90, spec.kernel)?;
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
    let (region, whole_loop) = match (spec.region, spec.cold_source) {
        (Region::MatrixLoop, Some(source)) => {
            let cold = cold_addresses(module.cubin_sm90, spec.kernel, &format!("{}.cu", spec.module), &cold_ranges(source))?;
            let whole = Mix::of(region.iter().copied());
            (hot_path(&region, &cold), Some(whole))
        }
        _ => (region, None),
    };
    let mix = Mix::of(region.iter().copied());
    let smem = resources.smem_bytes + spec.dyn_smem;
    let blocks_per_sm = occupancy(resources.registers, spec.threads, smem);
    let warps_per_sm = blocks_per_sm * spec.threads.div_ceil(32);
    let lif = loads_in_flight(&code);
    let clk = h200::CLOCK_GHZ * 1e9;
    let (mut elements, mut slots_per_elem, mut slots_per_hmma, mut smem_per_hmma) = (0.0, 0.0, 0.0, 0.0);
    let (bound, predicted) = if let Region::MatrixLoop = spec.region {
        let hmma = mix.hmma.max(1) as f64;
        slots_per_hmma = mix.total as f64 / hmma;
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
        smem_per_hmma = (ldsm_bytes + 512.0 * mix.ldgsts as f64 + 128.0 * (mix.lds + mix.sts) as f64) / hmma;
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
            format!(
                "about {tflops:.0} TFLOP/s in the main loop ({:.0}% of the mma.sync rate)",
                100.0 * t_tensor / worst
            ),
        )
    } else {
        let stores128 = *mix.stg.get(&128).unwrap_or(&0) as f64;
        elements = stores128 * spec.vec as f64 / spec.stores_per_elem.max(1) as f64;
        slots_per_elem = if elements > 0.0 { mix.total as f64 / elements } else { f64::INFINITY };
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
        )
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
