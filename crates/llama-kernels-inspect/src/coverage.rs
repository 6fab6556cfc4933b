//! The kernels the first part of the static report leaves out (issue 19): paged decode attention
//! (bf16 and fp8 pages) and its split merge, kv_append, and the MoE pipeline (route, align,
//! gather, grouped GEMM, combine), each predicted with the report's models on an H200.
//!
//! **A model, not a measurement.** Every launch goes through the calibrated memory-bound model
//! ([`predict_memory_launch`]): the bytes it moves at the copy bandwidth, Little's law on the
//! bytes its resident threads keep in flight (from the SASS: global loads issued before the first
//! use of one; for cp.async pipelines the stages in flight), and its issue slots, plus the 4 us
//! launch. Issue slots are counted per byte loaded: the instructions of the loop with the most
//! global-load bytes over the bytes one warp loads in it (the straight-line code is left out).
//! Kernels with tensor-core work add a tensor term: the HMMA they issue at the mma.sync rate at
//! the tensor-loaded clock (decode attention), or their FLOP at the first-order rate of their main
//! loop ([`predict_mma_loop`], the grouped GEMM), padding rows included. When the grid has fewer
//! blocks than SMs, only that many SMs keep loads in flight.
//!
//! Paged decode: the bytes are the K/V pages actually read (batch x context x KV heads x
//! head_dim x 2 x page bytes); the partial outputs of the splits are extra DRAM writes; the split
//! count is the one the op's planner picks ([`plan_splits`]).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::h200;
use super::h200::occupancy;
use super::memory_model::{H200, MemoryLaunch, MemoryPrediction, predict_memory_launch};
use super::qlinear_model::{MmaLoopPrediction, predict_mma_loop};
use super::sass::{Sass, load_bytes_in_flight, loops};
use super::{KernelCode, KernelResources, declared_smem, kernel_code};
use llama_kernels::dev::geometry::params::{
    LLK_DECODE_KEYS, LLK_DECODE_ROWS_MMA, LLK_DECODE_THREADS, LLK_EMBEDDING_ROWS, LLK_EMBEDDING_THREADS,
    LLK_MOE_GEMM_BLOCK_N, LLK_MOE_GEMM_BLOCK_N_DECODE, LLK_MOE_GEMM_STAGES, LLK_MOE_GEMM_STAGES_DECODE,
    LLK_MOE_GEMM_THREADS, LLK_MOE_ROUTE_WARPS, LLK_MOE_ROW_THREADS, LLK_QUANT_CHUNK,
};
use llama_kernels::ops::attention::{decode_config, decode_kernel, decode_stages_of, plan_splits};
use llama_kernels::ops::moe::{padded_rows, preferred_block_m};
use llama_kernels::spec::quant::{QuantFormat, QuantLayout};
use llama_kernels::{DType, EmuArch};

/// What one kernel's SASS gives the launch model.
#[derive(Clone, Debug)]
pub struct KernelFacts {
    pub resources: KernelResources,
    /// Bytes of global loads one thread issues before the first use of one.
    pub bytes_in_flight_per_thread: usize,
    /// Issue slots per byte of global loads, from the loop with the most load bytes.
    pub slots_per_byte: f64,
    /// HMMA per warp in that loop (decode attention: per 64-key tile).
    pub loop_hmma: usize,
}

/// Bytes one lane loads with a global access `op` (LDGSTS moves 16 per lane in our kernels).
fn lane_bytes(i: &Sass) -> f64 {
    match i.base() {
        "LDGSTS" => 16.0,
        "LDG" => {
            let w = i.op.split('.').find_map(|m| m.parse::<u32>().ok().filter(|w| [8, 16, 32, 64, 128].contains(w)));
            let w = w.unwrap_or(if i.op.contains("U16") || i.op.contains("S16") { 16 } else { 32 });
            f64::from(w) / 8.0
        }
        _ => 0.0,
    }
}

