//! Whole-layer predictions (issue 19): one decoder layer of Llama 3 8B, Llama 3 70B (one GPU,
//! bf16) and Llama 4 Scout (MoE: 16 experts top-1 + a shared expert), at decode (batch 1/32/128,
//! 4k context) and prefill (512 and 4096 tokens), stage by stage as `DecoderLayer` runs them, then
//! the step (every layer, the final norm and the LM head), tokens/s and each stage's share.
//!
//! **A model, not a measurement.** Our kernels: the report's models (memory-bound launches in
//! the calibrated memory model, decode attention and the MoE pipeline as in
//! [`super::coverage`], prefill attention by the FA2-calibrated matrix model). Dense GEMMs are
//! cuBLAS, predicted at the public H200 rates issue 19 states: the larger of the FLOP time at 765 TFLOP/s dense bf16
//! (the low end of the 765-786 TFLOP/s cuBLAS reaches at large shapes) and the bytes (weights,
//! activations, output) at the copy bandwidth; optimistic for mid-size shapes, which reach
//! neither. Launch cost per kernel: 4 us without a CUDA graph (the report's launch term,
//! `h200::LAUNCH_US`, the one the memory-bound calibration fitted) and an assumed 1 us with one
//! (the GPU-side gap between dependent kernels a graph does not remove; not measured here). The
//! stage times below are bodies (no launch) plus that cost per launch.
//!
//! **Packed weights** ([`Weights::Packed`], [`predict_step_with`]): batch-1 to 8 decode of the
//! dense models with the projections and the LM head in a format with the tensor-core GEMV,
//! each weight stage the GEMV's steady body from [`super::qlinear_model`] (plus the reduce
//! kernel's launch when it splits `in`; the reduce's own body is left out).

use super::attention_model::{MatrixModel, Workload, predict_launch};
use super::coverage::{
    Covered, DecodeCase, LaunchShape, MoeCase, predict, predict_decode, predict_kv_append, predict_moe,
};
use super::h200;
use super::memory_model::H200;
use super::qlinear_model::predict_mma_gemv;
use llama_kernels::ops::qlinear::MAX_MMA_GEMV_ROWS;
use llama_kernels::spec::quant::{QuantFormat, QuantLayout};

/// cuBLAS dense bf16 rate at large shapes (TFLOP/s), the low end of the public 765-786.
pub const CUBLAS_TFLOPS: f64 = 765.0;
/// Launch cost per kernel without and with a CUDA graph (microseconds); see the module docs.
pub const LAUNCH_EAGER_US: f64 = h200::LAUNCH_US;
pub const LAUNCH_GRAPH_US: f64 = 1.0;
/// H200 memory (bytes), for whether a model and its KV cache fit.
pub const HBM_BYTES: f64 = 141e9;

/// A model's geometry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerConfig {
    pub name: &'static str,
    pub hidden: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Dense FFN intermediate, or the expert (and shared expert) intermediate.
    pub intermediate: usize,
    /// MoE: routed experts and top-k (0: dense).
    pub experts: usize,
    pub top_k: usize,
    pub layers: usize,
    pub vocab: usize,
}

pub const LLAMA3_8B: LayerConfig = LayerConfig {
    name: "Llama 3 8B",
    hidden: 4096,
    q_heads: 32,
    kv_heads: 8,
    head_dim: 128,
    intermediate: 14336,
    experts: 0,
    top_k: 0,
    layers: 32,
    vocab: 128256,
};
pub const LLAMA3_70B: LayerConfig = LayerConfig {
    name: "Llama 3 70B",
    hidden: 8192,
    q_heads: 64,
    kv_heads: 8,
    head_dim: 128,
    intermediate: 28672,
    experts: 0,
    top_k: 0,
    layers: 80,
    vocab: 128256,
};
/// Llama 4 Scout (Llama4TextConfig: hidden 5120, 40/8 heads, 16 experts top-1, intermediate
/// 8192 for the experts and the shared expert, 48 layers, all MoE).
pub const LLAMA4_SCOUT: LayerConfig = LayerConfig {
    name: "Llama 4 Scout",
    hidden: 5120,
    q_heads: 40,
    kv_heads: 8,
    head_dim: 128,
    intermediate: 8192,
    experts: 16,
    top_k: 1,
    layers: 48,
    vocab: 202048,
};

