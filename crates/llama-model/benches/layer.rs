//! One decoder layer through the block composer, on Llama 3 8B and Llama 4 layer shapes (bf16):
//! prefill of 512 and 4096 tokens (one sequence), and decode of batch 1, 32 and 128 at a 4k
//! context. CUDA-event time per layer, tokens per second, the share of time per stage (events
//! recorded between stages), and the fraction of the copy bandwidth for decode (weights + KV
//! cache read once).
//!
//! Llama 4 shapes: hidden 5120, 40 q / 8 kv heads, head_dim 128; a RoPE layer (chunked
//! attention, qk-norm) and a NoPE layer (temperature tuning), each with a dense MLP of 16384
//! (Maverick's dense layers), and a Scout MoE layer (16 experts of 8192, top-1, a shared expert;
//! its decode bandwidth counts the experts a step can touch, at most min(16, batch)).
//!
//! Without a GPU this prints why and exits 0.

#[path = "../../llama-kernels/benches/common/mod.rs"]
mod common;

use criterion::{BenchmarkId, Throughput};
use cudarc::driver::sys::CUevent_flags;
use llama_kernels::{DType, Device, Tensor};
use llama_model::Result;
use llama_model::block::{DecoderLayer, FfnSpec, HostLayerWeights, KvCache, LayerSpec, LayerWorkspace, Step};
use llama_model::formats::ModelConfig;

const LLAMA3_8B: &str = r#"{"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
  "num_key_value_heads": 8, "intermediate_size": 14336, "num_hidden_layers": 32, "rms_norm_eps": 1e-5,
  "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#;

const LLAMA4_SCOUT: &str = r#"{"model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40,
  "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
  "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
  "num_hidden_layers": 4, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "attention_chunk_size": 8192,
  "no_rope_layers": [1, 1, 1, 0], "use_qk_norm": true, "attn_temperature_tuning": true,
  "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
  "original_max_position_embeddings": 8192}}"#;

const LLAMA4: &str = r#"{"model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40,
  "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
  "num_hidden_layers": 4, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "attention_chunk_size": 8192,
  "no_rope_layers": [1, 1, 1, 0], "moe_layers": [], "use_qk_norm": true, "attn_temperature_tuning": true,
  "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
  "original_max_position_embeddings": 8192}}"#;

struct Case {
    name: String,
    spec: LayerSpec,
    /// Decode batch (one new token per sequence at `context`), or None for a prefill of `tokens`.
    decode: Option<usize>,
    tokens: usize,
    context: usize,
}

/// Weight bytes (bf16) one forward reads: attention, and the dense MLP or the router, the
/// shared expert and the experts the step's tokens can touch (at most min(E, tokens * k)).
fn weight_bytes(c: &Case) -> f64 {
    let s = &c.spec;
    let h = s.hidden as f64;
    let attn = h * s.qkv_dim() as f64 + (s.q_heads * s.head_dim) as f64 * h + 2.0 * h;
    let ffn = match s.ffn {
        FfnSpec::Dense { intermediate: i, .. } => 3.0 * h * i as f64,
        FfnSpec::Moe { experts, top_k, intermediate: i } => {
            let touched = experts.min(c.tokens * top_k) as f64;
            h * experts as f64 + 3.0 * h * i as f64 * (1.0 + touched)
        }
    };
    2.0 * (attn + ffn)
}

fn flops(c: &Case) -> f64 {
    let s = &c.spec;
    let (h, i, qd) = (s.hidden as f64, s.intermediate() as f64, (s.q_heads * s.head_dim) as f64);
    let t = c.tokens as f64;
    // Per token: the dense MLP, or the router + k experts + the shared expert.
    let ffn = match s.ffn {
        FfnSpec::Dense { .. } => 3.0 * h * i,
        FfnSpec::Moe { experts, top_k, .. } => h * experts as f64 + 3.0 * h * i * (top_k + 1) as f64,
    };
    let gemm = 2.0 * t * (h * s.qkv_dim() as f64 + qd * h + ffn);
    let attn = match c.decode {
        Some(_) => 4.0 * t * (c.context + 1) as f64 * qd,
        None => 2.0 * t * t * qd, // causal: half of 4 t^2 qd
    };
    gemm + attn
}

/// The layer, its cache and workspace, and a planned step.
fn setup(device: &Device, c: &Case) -> Result<(DecoderLayer, KvCache, LayerWorkspace, Step, Tensor)> {
    let host = HostLayerWeights::random(&c.spec, DType::BF16, 1);
    let layer = DecoderLayer::new(device, DType::BF16, c.spec, &host)?;
    let slots = c.decode.unwrap_or(1);
    let mut cache = KvCache::for_layers(device, DType::BF16, &[c.spec], slots, c.context + c.tokens.max(1))?;
    let mut ws = LayerWorkspace::plan(device, DType::BF16, &[c.spec], c.tokens, &cache)?;
    let batch: Vec<(usize, usize)> = match c.decode {
        Some(b) => {
            for s in 0..b {
                cache.assume_cached(s, c.context)?;
            }
            (0..b).map(|s| (s, 1)).collect()
        }
        None => vec![(0, c.tokens)],
    };
    let step = ws.begin_step(&mut cache, &batch)?;
    let hidden = Tensor::zeros(device, DType::BF16, &[c.tokens, c.spec.hidden])?;
    Ok((layer, cache, ws, step, hidden))
}