type Cache<T> = OnceLock<Mutex<HashMap<String, T>>>;

/// `f(key)`, remembered for the process (the report reads each kernel's SASS once).
fn cached<T: Clone>(cache: &'static Cache<T>, key: String, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let map = cache.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(v) = map.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(v);
    }
    let v = f()?;
    if let Ok(mut m) = map.lock() {
        m.insert(key, v.clone());
    }
    Ok(v)
}

/// Reads `kernel` of `module` from the embedded sm_90 cubin and `ptxas -v` report.
pub fn kernel_facts(module: &str, kernel: &str) -> Result<KernelFacts, String> {
    static FACTS: Cache<KernelFacts> = OnceLock::new();
    cached(&FACTS, format!("{module}/{kernel}"), || read_facts(module, kernel))
}

/// [`predict_mma_loop`], remembered.
fn mma_loop(kernel: &str, threads: u32, smem: u32) -> Result<MmaLoopPrediction, String> {
    static LOOPS: Cache<MmaLoopPrediction> = OnceLock::new();
    cached(&LOOPS, format!("{kernel}/{threads}/{smem}"), || predict_mma_loop("moe", kernel, threads, smem))
}

fn read_facts(module: &str, kernel: &str) -> Result<KernelFacts, String> {
    let KernelCode { resources, code, .. } = kernel_code(module, kernel)?;
    let real: Vec<&Sass> = code.iter().filter(|i| i.base() != "NOP").collect();
    let load_bytes = |body: &[&Sass]| body.iter().map(|i| lane_bytes(i)).sum::<f64>();
    let bodies: Vec<Vec<&Sass>> = loops(&code)
        .iter()
        .map(|&(s, e)| real.iter().copied().filter(|i| (s..=e).contains(&i.addr)).collect())
        .collect();
    let body = bodies
        .iter()
        .filter(|b| load_bytes(b) > 0.0)
        .max_by(|a, b| load_bytes(a).total_cmp(&load_bytes(b)))
        .cloned()
        .unwrap_or_else(|| real.clone());
    let bytes = load_bytes(&body);
    Ok(KernelFacts {
        resources,
        bytes_in_flight_per_thread: load_bytes_in_flight(&code),
        slots_per_byte: if bytes > 0.0 { body.len() as f64 / (32.0 * bytes) } else { 0.0 },
        loop_hmma: body.iter().filter(|i| i.base() == "HMMA").count(),
    })
}

/// One launch of a covered kernel.
#[derive(Clone, Debug)]
pub struct LaunchShape {
    /// Bytes the launch is credited with (reads plus writes), of which reads.
    pub counted_bytes: f64,
    pub read_bytes: f64,
    /// Further DRAM bytes (decode's partial outputs), not credited.
    pub extra_bytes: f64,
    pub blocks: f64,
    pub threads: u32,
    pub dyn_smem: u32,
    /// cp.async pipelines: bytes one block keeps in flight (else the SASS's loads before use).
    pub in_flight_per_block: Option<f64>,
    /// Tensor-core time in seconds (0: none).
    pub t_tensor: f64,
}

/// What the report predicts for one covered launch.
#[derive(Clone, Debug)]
pub struct Covered {
    pub group: &'static str,
    pub module: &'static str,
    pub kernel: String,
    pub shape: String,
    pub registers: u32,
    pub blocks_per_sm: u32,
    pub grid_blocks: f64,
    pub memory: MemoryPrediction,
    pub t_tensor: f64,
    /// "bandwidth", "latency", "issue", "tensor" (the grouped GEMM: "mma loop: issue" or "mma loop:
    /// shared memory", the limit of its loop) or "launch" (the 4 us launch is more than the body).
    pub bound: &'static str,
    pub seconds: f64,
    /// Without the launch latency.
    pub body_seconds: f64,
    /// Credited bytes per second over the copy bandwidth, with and without the launch.
    pub fraction_of_copy: f64,
    pub steady_fraction: f64,
    /// Decode attention: the planner's split count.
    pub splits: Option<usize>,
    /// The grouped GEMM: FLOP of the rows that exist, and TFLOP/s on them.
    pub tflops: Option<f64>,
}