impl LayerConfig {
    /// Parameters (embedding and LM head untied).
    pub fn params(&self) -> f64 {
        let h = self.hidden as f64;
        self.layers as f64 * (self.attn_params() + self.ffn_params(self.experts) + 2.0 * h)
            + 2.0 * self.vocab as f64 * h
            + h
    }

    /// One layer's q/k/v and o projections.
    fn attn_params(&self) -> f64 {
        let h = self.hidden as f64;
        h * ((self.q_heads + 2 * self.kv_heads) * self.head_dim) as f64 + (self.q_heads * self.head_dim) as f64 * h
    }

    /// One layer's FFN with `experts` routed experts present (the dense FFN without experts; else
    /// those experts, the shared one and the router).
    fn ffn_params(&self, experts: usize) -> f64 {
        let (h, i) = (self.hidden as f64, self.intermediate as f64);
        if self.experts == 0 { 3.0 * h * i } else { (experts + 1) as f64 * 3.0 * h * i + h * self.experts as f64 }
    }

    /// Bytes of bf16 weights one decode token reads: every layer's attention, the experts it is
    /// routed to (top-k plus the shared expert) or the dense FFN, the router, and the LM head
    /// (the embedding reads one row).
    pub fn decode_weight_bytes(&self) -> f64 {
        let h = self.hidden as f64;
        2.0 * (self.layers as f64 * (self.attn_params() + self.ffn_params(self.top_k)) + self.vocab as f64 * h)
    }

    /// The batch-1 decode ceiling: the copy bandwidth over [`Self::decode_weight_bytes`] (tok/s).
    pub fn decode_ceiling(&self) -> f64 {
        H200.dram_bytes_per_s / self.decode_weight_bytes()
    }
}

/// How a step's dense weights (projections and LM head) are stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Weights {
    /// bf16, multiplied by cuBLAS.
    Bf16,
    /// Packed in a format with the tensor-core GEMV (decode of at most 8 rows), multiplied by it.
    Packed(QuantFormat),
}

/// One step the report predicts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Phase {
    Decode { batch: usize, context: usize },
    Prefill { tokens: usize },
}

/// One stage of a layer (or of the step's head).
#[derive(Clone, Debug)]
pub struct Stage {
    pub name: String,
    /// "ours" or "cuBLAS".
    pub by: &'static str,
    pub bound: &'static str,
    pub launches: usize,
    /// Body time without any launch cost (seconds).
    pub body: f64,
    /// Stage time per layer (or per step for the head) with the eager and graph launch costs.
    pub eager: f64,
    pub graph: f64,
    /// Reads weights at decode (dense GEMMs, grouped GEMMs).
    pub weight_stage: bool,
    /// Times per step (layers, or 1 for the head).
    pub per_step: usize,
    /// Share of the graph step time.
    pub share: f64,
}

/// A step's prediction.
#[derive(Clone, Debug)]
pub struct StepPrediction {
    pub model: LayerConfig,
    pub phase: Phase,
    pub stages: Vec<Stage>,
    pub layer_eager: f64,
    pub layer_graph: f64,
    pub step_eager: f64,
    pub step_graph: f64,
    pub tokens_per_s_eager: f64,
    pub tokens_per_s_graph: f64,
    pub launches_per_step: usize,
    /// Weights plus the KV cache of the step, and whether they fit one H200.
    pub memory_bytes: f64,
    pub fits: bool,
}

fn stage(name: &str, by: &'static str, bound: &'static str, body: f64, launches: usize, weight: bool) -> Stage {
    let cost = |us: f64| body + launches as f64 * us * 1e-6;
    Stage {
        name: name.to_string(),
        by,
        bound,
        launches,
        body,
        eager: cost(LAUNCH_EAGER_US),
        graph: cost(LAUNCH_GRAPH_US),
        weight_stage: weight,
        per_step: 1,
        share: 0.0,
    }
}

/// A cuBLAS GEMM `[m, k] x [k, n]` in bf16; `extra` bytes (a residual read for beta = 1).
pub fn cublas(name: &str, m: usize, n: usize, k: usize, extra: f64) -> Stage {
    let flops = 2.0 * (m * n * k) as f64;
    let bytes = 2.0 * (m * k + k * n + m * n) as f64 + extra;
    let (tf, tb) = (flops / (CUBLAS_TFLOPS * 1e12), bytes / H200.dram_bytes_per_s);
    stage(name, "cuBLAS", if tf > tb { "tensor" } else { "bandwidth" }, tf.max(tb), 1, true)
}