/// Per-stage GPU time (us), from events recorded between the stages of `iters` forwards.
fn stage_times(device: &Device, c: &Case, iters: usize) -> Result<Vec<(&'static str, f64)>> {
    let (layer, cache, mut ws, step, hidden) = setup(device, c)?;
    let stream =
        device.cuda_stream().cloned().ok_or_else(|| llama_kernels::Error::CudaUnavailable("no stream".into()))?;
    let ctx = stream.context().clone();
    let mut totals: Vec<(&'static str, f64)> = Vec::new();
    for _ in 0..iters {
        let start = cuda(ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)))?;
        cuda(start.record(&stream))?;
        let mut events = Vec::new();
        layer.forward_with_marks(&mut ws, &cache, 0, &step, &hidden, &mut |stage| {
            let e = cuda(ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)))?;
            cuda(e.record(&stream))?;
            events.push((stage, e));
            Ok(())
        })?;
        device.synchronize()?;
        let mut prev = &start;
        for (i, (stage, e)) in events.iter().enumerate() {
            let us = f64::from(cuda(prev.elapsed_ms(e))?) * 1e3;
            if totals.len() <= i {
                totals.push((stage, 0.0));
            }
            totals[i].1 += us / iters as f64;
            prev = e;
        }
    }
    Ok(totals)
}

fn main() {
    let Some(device) = common::gpu_or_explain("layer bench") else { return };
    let copy_gbs = common::copy_bandwidth_gbs(&device);
    let llama3 = ModelConfig::from_json(LLAMA3_8B).expect("config");
    let llama4 = ModelConfig::from_json(LLAMA4).expect("config");
    let specs = [
        ("llama3-8b", llama3.layer(0).expect("layer")),
        ("llama4 rope", llama4.layer(0).expect("layer")),
        ("llama4 nope", llama4.layer(3).expect("layer")),
        ("llama4-scout moe", ModelConfig::from_json(LLAMA4_SCOUT).expect("config").layer(0).expect("layer")),
    ];
    let mut cases = Vec::new();
    for (name, spec) in &specs {
        for tokens in [512usize, 4096] {
            cases.push(Case {
                name: format!("{name} prefill {tokens}"),
                spec: *spec,
                decode: None,
                tokens,
                context: 0,
            });
        }
        for b in [1usize, 32, 128] {
            cases.push(Case {
                name: format!("{name} decode b{b} ctx4096"),
                spec: *spec,
                decode: Some(b),
                tokens: b,
                context: 4096,
            });
        }
    }

    let mut c = common::criterion();
    let mut group = c.benchmark_group("layer");
    let mut rows = Vec::new();
    let mut shares = Vec::new();
    for case in &cases {
        let (layer, cache, mut ws, step, hidden) = match setup(&device, case) {
            Ok(s) => s,
            Err(e) => {
                println!("{}: not run: {e}", case.name);
                continue;
            }
        };
        let mut run = || layer.forward(&mut ws, &cache, 0, &step, &hidden);
        group.throughput(Throughput::Elements(case.tokens as u64));
        group.bench_function(BenchmarkId::from_parameter(&case.name), |b| {
            b.iter_custom(|iters| common::event_duration(&device, iters, &mut run))
        });
        let us = common::gpu_time_us(&device, 20, &mut run);
        let kv_bytes = case
            .decode
            .map_or(0.0, |b| (b * (case.context + 1) * 2 * case.spec.kv_heads * case.spec.head_dim * 2) as f64);
        rows.push((case.name.clone(), us, case.tokens, flops(case), weight_bytes(case) + kv_bytes));
        if let Ok(st) = stage_times(&device, case, 5) {
            shares.push((case.name.clone(), st));
        }
    }
    group.finish();

    println!("\nLayer summary (CUDA events, mean of 20 forwards; bf16)");
    println!("{:<36} {:>10} {:>12} {:>9} {:>9} {:>8}", "case", "us/layer", "tokens/s", "TFLOP/s", "GB/s", "% copy");
    for (name, us, tokens, f, bytes) in &rows {
        let gbs = bytes / (us * 1e-6) / 1e9;
        println!(
            "{:<36} {:>10.1} {:>12.0} {:>9.1} {:>9.0} {:>7.1}%",
            name,
            us,
            *tokens as f64 / (us * 1e-6),
            f / (us * 1e-6) / 1e12,
            gbs,
            100.0 * gbs / copy_gbs
        );
    }
    println!("\nShare of time per stage (events between stages, mean of 5 forwards)");
    for (name, st) in &shares {
        let total: f64 = st.iter().map(|s| s.1).sum();
        let parts: Vec<String> = st.iter().map(|(s, us)| format!("{s} {:.0}%", 100.0 * us / total.max(1e-9))).collect();
        println!("{name:<36} {total:>9.1} us: {}", parts.join(", "));
    }
}

/// A CUDA driver call's result as this crate's.
fn cuda<T>(r: std::result::Result<T, cudarc::driver::DriverError>) -> Result<T> {
    r.map_err(|e| llama_kernels::Error::from(e).into())
}
