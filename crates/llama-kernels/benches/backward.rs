//! The backward ops a QLoRA step runs most, at Llama 3 8B shapes (bf16): CUDA-event time and
//! TFLOP/s.
//!
//! - Attention backward (`AttentionWorkspace::backward`: dQ, then dK/dV), 32 q / 8 kv heads,
//!   head_dim 128, causal, batch x seq = 16k tokens at seq 512 .. 16k, and head_dim 64 at seq
//!   4096. FLOPs as FlashAttention counts a backward: 2.5 times the forward's, i.e.
//!   10 * seq^2 * heads * head_dim per sequence, halved for causal (our kernels run 7/5 of that:
//!   S and dP are recomputed in both launches).
//! - The input gradient through a frozen NF4 weight (`qlinear_backward_input`, the packed bytes
//!   on tensor cores) next to the dense bf16 product (`linear_backward_input`, cuBLAS) of the same
//!   shape: the q/o (4096 x 4096), gate/up (14336 x 4096) and down (4096 x 14336) projections at
//!   4096 tokens. FLOPs 2 * tokens * out * in.
//!
//! Inputs are random (uniform, standard deviation 1; weights scaled by 1/sqrt(in)); each shape
//! runs once and its gradients are checked to be finite before it is timed (their values are
//! checked against the f64 reference by the test suite and `verify`, not here).
//! Without a GPU this prints why and exits 0.

mod common;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Throughput};
use llama_kernels::ops::attention::{
    AttentionBackwardTensors, AttentionMask, AttentionOptions, AttentionTensors, AttentionWorkspace, KvTensors, Offsets,
};
use llama_kernels::ops::linear_backward::linear_backward_input;
use llama_kernels::ops::qlinear::QWeight;
use llama_kernels::ops::qlinear_backward::qlinear_backward_input;
use llama_kernels::spec::quant::PackedWeight;
use llama_kernels::{DType, Device, Tensor};

/// Random values of standard deviation `std` rounded to bf16, on the device; and the f32 host copy.
fn random_bf16(device: &Device, shape: &[usize], std: f64, seed: u64) -> (Vec<f32>, Tensor) {
    let mut host = vec![0f32; shape.iter().product()];
    common::par_uniform(&mut host, std, seed);
    let bf: Vec<half::bf16> = host.iter().map(|&x| half::bf16::from_f32(x)).collect();
    (bf.iter().map(|x| x.to_f32()).collect(), Tensor::from_slice(device, &bf, shape).expect("upload"))
}

type Group<'a> = BenchmarkGroup<'a, WallTime>;

fn assert_finite(what: &str, t: &Tensor) {
    let bad = t.to_f64_vec().expect("download").iter().filter(|v| !v.is_finite()).count();
    assert_eq!(bad, 0, "{what}: {bad} non-finite gradient values");
}