/// The projection `[m, k] x [k, n]` with the weight as `weights` stores it: cuBLAS for bf16, the
/// tensor-core GEMV's steady body for a packed weight (two launches when it splits `in`: the
/// GEMV and its reduce).
fn projection(name: &str, weights: Weights, m: usize, n: usize, k: usize, extra: f64) -> Result<Stage, String> {
    match weights {
        Weights::Bf16 => Ok(cublas(name, m, n, k, extra)),
        Weights::Packed(format) => {
            let g = predict_mma_gemv(format, "layer", n, k, m)?;
            let launches = if g.split > 1 { 2 } else { 1 };
            Ok(stage(name, "ours", g.memory.bound, g.memory.seconds - g.memory.t_launch, launches, true))
        }
    }
}

fn ours(name: &str, c: &Covered, weight: bool) -> Stage {
    stage(name, "ours", c.bound, c.body_seconds, 1, weight)
}

/// A memory-bound kernel of ours over `rows` rows (bytes per row read and written).
fn rows_kernel(
    module: &'static str,
    kernel: &str,
    rows: usize,
    read: f64,
    written: f64,
    threads: u32,
) -> Result<Covered, String> {
    let l = LaunchShape {
        counted_bytes: rows as f64 * (read + written),
        read_bytes: rows as f64 * read,
        extra_bytes: 0.0,
        blocks: rows as f64,
        threads,
        dyn_smem: 0,
        in_flight_per_block: None,
        t_tensor: 0.0,
    };
    predict("layer", module, kernel, format!("{rows} rows"), &l)
}

/// Our prefill attention kernel as the matrix model sees it: its calibrated loop model and blocks
/// per SM (`perf::prefill_attention_model` reads them from the SASS).
pub type PrefillAttention = (MatrixModel, u32);

/// Prefill attention (causal, fresh) of `tokens` tokens: the FA2-calibrated launch model.
fn prefill_attention(cfg: &LayerConfig, tokens: usize, attn: &PrefillAttention) -> Stage {
    let (model, blocks_per_sm) = attn;
    let w = Workload {
        seq: tokens,
        batch: 1,
        heads: cfg.q_heads,
        head_dim: cfg.head_dim,
        causal: true,
        heaviest_first: true,
    };
    let p = predict_launch(model, &w, *blocks_per_sm);
    let flops = 4.0 * (tokens * tokens * cfg.head_dim * cfg.q_heads) as f64 / 2.0;
    let body = (flops / (p.tflops * 1e12) - h200::LAUNCH_US * 1e-6).max(0.0);
    stage("attention (prefill)", "ours", "tensor, less the softmax chain", body, 1, false)
}