/// The model of one launch of `kernel`.
pub fn predict(
    group: &'static str,
    module: &'static str,
    kernel: &str,
    shape: String,
    l: &LaunchShape,
) -> Result<Covered, String> {
    let f = kernel_facts(module, kernel)?;
    let r = &f.resources;
    let blocks_per_sm = occupancy(r.registers, l.threads, r.smem_bytes + l.dyn_smem).max(1);
    let warps_per_block = l.threads.div_ceil(32);
    let resident = (blocks_per_sm as f64).min((l.blocks / h200::SMS).ceil()).max(1.0);
    let active = (l.blocks / h200::SMS).min(1.0);
    let per_thread = match l.in_flight_per_block {
        Some(b) => b / l.threads as f64,
        None => f.bytes_in_flight_per_thread as f64,
    };
    let launch = MemoryLaunch {
        counted_bytes: l.counted_bytes,
        read_bytes: l.read_bytes,
        harness_bytes: l.extra_bytes,
        warps_per_sm: (resident as u32) * warps_per_block,
        bytes_in_flight_per_thread: (per_thread * active).max(1.0),
        warp_instructions: l.read_bytes * f.slots_per_byte,
    };
    let memory = predict_memory_launch(&H200, &launch);
    let mem_body = memory.seconds - memory.t_launch;
    let body = mem_body.max(l.t_tensor);
    let bound = if body < memory.t_launch {
        "launch"
    } else if l.t_tensor > mem_body {
        "tensor"
    } else {
        memory.bound
    };
    let seconds = body + memory.t_launch;
    let rate = |t: f64| if t > 0.0 { l.counted_bytes / t / H200.dram_bytes_per_s } else { 0.0 };
    Ok(Covered {
        group,
        module,
        kernel: kernel.to_string(),
        shape,
        registers: r.registers,
        blocks_per_sm,
        grid_blocks: l.blocks,
        memory,
        t_tensor: l.t_tensor,
        bound,
        seconds,
        body_seconds: body,
        fraction_of_copy: rate(seconds),
        steady_fraction: rate(body),
        splits: None,
        tflops: None,
    })
}

/// Decode attention geometry (Llama 3 and Llama 4: 8 KV heads, head_dim 128).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeCase {
    pub batch: usize,
    pub context: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Page element bytes: 2 (bf16) or 1 (fp8).
    pub page_bytes: usize,
}

/// The split count the op plans for `c` on an H200 (132 SMs).
pub fn decode_splits(c: &DecodeCase) -> usize {
    let rows = (c.q_heads / c.kv_heads.max(1)).div_ceil(LLK_DECODE_ROWS_MMA as usize).max(1);
    plan_splits(h200::SMS as usize, c.batch * c.kv_heads * rows, c.context)
}