fn attention(device: &Device, group: &mut Group<'_>, rows: &mut Vec<common::Row>) {
    let mut ws = AttentionWorkspace::plan(device, 64).expect("workspace");
    let (q_heads, kv_heads) = (32usize, 8usize);
    let mut shapes: Vec<(usize, usize)> = [512usize, 2048, 4096, 16384].iter().map(|&s| (s, 128)).collect();
    shapes.push((4096, 64));
    for (seq, head_dim) in shapes {
        let batch = 16384 / seq;
        let tokens = batch * seq;
        let name = format!("attention backward bf16 causal b{batch}xs{seq} {q_heads}/{kv_heads}x{head_dim}");
        let (_, q) = random_bf16(device, &[tokens, q_heads, head_dim], 1.0, 1);
        let (_, k) = random_bf16(device, &[tokens, kv_heads, head_dim], 1.0, 2);
        let (_, v) = random_bf16(device, &[tokens, kv_heads, head_dim], 1.0, 3);
        let (_, d_out) = random_bf16(device, &[tokens, q_heads, head_dim], 1.0, 4);
        let out = Tensor::zeros(device, DType::BF16, &[tokens, q_heads, head_dim]).expect("alloc");
        let lse = Tensor::zeros(device, DType::F32, &[q_heads, tokens]).expect("alloc");
        let (dq, dk, dv) = (
            Tensor::zeros(device, DType::BF16, &[tokens, q_heads, head_dim]).expect("alloc"),
            Tensor::zeros(device, DType::BF16, &[tokens, kv_heads, head_dim]).expect("alloc"),
            Tensor::zeros(device, DType::BF16, &[tokens, kv_heads, head_dim]).expect("alloc"),
        );
        let cu: Vec<i32> = (0..=batch).map(|b| (b * seq) as i32).collect();
        let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
        let kv = KvTensors::Contiguous { k: &k, v: &v };
        let offsets = Offsets::Host { q: &cu, k: &cu };
        ws.forward(AttentionTensors { q: &q, kv, cu_seqlens: offsets, out: &out, lse: Some(&lse) }, &opts)
            .expect("forward");
        let mut run = || {
            let call = AttentionBackwardTensors {
                q: &q,
                k: &k,
                v: &v,
                out: &out,
                lse: &lse,
                d_out: &d_out,
                cu_seqlens: offsets,
                dq: &dq,
                dk: &dk,
                dv: &dv,
            };
            ws.backward(call, &opts)
        };
        run().expect("attention backward");
        for (what, t) in [("dq", &dq), ("dk", &dk), ("dv", &dv)] {
            assert_finite(&format!("{name} {what}"), t);
        }
        let flops = 10.0 * (seq * seq) as f64 * (q_heads * head_dim) as f64 * batch as f64 / 2.0;
        group.throughput(Throughput::Elements(flops as u64));
        group.bench_function(BenchmarkId::from_parameter(&name), |b| {
            b.iter_custom(|iters| common::event_duration(device, iters, &mut run))
        });
        let us = common::gpu_time_us(device, 20, &mut run);
        rows.push(common::Row { name, us, bytes: 0.0, flops });
    }
}

fn packed_input_gradient(device: &Device, group: &mut Group<'_>, rows: &mut Vec<common::Row>) {
    let tokens = 4096usize;
    for (proj, out, inp) in [("q/o", 4096usize, 4096usize), ("gate/up", 14336, 4096), ("down", 4096, 14336)] {
        let (dense_host, dense) = random_bf16(device, &[out, inp], 1.0 / (inp as f64).sqrt(), 5);
        let w = QWeight::new(device, &PackedWeight::quantize_nf4(out, inp, 64, &dense_host).expect("quantize"))
            .expect("upload");
        let (_, dy) = random_bf16(device, &[tokens, out], 1.0, 6);
        let dx = Tensor::zeros(device, DType::BF16, &[tokens, inp]).expect("alloc");
        let flops = 2.0 * (tokens * out * inp) as f64;
        for packed in [true, false] {
            let name = format!(
                "{} input gradient bf16 {proj} {tokens}x{out} @ {out}x{inp}",
                if packed { "NF4 packed" } else { "dense (cuBLAS)" }
            );
            let mut run = || {
                if packed {
                    qlinear_backward_input(&dy, &w, &dx, false, None)
                } else {
                    linear_backward_input(&dy, &dense, &dx, false)
                }
            };
            run().expect("input gradient");
            assert_finite(&name, &dx);
            group.throughput(Throughput::Elements(flops as u64));
            group.bench_function(BenchmarkId::from_parameter(&name), |b| {
                b.iter_custom(|iters| common::event_duration(device, iters, &mut run))
            });
            let us = common::gpu_time_us(device, 20, &mut run);
            rows.push(common::Row { name, us, bytes: 0.0, flops });
        }
    }
}

fn main() {
    let Some(device) = common::gpu_or_explain("backward bench") else { return };
    let mut c = common::criterion();
    let mut group = c.benchmark_group("backward");
    let mut rows = Vec::new();
    attention(&device, &mut group, &mut rows);
    packed_input_gradient(&device, &mut group, &mut rows);
    group.finish();
    common::print_flops_table(
        "Backward summary (CUDA events, mean of 20 launches; attention FLOPs as FlashAttention counts a backward)",
        &rows,
    );
}
