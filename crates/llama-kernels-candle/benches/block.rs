//! A Llama 3 8B decoder layer in candle (hidden 4096, 32 q / 8 kv heads of 128, MLP 14336,
//! bf16), forward and backward, with the fused ops and with candle's plain ops from the same
//! weights: wall time per step after warm-up, the device synchronized around each step.
//!
//! Needs the `cuda` feature and a GPU (`cargo bench -p llama-kernels-candle --no-default-features
//! --features cuda --bench block`); otherwise it prints why and exits 0: on the CPU the fused ops
//! run on the emulator, which is for testing, not for speed.

use std::time::Instant;

use candle::{DType, Device, Tensor};
use llama_kernels::ops::rope::RopeConfig;
use llama_kernels_candle::nn::{BlockConfig, LlamaBlock, Ops};

fn main() -> candle::Result<()> {
    let device = match Device::cuda_if_available(0)? {
        d @ Device::Cuda(_) => d,
        _ => {
            println!("candle block bench: no CUDA device (build with --features cuda on a GPU machine); skipped");
            return Ok(());
        }
    };
    let c = BlockConfig {
        hidden: 4096,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 14336,
        eps: 1e-5,
        rope: RopeConfig::llama3_1(128),
    };
    let weights: Vec<Tensor> = LlamaBlock::shapes(&c)
        .iter()
        .map(|s| match s.as_slice() {
            [n] => Tensor::ones(*n, DType::BF16, &device),
            [_, d_in] => {
                let b = 1.0 / (*d_in as f64).sqrt();
                Tensor::rand(-b, b, s.as_slice(), &device)?.to_dtype(DType::BF16)
            }
            _ => candle::bail!("a weight is a vector or a matrix"),
        })
        .collect::<candle::Result<_>>()?;
    println!("| batch x seq | fused ms/step | candle ops ms/step | speed-up |");
    println!("| --- | --- | --- | --- |");
    for (batch, seq) in [(1usize, 2048usize), (4, 1024), (1, 8192)] {
        let x = Tensor::randn(0f32, 1.0, (batch, seq, c.hidden), &device)?.to_dtype(DType::BF16)?;
        let positions = Tensor::new((0..(batch * seq) as i64).map(|i| i % seq as i64).collect::<Vec<_>>(), &device)?;
        let mut ms = Vec::new();
        for ops in [Ops::Fused, Ops::Unfused] {
            let block =
                LlamaBlock::new(c, weights.clone().try_into().map_err(|_| candle::Error::msg("nine weights"))?)?;
            let step = || -> candle::Result<()> {
                let y = block.forward(&x, &positions, ops)?;
                let _grads = y.to_dtype(DType::F32)?.sqr()?.mean_all()?.backward()?;
                Ok(())
            };
            for _ in 0..2 {
                step()?;
            }
            device.synchronize()?;
            let iters = 5;
            let start = Instant::now();
            for _ in 0..iters {
                step()?;
            }
            device.synchronize()?;
            ms.push(start.elapsed().as_secs_f64() * 1e3 / iters as f64);
        }
        println!("| {batch} x {seq} | {:.2} | {:.2} | {:.2}x |", ms[0], ms[1], ms[1] / ms[0]);
    }
    Ok(())
}