/// The paged decode launch for `c` (bf16 q, `page_bytes` pages) and, with more than one split,
/// its merge.
pub fn predict_decode(c: &DecodeCase) -> Result<(Covered, Option<Covered>), String> {
    let fp8 = c.page_bytes == 1;
    let kernel = format!("paged_decode_hd{}_bf16{}", c.head_dim, if fp8 { "_fp8" } else { "" });
    let splits = decode_splits(c);
    let rows = (c.q_heads / c.kv_heads.max(1)).div_ceil(LLK_DECODE_ROWS_MMA as usize).max(1);
    let blocks = (c.batch * splits * c.kv_heads * rows) as f64;
    let keys = LLK_DECODE_KEYS as usize;
    let tiles_per_block = c.context.div_ceil(keys).div_ceil(splits) as f64;
    let kv = (c.batch * c.context * c.kv_heads * c.head_dim * 2 * c.page_bytes) as f64;
    let tokens = c.batch as f64;
    let q_out = tokens * (c.q_heads * c.head_dim) as f64 * 2.0 * 2.0;
    let partial = if splits > 1 { (splits * c.batch * c.q_heads * (c.head_dim + 1) * 4) as f64 } else { 0.0 };
    // cp.async: every stage but the one being read is in flight (3 stages when they fit).
    // The stages the op picks on an H200 (its SM and block limits are Hopper's).
    let page = if fp8 { DType::F8E4M3 } else { DType::BF16 };
    let (per_sm, per_block) = (EmuArch::Sm90.max_shared_memory_per_sm(), EmuArch::Sm90.max_shared_memory_per_block());
    let config = decode_config(per_sm, per_block, DType::BF16, page, c.head_dim);
    let planned = decode_kernel(DType::BF16, page, c.head_dim, config).map_err(|e| e.to_string())?;
    if planned.symbol != kernel {
        return Err(format!("the op plans {} on an H200, the model reads {kernel}", planned.symbol));
    }
    let smem = declared_smem(planned.symbol)? as usize;
    let stages = decode_stages_of(config, page, c.head_dim) as f64;
    let tile = (keys * c.head_dim * c.page_bytes) as f64;
    let facts = kernel_facts("paged_attention", &kernel)?;
    let hmma = facts.loop_hmma as f64 * (LLK_DECODE_THREADS / 32) as f64 * tiles_per_block * blocks;
    let t_tensor = hmma / (h200::HMMA_PER_CLK * h200::SMS * h200::TENSOR_CLOCK_GHZ * 1e9);
    let shape = format!(
        "batch {}, {}k context, {}/{} heads, hd {}, {} pages",
        c.batch,
        c.context / 1024,
        c.q_heads,
        c.kv_heads,
        c.head_dim,
        if fp8 { "fp8" } else { "bf16" }
    );
    let l = LaunchShape {
        counted_bytes: kv,
        read_bytes: kv,
        extra_bytes: q_out + partial,
        blocks,
        threads: LLK_DECODE_THREADS,
        dyn_smem: smem as u32,
        in_flight_per_block: Some((stages - 1.0) * 2.0 * tile),
        t_tensor,
    };
    let mut d = predict("decode attention", "paged_attention", &kernel, shape, &l)?;
    d.splits = Some(splits);
    let merge = if splits > 1 {
        let out = tokens * (c.q_heads * c.head_dim) as f64 * 2.0;
        let m = LaunchShape {
            counted_bytes: partial + out,
            read_bytes: partial,
            extra_bytes: 0.0,
            blocks: (c.batch * c.q_heads).div_ceil(4) as f64,
            threads: LLK_DECODE_THREADS,
            dyn_smem: 0,
            in_flight_per_block: None,
            t_tensor: 0.0,
        };
        let shape = format!("{splits} splits x batch {} x {} heads, f32 partials", c.batch, c.q_heads);
        Some(predict("decode attention", "paged_attention", "paged_decode_merge_bf16", shape, &m)?)
    } else {
        None
    };
    Ok((d, merge))
}

/// kv_append of `tokens` new tokens (8 KV heads, head_dim 128) into bf16 or fp8 pages.
pub fn predict_kv_append(tokens: usize, kv_heads: usize, head_dim: usize, fp8: bool) -> Result<Covered, String> {
    let elems = (tokens * kv_heads * head_dim * 2) as f64;
    let l = LaunchShape {
        counted_bytes: elems * (2.0 + if fp8 { 1.0 } else { 2.0 }),
        read_bytes: elems * 2.0,
        extra_bytes: 0.0,
        blocks: (elems / 8.0 / 256.0).ceil().max(1.0),
        threads: 256,
        dyn_smem: 0,
        in_flight_per_block: None,
        t_tensor: 0.0,
    };
    let kernel = if fp8 { "kv_append_bf16_fp8" } else { "kv_append_bf16_bf16" };
    let shape = format!("{tokens} tokens x {kv_heads} KV heads x hd {head_dim}, k and v");
    predict("kv cache", "paged_attention", kernel, shape, &l)
}

