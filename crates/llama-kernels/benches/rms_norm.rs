//! RMSNorm and fused add + RMSNorm: GPU time from CUDA events, bytes moved, GB/s, and the
//! fraction of device-to-device copy bandwidth measured in the same run.
//!
//! Bytes per call (napkin math, the minimum any kernel must move):
//!   rms_norm            2 * tokens * hidden * size (read x, write y) + hidden * size (weight)
//!   fused_add_rms_norm  4 * tokens * hidden * size (read x, residual; write residual, y) + weight
//! Without a GPU this prints why and exits 0.

mod common;

use criterion::{BenchmarkId, Throughput};
use llama_kernels::{DType, Tensor, ops};

fn main() {
    let Some(device) = common::gpu_or_explain("rms_norm bench") else { return };
    let copy_gbs = common::copy_bandwidth_gbs(&device);
    let mut c = common::criterion();
    let mut rows = Vec::new();
    for fused in [false, true] {
        let op = if fused { "fused_add_rms_norm" } else { "rms_norm" };
        let mut group = c.benchmark_group(op);
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for hidden in [4096usize, 8192] {
                for tokens in [1usize, 16, 512, 4096, 16384] {
                    let x = Tensor::zeros(&device, dtype, &[tokens, hidden]).expect("alloc");
                    let r = Tensor::zeros(&device, dtype, &[tokens, hidden]).expect("alloc");
                    let y = Tensor::zeros(&device, dtype, &[tokens, hidden]).expect("alloc");
                    let w = Tensor::zeros(&device, dtype, &[hidden]).expect("alloc");
                    let mut run = || {
                        if fused {
                            ops::fused_add_rms_norm(&x, &r, &w, 1e-5, &y)
                        } else {
                            ops::rms_norm(&x, &w, 1e-5, &y)
                        }
                    };
                    let size = dtype.size() as f64;
                    let per_row = if fused { 4.0 } else { 2.0 };
                    let bytes = per_row * (tokens * hidden) as f64 * size + hidden as f64 * size;
                    group.throughput(Throughput::Bytes(bytes as u64));
                    group.bench_function(BenchmarkId::new(format!("{dtype}/h{hidden}"), tokens), |b| {
                        b.iter_custom(|iters| common::event_duration(&device, iters, &mut run))
                    });
                    let us = common::summary_time_us(&device, 200, bytes, &mut run);
                    rows.push(common::Row { name: format!("{op} {dtype} {tokens}x{hidden}"), us, bytes, flops: 0.0 });
                }
            }
        }
        group.finish();
    }
    common::print_memory_table(
        "RMSNorm summary (CUDA events, mean of 200 launches, L2 flushed before each when the working set fits in it)",
        &rows,
        copy_gbs,
    );
}
