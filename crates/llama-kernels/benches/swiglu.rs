//! SwiGLU on Llama 3 8B's MLP (ffn 14336), packed (one fused gate-up GEMM output) and separate:
//! CUDA-event time, bytes, GB/s and the fraction of copy bandwidth measured in the same run.
//!
//! Bytes per call: reads gate and up, writes out: 3 * tokens * d * size.
//! Without a GPU this prints why and exits 0.

mod common;

use criterion::{BenchmarkId, Throughput};
use llama_kernels::ops::swiglu::{GateUp, swiglu};
use llama_kernels::{DType, Tensor};

fn main() {
    let Some(device) = common::gpu_or_explain("swiglu bench") else { return };
    let copy_gbs = common::copy_bandwidth_gbs(&device);
    let mut c = common::criterion();
    let mut rows = Vec::new();
    let mut group = c.benchmark_group("swiglu");
    let d = 14336usize;
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for packed in [true, false] {
            for tokens in [1usize, 16, 512, 4096, 16384] {
                if dtype != DType::BF16 && tokens != 4096 {
                    continue;
                }
                let gate_up = Tensor::zeros(&device, dtype, &[tokens, 2 * d]).expect("alloc");
                let gate = Tensor::zeros(&device, dtype, &[tokens, d]).expect("alloc");
                let up = Tensor::zeros(&device, dtype, &[tokens, d]).expect("alloc");
                let out = Tensor::zeros(&device, dtype, &[tokens, d]).expect("alloc");
                let mut run = || {
                    if packed {
                        swiglu(GateUp::GateThenUp(&gate_up), &out)
                    } else {
                        swiglu(GateUp::Separate { gate: &gate, up: &up }, &out)
                    }
                };
                let bytes = 3.0 * (tokens * d * dtype.size()) as f64;
                let form = if packed { "packed" } else { "separate" };
                group.throughput(Throughput::Bytes(bytes as u64));
                group.bench_function(BenchmarkId::new(format!("{form}/{dtype}/d{d}"), tokens), |b| {
                    b.iter_custom(|iters| common::event_duration(&device, iters, &mut run))
                });
                let us = common::summary_time_us(&device, 200, bytes, &mut run);
                rows.push(common::Row { name: format!("swiglu {dtype} {tokens}x{d} {form}"), us, bytes, flops: 0.0 });
            }
        }
    }
    group.finish();
    common::print_memory_table(
        "SwiGLU summary (CUDA events, mean of 200 launches, L2 flushed before each when the working set fits in it)",
        &rows,
        copy_gbs,
    );
}