/// The public merge of two attention states (cascade attention over a shared prefix): `tokens`
/// tokens x `heads` heads of bf16 outputs with f32 log-sum-exps, merged into one.
pub fn predict_merge_states(tokens: usize, heads: usize, head_dim: usize) -> Result<Covered, String> {
    let rows = tokens * heads;
    let state = (rows * (head_dim * 2 + 4)) as f64;
    let l = LaunchShape {
        counted_bytes: 3.0 * state,
        read_bytes: 2.0 * state,
        extra_bytes: 0.0,
        blocks: rows.div_ceil(4) as f64,
        threads: LLK_DECODE_THREADS,
        dyn_smem: 0,
        in_flight_per_block: None,
        t_tensor: 0.0,
    };
    let shape = format!("2 states x {tokens} tokens x {heads} heads x hd {head_dim}");
    predict("attention merge", "paged_attention", "merge_states_bf16", shape, &l)
}

/// The embedding lookup of `tokens` ids into `hidden`-wide bf16 rows: from a dense bf16 table (the
/// 16-byte kernel: up to 256 threads of 8 elements per row, `LLK_EMBEDDING_ROWS` rows per grid.y)
/// or a packed one (a thread per 32-element chunk, 256 per block). Bytes: the rows read (packed: their packed bytes),
/// the rows written, the ids.
pub fn predict_embedding(tokens: usize, hidden: usize, packed: Option<QuantFormat>) -> Result<Covered, String> {
    let out = (tokens * hidden * 2) as f64;
    let threads = LLK_EMBEDDING_THREADS as usize;
    let (kernel, row_bytes, blocks, block) = match packed {
        None => {
            let nvec = hidden / 8;
            let block = nvec.div_ceil(32).min(threads / 32) * 32;
            let row_steps = tokens.div_ceil(LLK_EMBEDDING_ROWS as usize);
            ("embedding_vec_bf16".to_string(), (hidden * 2) as f64, row_steps * nvec.div_ceil(block), block)
        }
        Some(f) => {
            let row = QuantLayout::new(f, f.default_block(), 1, hidden).map_err(|e| e.to_string())?.total_bytes();
            let chunks = tokens * hidden / LLK_QUANT_CHUNK as usize;
            (format!("qembedding_{}_bf16", f.name()), row as f64, chunks.div_ceil(threads), threads)
        }
    };
    let read = tokens as f64 * row_bytes;
    // A gather's first load is the token id, whose value is only the address of the row loads
    // (and which the warp's lanes share, from L1 after the first): the DRAM bytes a thread keeps
    // in flight are its 128-bit row loads before its first store, read from the SASS.
    let code = kernel_code("embedding", &kernel)?.code;
    let first_store = code.iter().position(|i| i.base() == "STG").unwrap_or(code.len());
    let row_loads: usize = code[..first_store]
        .iter()
        .filter(|i| i.base() == "LDG" && i.op.contains(".128"))
        .map(|i| lane_bytes(i) as usize)
        .sum();
    let l = LaunchShape {
        counted_bytes: read + out + 4.0 * tokens as f64,
        read_bytes: read,
        extra_bytes: 0.0,
        blocks: blocks.max(1) as f64,
        threads: block as u32,
        dyn_smem: 0,
        in_flight_per_block: Some((row_loads * block) as f64),
        t_tensor: 0.0,
    };
    let table = packed.map_or("bf16".to_string(), |f| f.name().to_string());
    predict("embedding", "embedding", &kernel, format!("{tokens} ids x {hidden}, {table} table"), &l)
}

/// An MoE layer's shape (Llama 4 Scout: hidden 5120, 16 experts top-1, expert and shared
/// intermediate 8192).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeCase {
    pub tokens: usize,
    pub hidden: usize,
    pub experts: usize,
    pub top_k: usize,
    pub intermediate: usize,
}