/// The stages of one layer at `phase`.
pub fn layer_stages(
    cfg: &LayerConfig,
    phase: Phase,
    attn: &PrefillAttention,
    weights: Weights,
) -> Result<Vec<Stage>, String> {
    let t = match phase {
        Phase::Decode { batch, .. } => batch,
        Phase::Prefill { tokens } => tokens,
    };
    let (h, d) = (cfg.hidden, cfg.head_dim);
    let qkv = (cfg.q_heads + 2 * cfg.kv_heads) * d;
    let row = (h * 2) as f64;
    let mut v = vec![ours("rms_norm", &rows_kernel("rms_norm", "rms_norm_vec_bf16", t, row, row, 128)?, false)];
    v.push(projection("qkv", weights, t, qkv, h, 0.0)?);
    let (rope_kernel, threads) =
        if cfg.experts > 0 { ("rope_interleaved_norm_vec_bf16", 256) } else { ("rope_half_split_vec_bf16", 320) };
    let rope_row = ((cfg.q_heads + cfg.kv_heads) * d * 2) as f64;
    v.push(ours("rope", &rows_kernel("rope", rope_kernel, t, rope_row, rope_row, threads)?, false));
    v.push(ours("kv_append", &predict_kv_append(t, cfg.kv_heads, d, false)?, false));
    match phase {
        Phase::Decode { batch, context } => {
            let c =
                DecodeCase { batch, context, q_heads: cfg.q_heads, kv_heads: cfg.kv_heads, head_dim: d, page_bytes: 2 };
            let (dec, merge) = predict_decode(&c)?;
            v.push(ours("attention (decode)", &dec, false));
            if let Some(m) = merge {
                v.push(ours("attention merge", &m, false));
            }
        }
        Phase::Prefill { tokens } => v.push(prefill_attention(cfg, tokens, attn)),
    }
    v.push(projection("o_proj", weights, t, h, cfg.q_heads * d, 0.0)?);
    v.push(ours(
        "fused_add_rms_norm",
        &rows_kernel("rms_norm", "fused_add_rms_norm_vec_bf16", t, 2.0 * row, 2.0 * row, 128)?,
        false,
    ));
    if cfg.experts == 0 {
        let i = cfg.intermediate;
        v.push(projection("gate_up", weights, t, 2 * i, h, 0.0)?);
        let sw = LaunchShape {
            counted_bytes: (t * i * 6) as f64,
            read_bytes: (t * i * 4) as f64,
            extra_bytes: 0.0,
            blocks: ((t * i) as f64 / 8.0 / 256.0).ceil().max(1.0),
            threads: 256,
            dyn_smem: 0,
            in_flight_per_block: None,
            t_tensor: 0.0,
        };
        v.push(ours("swiglu", &predict("layer", "swiglu", "swiglu_vec_bf16", format!("{t} x {i}"), &sw)?, false));
        v.push(projection("down (+ residual)", weights, t, h, i, row * t as f64)?);
    } else if weights != Weights::Bf16 {
        return Err("packed experts: the MoE GEMMs read bf16 weights".into());
    } else {
        let moe =
            MoeCase { tokens: t, hidden: h, experts: cfg.experts, top_k: cfg.top_k, intermediate: cfg.intermediate };
        for c in predict_moe(&moe)? {
            let name = match c.kernel.as_str() {
                k if c.group == "moe router" => format!("router ({k})"),
                k if c.group == "moe shared expert" => format!("shared expert ({k})"),
                k => k.trim_end_matches("_bf16").to_string(),
            };
            let weight = c.kernel.starts_with("moe_grouped_gemm");
            v.push(ours(&name, &c, weight));
        }
    }
    Ok(v)
}

/// One step: every layer, then the final norm and the LM head on the rows asked for (every
/// sequence at decode, the last token at prefill).
pub fn predict_step(cfg: &LayerConfig, phase: Phase, attn: &PrefillAttention) -> Result<StepPrediction, String> {
    predict_step_with(cfg, phase, attn, Weights::Bf16)
}

