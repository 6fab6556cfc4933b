//! Token sampling (kernels/sampling.cu) on decode-shaped batches of logits: Llama 3's vocabulary
//! (128256) and a 262144 one, greedy, temperature only, top-k, top-p and all filters together.
//! CUDA-event time, and the bytes of ONE read of the logits (the kernel reads a row 1 to 11
//! times, so the fraction of copy bandwidth shows how many passes the configuration costs).
//! Without a GPU this prints why and exits 0.

mod common;

use criterion::{BenchmarkId, Throughput};
use llama_kernels::dev::testing::Rng;
use llama_kernels::ops::ErrorFlag;
use llama_kernels::ops::sampling::{SamplingBatch, sample};
use llama_kernels::spec::sampling::SamplingConfig;
use llama_kernels::{DType, Tensor};

fn main() {
    let Some(device) = common::gpu_or_explain("sampling bench") else { return };
    let copy_gbs = common::copy_bandwidth_gbs(&device);
    let mut c = common::criterion();
    let mut rows = Vec::new();
    let mut group = c.benchmark_group("sampling");
    let configs = [
        ("greedy", SamplingConfig::GREEDY),
        ("temperature", SamplingConfig::with_temperature(0.8)),
        ("top_k 50", SamplingConfig { top_k: 50, ..SamplingConfig::with_temperature(0.8) }),
        ("top_p 0.9", SamplingConfig { top_p: 0.9, ..SamplingConfig::with_temperature(0.8) }),
        ("k50 p0.9 min_p0.05", SamplingConfig { temperature: 0.8, top_k: 50, top_p: 0.9, min_p: 0.05 }),
    ];
    let mut rng = Rng::new(1);
    for (dtype, vocab) in [(DType::BF16, 128_256usize), (DType::F32, 128_256), (DType::BF16, 262_144)] {
        for batch in [1usize, 32, 256] {
            let host = rng.normal_vec(batch * vocab, 3.0, dtype);
            let logits = Tensor::from_f64(&device, dtype, &host, &[batch, vocab]).expect("alloc");
            let tokens = Tensor::zeros(&device, DType::I32, &[batch]).expect("alloc");
            let errors = ErrorFlag::new(&device).expect("alloc");
            for (name, cfg) in configs {
                let seeds: Vec<u64> = (0..batch as u64).collect();
                let params = SamplingBatch::new(&device, &vec![cfg; batch], &seeds, &seeds).expect("alloc");
                let t = params.tensors();
                let mut run = || sample(&logits, &t, &tokens, &errors);
                let bytes = (batch * vocab * dtype.size()) as f64;
                group.throughput(Throughput::Bytes(bytes as u64));
                group.bench_function(BenchmarkId::new(format!("{name}/{dtype}/v{vocab}"), batch), |b| {
                    b.iter_custom(|iters| common::event_duration(&device, iters, &mut run))
                });
                let us = common::summary_time_us(&device, 100, bytes, &mut run);
                rows.push(common::Row {
                    name: format!("sample {name} {dtype} {batch}x{vocab}"),
                    us,
                    bytes,
                    flops: 0.0,
                });
                errors.check_sampling().expect("no device errors");
            }
        }
    }
    group.finish();
    common::print_memory_table(
        "Sampling summary (CUDA events, mean of 100 launches; bytes = one read of the logits)",
        &rows,
        copy_gbs,
    );
}
