//! RoPE on Llama 3 8B shapes (32 q / 8 kv heads, head_dim 128, half-split, 3.1 scaling) and one
//! Llama 4 Scout shape (40 q / 8 kv, interleaved, qk-norm): CUDA-event time, bytes, GB/s and the
//! fraction of copy bandwidth measured in the same run.
//!
//! Bytes per call: q and k are read and written once: 2 * tokens * (q_heads + kv_heads) *
//! head_dim * size, plus the positions (4 bytes per token) and the frequency table.
//! Without a GPU this prints why and exits 0.

mod common;

use criterion::{BenchmarkId, Throughput};
use llama_kernels::ops::rope::{Rope, RopeConfig};
use llama_kernels::{DType, Tensor};

fn main() {
    let Some(device) = common::gpu_or_explain("rope bench") else { return };
    let copy_gbs = common::copy_bandwidth_gbs(&device);
    let mut c = common::criterion();
    let mut rows = Vec::new();
    let mut group = c.benchmark_group("rope");
    let cases =
        [("llama3", RopeConfig::llama3_1(128), 32usize, 8usize), ("llama4", RopeConfig::llama4_scout(128), 40, 8)];
    for (model, cfg, qh, kh) in cases {
        let rope = Rope::new(&device, cfg).expect("rope table");
        let dtype = DType::BF16;
        let token_counts: &[usize] = if model == "llama3" { &[1, 16, 512, 4096, 16384] } else { &[4096] };
        for &tokens in token_counts {
            let q = Tensor::zeros(&device, dtype, &[tokens, qh, 128]).expect("alloc");
            let k = Tensor::zeros(&device, dtype, &[tokens, kh, 128]).expect("alloc");
            let pos: Vec<i32> = (0..tokens as i32).collect();
            let positions = Tensor::from_slice(&device, &pos, &[tokens]).expect("alloc");
            let mut run = || rope.apply(&q, Some(&k), &positions);
            let bytes = 2.0 * (tokens * (qh + kh) * 128 * 2) as f64 + 4.0 * tokens as f64 + 64.0 * 8.0;
            group.throughput(Throughput::Bytes(bytes as u64));
            group.bench_function(BenchmarkId::new(format!("{model}/{dtype}"), tokens), |b| {
                b.iter_custom(|iters| common::event_duration(&device, iters, &mut run))
            });
            let us = common::summary_time_us(&device, 200, bytes, &mut run);
            let name =
                format!("rope {dtype} {tokens}x({qh}+{kh})x128{}", if model == "llama4" { " llama4" } else { "" });
            rows.push(common::Row { name, us, bytes, flops: 0.0 });
        }
    }
    group.finish();
    common::print_memory_table(
        "RoPE summary (CUDA events, mean of 200 launches, L2 flushed before each when the working set fits in it)",
        &rows,
        copy_gbs,
    );
}