/// [`predict_step`] with the dense weights stored as `weights` (packed: decode of at most
/// `MAX_MMA_GEMV_ROWS` sequences of a dense model; the embedding stays a bf16 table).
pub fn predict_step_with(
    cfg: &LayerConfig,
    phase: Phase,
    attn: &PrefillAttention,
    weights: Weights,
) -> Result<StepPrediction, String> {
    if weights != Weights::Bf16 && !matches!(phase, Phase::Decode { batch: 1..=MAX_MMA_GEMV_ROWS, .. }) {
        return Err(format!("packed weights: decode of 1 to {MAX_MMA_GEMV_ROWS} sequences only"));
    }
    let mut stages = layer_stages(cfg, phase, attn, weights)?;
    let sum = |f: &dyn Fn(&Stage) -> f64, s: &[Stage]| s.iter().map(f).sum::<f64>();
    let (layer_eager, layer_graph) = (sum(&|s| s.eager, &stages), sum(&|s| s.graph, &stages));
    for s in &mut stages {
        s.per_step = cfg.layers;
    }
    let (rows, tokens, kv_tokens) = match phase {
        Phase::Decode { batch, context } => (batch, batch, batch * context),
        Phase::Prefill { tokens } => (1, tokens, tokens),
    };
    let row = (cfg.hidden * 2) as f64;
    stages.push(ours("final norm", &rows_kernel("rms_norm", "rms_norm_vec_bf16", rows, row, row, 128)?, false));
    stages.push(projection("lm_head", weights, rows, cfg.vocab, cfg.hidden, 0.0)?);
    let total = |f: &dyn Fn(&Stage) -> f64| stages.iter().map(|s| f(s) * s.per_step as f64).sum::<f64>();
    let (step_eager, step_graph) = (total(&|s| s.eager), total(&|s| s.graph));
    for s in &mut stages {
        s.share = s.graph * s.per_step as f64 / step_graph;
    }
    let launches_per_step = stages.iter().map(|s| s.launches * s.per_step).sum();
    let kv = (cfg.layers * kv_tokens * cfg.kv_heads * cfg.head_dim * 2 * 2) as f64;
    let memory_bytes = match weights {
        Weights::Bf16 => 2.0 * cfg.params(),
        Weights::Packed(format) => {
            // The projections and the LM head at the format's bytes per weight, the rest bf16.
            let bits =
                QuantLayout::new(format, format.default_block(), 1, 4096).map_err(|e| e.to_string())?.bits_per_weight();
            let h = cfg.hidden as f64;
            let packed = cfg.layers as f64 * (cfg.attn_params() + cfg.ffn_params(cfg.experts)) + cfg.vocab as f64 * h;
            packed * bits / 8.0 + 2.0 * (cfg.params() - packed)
        }
    } + kv;
    Ok(StepPrediction {
        model: *cfg,
        phase,
        stages,
        layer_eager,
        layer_graph,
        step_eager,
        step_graph,
        tokens_per_s_eager: tokens as f64 / step_eager,
        tokens_per_s_graph: tokens as f64 / step_graph,
        launches_per_step,
        memory_bytes,
        fits: memory_bytes <= HBM_BYTES,
    })
}

/// The packed formats the report's packed-decode line shows (GGUF's common 4-bit files and QLoRA's NF4).
pub const PACKED_FORMATS: [QuantFormat; 3] = [QuantFormat::Q4_0, QuantFormat::Q4_K, QuantFormat::NF4];

/// The phases the report predicts.
pub const PHASES: [Phase; 5] = [
    Phase::Decode { batch: 1, context: 4096 },
    Phase::Decode { batch: 32, context: 4096 },
    Phase::Decode { batch: 128, context: 4096 },
    Phase::Prefill { tokens: 512 },
    Phase::Prefill { tokens: 4096 },
];

pub const MODELS: [LayerConfig; 3] = [LLAMA3_8B, LLAMA3_70B, LLAMA4_SCOUT];

/// Every model at every phase.
pub fn layer_predictions(attn: &PrefillAttention) -> Vec<(LayerConfig, Phase, Result<StepPrediction, String>)> {
    MODELS.iter().flat_map(|m| PHASES.iter().map(move |&p| (*m, p, predict_step(m, p, attn)))).collect()
}

/// Published figures near these predictions, with how far they are from comparable.
pub const PEER_FIGURES: &[(&str, &str)] = &[
    (
        "No citable bf16, single-H200 figure for Llama 3 8B/70B or a Scout layer at these batch and context sizes was found.",
        "searched: vLLM, SGLang, TensorRT-LLM performance pages and NIM benchmarks (most are FP8, multi-GPU or at saturation)",
    ),
    (
        "Nearest, not comparable: TensorRT-LLM v0.5.0 on one H200, Llama 2 70B FP8, batch 32, 2048 in / 128 out: 303 output tok/s",
        "https://raw.githubusercontent.com/NVIDIA/TensorRT-LLM/release/0.5.0/docs/source/blogs/H200launch.md (preliminary, FP8 weights)",
    ),
];

fn phase_text(p: Phase) -> String {
    match p {
        Phase::Decode { batch, context } => format!("decode b{batch} {}k", context / 1024),
        Phase::Prefill { tokens } => format!("prefill {tokens}"),
    }
}