/// Llama 4 Scout's MoE layer at `tokens` tokens.
pub const fn scout_moe(tokens: usize) -> MoeCase {
    MoeCase { tokens, hidden: 5120, experts: 16, top_k: 1, intermediate: 8192 }
}

/// Experts with at least one row when `slots` rows spread evenly (every expert at prefill).
fn active_experts(c: &MoeCase) -> usize {
    (c.tokens * c.top_k).min(c.experts).max(1)
}

/// One grouped GEMM launch: `rows` padded rows in `groups` groups of `[k, n]` weights (n the
/// outputs; SwiGLU reads 2n columns of weight).
#[allow(clippy::too_many_arguments)]
fn grouped_gemm(
    group: &'static str,
    layout: &str,
    swiglu: bool,
    slots: usize,
    groups: usize,
    experts: usize,
    k: usize,
    n: usize,
) -> Result<Covered, String> {
    let block_m = preferred_block_m(slots, experts);
    let rows = padded_rows(slots, experts, block_m).map_err(|e| e.to_string())?;
    let m16 = block_m == 16;
    let kernel = format!(
        "moe_grouped_gemm_{layout}_{}_m{}_bf16",
        if swiglu { "swiglu" } else { "plain" },
        if m16 { 16 } else { 64 }
    );
    let (cols, stages) = if m16 {
        (LLK_MOE_GEMM_BLOCK_N_DECODE, LLK_MOE_GEMM_STAGES_DECODE)
    } else {
        (LLK_MOE_GEMM_BLOCK_N, LLK_MOE_GEMM_STAGES)
    };
    let smem = declared_smem(&kernel)?;
    let loop_p = mma_loop(&kernel, LLK_MOE_GEMM_THREADS, smem)?;
    let wcols = if swiglu { 2 * n } else { n };
    let out_per_block = if swiglu { cols / 2 } else { cols } as usize;
    let row_blocks = rows.div_ceil(block_m);
    let blocks = (row_blocks * n.div_ceil(out_per_block)) as f64;
    // Each row block streams its expert's weight; the L2 serves the other row blocks of one
    // expert when they run together (prefill), so DRAM reads each active expert's weight once.
    let weight = (groups * k * wcols * 2) as f64;
    let act = (slots * (k + n) * 2) as f64;
    let flops = 2.0 * (rows * k * wcols) as f64;
    let t_tensor = flops / (loop_p.tflops * 1e12);
    let l = LaunchShape {
        counted_bytes: weight + act,
        read_bytes: weight + (slots * k * 2) as f64,
        extra_bytes: 0.0,
        blocks,
        threads: LLK_MOE_GEMM_THREADS,
        dyn_smem: smem,
        in_flight_per_block: Some(f64::from(stages - 1) * f64::from(smem) / f64::from(stages)),
        t_tensor,
    };
    let shape = format!(
        "{slots} rows ({rows} padded) over {groups} group(s), k {k} -> n {wcols}{}",
        if swiglu { " (SwiGLU)" } else { "" }
    );
    let mut c = predict(group, "moe", &kernel, shape, &l)?;
    if c.bound == "tensor" {
        c.bound = match loop_p.bound {
            "issue" => "mma loop: issue",
            "shared memory" => "mma loop: shared memory",
            _ => "tensor",
        };
    }
    c.tflops = Some(2.0 * (slots * k * wcols) as f64 / c.seconds / 1e12);
    Ok(c)
}

