//! Prefill attention on Llama 3 8B shapes (32 q / 8 kv heads, head_dim 128, bf16), causal and
//! not, batch x seq = 16k tokens at seq 512 .. 16k; head_dim 64; a Llama 4 chunked case; and the
//! GQA packing lever (pack 1 vs the whole group). CUDA-event time and TFLOP/s.
//!
//! Inputs are random (uniform, standard deviation 1, rounded to bf16), and before a shape is
//! timed its output is checked against the f64 reference on 48 sampled rows
//! (`dev::verify::SampledAttention`); a wrong output stops the bench before any speed is
//! reported. `LLK_ATTENTION_SM90=1` selects the Hopper kernel on sm_90.
//!
//! FLOPs, as FlashAttention counts them: 4 * seq^2 * heads * head_dim per sequence (two matmuls),
//! halved for causal; chunked causal counts only the in-chunk causal blocks.
//! Without a GPU this prints why and exits 0.

mod common;

use criterion::{BenchmarkId, Throughput};
use llama_kernels::dev::verify::SampledAttention;
use llama_kernels::ops::attention::{AttentionMask, AttentionOptions, AttentionWorkspace};
use llama_kernels::ops::attention::{AttentionTensors, KvTensors, Offsets};
use llama_kernels::{DType, Device, Tensor};

/// Random bf16 values (as f32, exactly representable) and their device tensor.
fn random_bf16(device: &Device, shape: &[usize], seed: u64) -> (Vec<f32>, Tensor) {
    let mut host = vec![0f32; shape.iter().product()];
    common::par_uniform(&mut host, 1.0, seed);
    let bf: Vec<half::bf16> = host.iter().map(|&x| half::bf16::from_f32(x)).collect();
    let host = bf.iter().map(|x| x.to_f32()).collect();
    (host, Tensor::from_slice(device, &bf, shape).expect("upload"))
}

struct Shape {
    name: String,
    seq: usize,
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    mask: AttentionMask,
    pack: Option<usize>,
}

fn flops(s: &Shape) -> f64 {
    let full = 4.0 * (s.seq * s.seq) as f64 * (s.q_heads * s.head_dim) as f64 * s.batch as f64;
    match s.mask {
        AttentionMask::None => full,
        AttentionMask::Causal => full / 2.0,
        AttentionMask::ChunkedCausal { chunk_size } => {
            let c = chunk_size.min(s.seq) as f64;
            4.0 * (s.seq as f64 / c) * c * c / 2.0 * (s.q_heads * s.head_dim) as f64 * s.batch as f64
        }
    }
}

fn main() {
    let Some(device) = common::gpu_or_explain("attention bench") else { return };
    let mut shapes = Vec::new();
    for mask in [AttentionMask::Causal, AttentionMask::None] {
        for seq in [512usize, 1024, 2048, 4096, 8192, 16384] {
            let m = if mask == AttentionMask::Causal { "causal" } else { "full" };
            shapes.push(Shape {
                name: format!("attention bf16 {m} b{}xs{seq} 32/8x128", 16384 / seq),
                seq,
                batch: 16384 / seq,
                q_heads: 32,
                kv_heads: 8,
                head_dim: 128,
                mask,
                pack: None,
            });
        }
    }
    for seq in [2048usize, 8192] {
        shapes.push(Shape {
            name: format!("attention bf16 causal b{}xs{seq} 32/8x64", 16384 / seq),
            seq,
            batch: 16384 / seq,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 64,
            mask: AttentionMask::Causal,
            pack: None,
        });
    }
    shapes.push(Shape {
        name: "attention bf16 chunk8192 b1xs16384 40/8x128 llama4".into(),
        seq: 16384,
        batch: 1,
        q_heads: 40,
        kv_heads: 8,
        head_dim: 128,
        mask: AttentionMask::ChunkedCausal { chunk_size: 8192 },
        pack: None,
    });
    for pack in [1usize, 4] {
        shapes.push(Shape {
            name: format!("attention bf16 causal b4xs4096 32/8x128 pack{pack}"),
            seq: 4096,
            batch: 4,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            mask: AttentionMask::Causal,
            pack: Some(pack),
        });
    }

    let mut c = common::criterion();
    let mut group = c.benchmark_group("attention");
    let mut rows = Vec::new();
    let mut ws = AttentionWorkspace::plan(&device, 64).expect("workspace");
    for s in &shapes {
        let tokens = s.seq * s.batch;
        let (hq, q) = random_bf16(&device, &[tokens, s.q_heads, s.head_dim], 1);
        let (hk, k) = random_bf16(&device, &[tokens, s.kv_heads, s.head_dim], 2);
        let (hv, v) = random_bf16(&device, &[tokens, s.kv_heads, s.head_dim], 3);
        let out = Tensor::poisoned(&device, DType::BF16, &[tokens, s.q_heads, s.head_dim]).expect("alloc");
        let cu: Vec<i32> = (0..=s.batch).map(|b| (b * s.seq) as i32).collect();
        let opts = AttentionOptions { mask: s.mask, gqa_pack: s.pack, ..Default::default() };
        let mut run = || {
            ws.forward(
                AttentionTensors {
                    q: &q,
                    kv: KvTensors::Contiguous { k: &k, v: &v },
                    cu_seqlens: Offsets::Host { q: &cu, k: &cu },
                    out: &out,
                    lse: None,
                },
                &opts,
            )
        };
        // The output, checked before the shape is timed.
        run().expect("attention");
        let got: Vec<f32> = out.to_vec::<half::bf16>().expect("download").into_iter().map(f32::from).collect();
        let sample = SampledAttention {
            q: &hq,
            k: &hk,
            v: &hv,
            out: &got,
            batch: s.batch,
            seq: s.seq,
            q_heads: s.q_heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            mask: s.mask,
        };
        let check = sample.check(48, DType::BF16, 7);
        let summary = check.describe(&[48, s.head_dim]);
        assert!(check.pass, "{}: the output disagrees with the reference: {summary}", s.name);
        println!("{}: output checked on 48 rows against the reference ({summary})", s.name);
        let f = flops(s);
        group.throughput(Throughput::Elements(f as u64));
        group.bench_function(BenchmarkId::from_parameter(&s.name), |b| {
            b.iter_custom(|iters| common::event_duration(&device, iters, &mut run))
        });
        let us = common::gpu_time_us(&device, 20, &mut run);
        rows.push(common::Row { name: s.name.clone(), us, bytes: 0.0, flops: f });
    }
    group.finish();
    common::print_flops_table(
        "Attention summary (CUDA events, mean of 20 launches; FLOPs as FlashAttention counts)",
        &rows,
    );
}