/// The layer section of the text report (`attn`: [`PrefillAttention`], or why it is missing).
pub fn layer_text(attn: Result<PrefillAttention, String>) -> String {
    let attn = match attn {
        Ok(a) => a,
        Err(e) => return format!("Whole-layer predictions: cannot predict: {e}\n\n"),
    };
    let mut s = format!(
        "Whole-layer predictions (H200, bf16) -- a MODEL, not a measurement. Our kernels from the models above;\n\
         dense GEMMs as cuBLAS: max(FLOP at {CUBLAS_TFLOPS:.0} TFLOP/s, bytes at the copy bandwidth). Launch cost per kernel:\n\
         {LAUNCH_EAGER_US:.0} us eager (the report's launch term), {LAUNCH_GRAPH_US:.0} us in a CUDA graph (assumed). Step = layers + final norm\n\
         + LM head (decode: every sequence; prefill: the last token). Scout: every layer MoE, RoPE on all (NoPE layers\n\
         skip one small launch). fits: bf16 weights + this step's KV cache within 141 GB.\n"
    );
    s += &format!(
        "  {:<14} {:<16} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8} {:>5}  top stages (share of the graph step)\n",
        "model", "phase", "layer us", "graph us", "step ms", "graph ms", "tok/s", "graph tok/s", "launches", "fits"
    );
    for (m, p, r) in layer_predictions(&attn) {
        match r {
            Ok(sp) => {
                let mut top: Vec<&Stage> = sp.stages.iter().collect();
                top.sort_by(|a, b| b.share.total_cmp(&a.share));
                let top: Vec<String> =
                    top.iter().take(3).map(|s| format!("{} {:.0}%", s.name, 100.0 * s.share)).collect();
                s += &format!(
                    "  {:<14} {:<16} {:>9.1} {:>9.1} {:>9.2} {:>9.2} {:>10.0} {:>10.0} {:>8} {:>5}  {}\n",
                    m.name,
                    phase_text(p),
                    1e6 * sp.layer_eager,
                    1e6 * sp.layer_graph,
                    1e3 * sp.step_eager,
                    1e3 * sp.step_graph,
                    sp.tokens_per_s_eager,
                    sp.tokens_per_s_graph,
                    sp.launches_per_step,
                    if sp.fits { "yes" } else { "no" },
                    top.join(", ")
                );
            }
            Err(e) => s += &format!("  {} {}: cannot predict: {e}\n", m.name, phase_text(p)),
        }
    }
    for (m, p) in [(LLAMA3_8B, PHASES[0]), (LLAMA4_SCOUT, PHASES[1])] {
        if let Ok(sp) = predict_step(&m, p, &attn) {
            s += &format!("  {} {}, per stage of one layer (us, graph):", m.name, phase_text(p));
            for st in sp.stages.iter().filter(|st| st.per_step > 1) {
                s += &format!(" {} {:.1} [{}];", st.name, 1e6 * st.graph, st.bound);
            }
            s += "\n";
        }
    }
    s += "  Batch-1 decode ceiling (copy bandwidth over the weights a token reads, the experts it is routed to):";
    for m in MODELS {
        let b1 = predict_step(&m, PHASES[0], &attn).map(|p| p.tokens_per_s_graph).unwrap_or(f64::NAN);
        s += &format!(
            " {} {:.0} tok/s (predicted {:.0}, {:.0}%);",
            m.name,
            m.decode_ceiling(),
            b1,
            100.0 * b1 / m.decode_ceiling()
        );
    }
    s += "\n  Batch-1 decode with the projections and LM head packed (the tensor-core GEMV; embedding bf16):";
    for m in [LLAMA3_8B, LLAMA3_70B] {
        let bf16 = predict_step(&m, PHASES[0], &attn).map(|p| p.tokens_per_s_graph).unwrap_or(f64::NAN);
        for format in PACKED_FORMATS {
            if let Ok(p) = predict_step_with(&m, PHASES[0], &attn, Weights::Packed(format)) {
                s += &format!(
                    " {} {format} {:.0} tok/s ({:.1}x bf16, {:.0} GB);",
                    m.name,
                    p.tokens_per_s_graph,
                    p.tokens_per_s_graph / bf16,
                    p.memory_bytes / 1e9
                );
            }
        }
    }
    s += "\nPublished peers on an H200:\n";
    for (what, source) in PEER_FIGURES {
        s += &format!("  {what}\n    ({source})\n");
    }
    s += "  Left out: sampling, the embedding gather, host work between steps, cuBLAS below its large-shape rate at\n\
          \x20 mid-size shapes, L2 reuse between stages, multi-GPU (70B and Scout in bf16 need two GPUs for a real KV cache);\n\
          \x20 prefill attention is the contiguous hot path of the matrix model (the layer reads K/V from pages, a cold path).\n\n";
    s
}