/// Every launch of one MoE feed-forward (Llama 4 layout: routed experts InOut, router and shared
/// expert OutIn), in the order the layer runs them.
pub fn predict_moe(c: &MoeCase) -> Result<Vec<Covered>, String> {
    let (t, h, e) = (c.tokens, c.hidden, c.experts);
    let slots = t * c.top_k;
    let mut router = grouped_gemm("moe", "nk", false, t, 1, 1, h, e)?;
    router.group = "moe router";
    let mut v = vec![router];
    let row_bytes = (h * 2) as f64;
    let route = LaunchShape {
        counted_bytes: (t * e * 2 + slots * 8) as f64,
        read_bytes: (t * e * 2) as f64,
        extra_bytes: 0.0,
        blocks: t.div_ceil(LLK_MOE_ROUTE_WARPS as usize) as f64,
        threads: 32 * LLK_MOE_ROUTE_WARPS,
        dyn_smem: 0,
        in_flight_per_block: None,
        t_tensor: 0.0,
    };
    v.push(predict(
        "moe",
        "moe",
        "moe_route_llama4_e128_bf16",
        format!("{t} tokens x {e} experts, top-{}", c.top_k),
        &route,
    )?);
    for (kernel, blocks, threads) in [
        ("moe_align_histogram", (slots as f64 / 1024.0).ceil(), 256),
        ("moe_align_scan", 1.0, 512),
        ("moe_align_scatter", (slots as f64 / 1024.0).ceil(), 256),
    ] {
        let l = LaunchShape {
            counted_bytes: (slots * 8) as f64,
            read_bytes: (slots * 4) as f64,
            extra_bytes: 0.0,
            blocks: blocks.max(1.0),
            threads,
            dyn_smem: 0,
            in_flight_per_block: None,
            t_tensor: 0.0,
        };
        v.push(predict("moe", "moe", kernel, format!("{slots} slots, {e} experts"), &l)?);
    }
    let rows = |blocks: usize, reads: f64, writes: f64| LaunchShape {
        counted_bytes: reads + writes,
        read_bytes: reads,
        extra_bytes: 0.0,
        blocks: blocks as f64,
        threads: LLK_MOE_ROW_THREADS,
        dyn_smem: 0,
        in_flight_per_block: None,
        t_tensor: 0.0,
    };
    let gather = rows(slots, slots as f64 * row_bytes, slots as f64 * row_bytes);
    v.push(predict(
        "moe",
        "moe",
        "moe_gather_vec_bf16",
        format!("{slots} rows x {h}, scaled by the route weight"),
        &gather,
    )?);
    let active = active_experts(c);
    v.push(grouped_gemm("moe", "kn", true, slots, active, e, h, c.intermediate)?);
    v.push(grouped_gemm("moe", "kn", false, slots, active, e, c.intermediate, h)?);
    let mut shared_up = grouped_gemm("moe", "nk", true, t, 1, 1, h, c.intermediate)?;
    let mut shared_down = grouped_gemm("moe", "nk", false, t, 1, 1, c.intermediate, h)?;
    shared_up.group = "moe shared expert";
    shared_down.group = "moe shared expert";
    v.push(shared_up);
    v.push(shared_down);
    // Combine: the routed rows, the shared expert's output and the residual in; the sum out.
    let combine = rows(t, (slots + 2 * t) as f64 * row_bytes, t as f64 * row_bytes);
    v.push(predict(
        "moe",
        "moe",
        "moe_combine_vec_bf16",
        format!("{t} tokens x top-{} + shared + residual", c.top_k),
        &combine,
    )?);
    Ok(v)
}

/// The decode cases the report prints: Llama 3 8B geometry, batch 1/32/128 at 4k/32k/128k.
pub fn decode_cases() -> Vec<DecodeCase> {
    let mut v = Vec::new();
    for page_bytes in [2, 1] {
        for batch in [1, 32, 128] {
            for context in [4096, 32768, 131072] {
                v.push(DecodeCase { batch, context, q_heads: 32, kv_heads: 8, head_dim: 128, page_bytes });
            }
        }
    }
    v
}

/// Every covered launch at the report's reference shapes.
pub fn coverage() -> Vec<Result<Covered, String>> {
    let mut v = Vec::new();
    for c in decode_cases() {
        match predict_decode(&c) {
            Ok((d, m)) => {
                v.push(Ok(d));
                if let Some(m) = m {
                    v.push(Ok(m));
                }
            }
            Err(e) => v.push(Err(e)),
        }
    }
    for tokens in [128, 16384] {
        v.push(predict_merge_states(tokens, 32, 128));
    }
    for (tokens, fp8) in [(128, false), (128, true), (4096, false)] {
        v.push(predict_kv_append(tokens, 8, 128, fp8));
    }
    for tokens in [1, 4096] {
        for table in [None, Some(QuantFormat::Q8_0), Some(QuantFormat::Q6_K)] {
            v.push(predict_embedding(tokens, 4096, table));
        }
    }
    for tokens in [1, 128, 4096] {
        match predict_moe(&scout_moe(tokens)) {
            Ok(all) => v.extend(all.into_iter().map(Ok)),
            Err(e) => v.push(Err(e)),
        }
    }
    v
}

/// The coverage section of the text report.
pub fn coverage_text() -> String {
    let mut s = String::from(
        "More kernels (decode attention, kv_append, merge, embedding, MoE) -- a MODEL, not a measurement: each launch in the\n\
         calibrated memory model (copy bandwidth, loads in flight, issue slots per loaded byte of the main\n\
         loop) plus a tensor term for HMMA work, and the 4 us launch. Decode: bytes = K/V pages read; splits\n\
         from the op's planner. Grouped GEMM: each active expert's weight read once, FLOP on padded rows at\n\
         the loop's first-order rate. steady: of copy bandwidth without the launch.\n",
    );
    s += &format!(
        "  {:<36} {:<68} {:>6} {:>4} {:>8} {:>7} {:>9} {:>7}  bound\n",
        "kernel", "shape", "splits", "regs", "blocks", "us", "steady", "TFLOP/s"
    );
    for r in coverage() {
        match r {
            Ok(c) => {
                s += &format!(
                    "  {:<36} {:<68} {:>6} {:>4} {:>8.0} {:>7.1} {:>8.0}% {:>7}  {}\n",
                    c.kernel,
                    c.shape,
                    c.splits.map_or("-".into(), |n| n.to_string()),
                    c.registers,
                    c.grid_blocks,
                    1e6 * c.seconds,
                    100.0 * c.steady_fraction,
                    c.tflops.map_or("-".into(), |t| format!("{t:.0}")),
                    c.bound
                )
            }
            Err(e) => s += &format!("  cannot analyze: {e}\n"),
        }
    }
    for k in ["moe_grouped_gemm_kn_swiglu_m16_bf16", "moe_grouped_gemm_kn_swiglu_m64_bf16"] {
        if let Ok(p) = declared_smem(k).and_then(|smem| mma_loop(k, LLK_MOE_GEMM_THREADS, smem)) {
            s += &format!(
                "  {k} main loop: {} HMMA, {:.1} issue slots and {:.0} B of shared memory per HMMA: {} bound at {:.0} TFLOP/s\n\
                 \x20 on its padded rows (first order, {:.2} GHz)\n",
                p.hmma,
                p.slots_per_hmma,
                p.smem_bytes_per_hmma,
                p.bound,
                p.tflops,
                h200::TENSOR_CLOCK_GHZ
            );
        }
    }
    s += "  What it says: the decode (m16) grouped GEMM's loop spends most of its issue slots outside the HMMA, so\n\
          \x20 at one m16 tile per expert it is predicted tensor/issue-bound below the weight stream; fp8 pages halve\n\
          \x20 decode's bytes but their conversions make it issue-bound (no faster than bf16 in this model).\n\
          \x20 Left out: L2 hits (a decode step's K/V and weights exceed L2), the straight-line code's issue slots,\n\
          \x20 tails of the last wave, expert load imbalance (tokens spread evenly over the experts), and a single\n\
          \x20 warp per scheduler (batch-1 decode: 1 block of 4 warps per SM) not issuing every clock.\n\n";
    s
}
