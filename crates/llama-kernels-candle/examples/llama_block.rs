//! A Llama decoder layer in candle, trained for a few steps with the fused kernels and with
//! candle's plain ops from the same weights: the loss curves agree, and the fused forward and
//! backward run through the kernels (the emulated target on the CPU; with `--features cuda`
//! and a GPU, candle's CUDA tensors).
//!
//! ```sh
//! cargo run --release -p llama-kernels-candle --example llama_block
//! ```

use std::time::Instant;

use candle::{DType, Device, Tensor};
use llama_kernels::ops::rope::RopeConfig;
use llama_kernels_candle::nn::{BlockConfig, LlamaBlock, Ops};

fn main() -> candle::Result<()> {
    let device = if cfg!(feature = "cuda") { Device::cuda_if_available(0)? } else { Device::Cpu };
    let dtype = if device.is_cuda() { DType::BF16 } else { DType::F32 };
    let c = BlockConfig {
        hidden: 128,
        q_heads: 4,
        kv_heads: 2,
        head_dim: 32,
        intermediate: 256,
        eps: 1e-5,
        rope: RopeConfig::llama3_1(32),
    };
    let (batch, seq) = (2, 32);
    // One set of weights for both runs: norms at 1, projections uniform in ±1/√in.
    let weights: Vec<Tensor> = LlamaBlock::shapes(&c)
        .iter()
        .map(|s| match s.as_slice() {
            [n] => Tensor::ones(*n, dtype, &device),
            [_, d_in] => {
                let b = 1.0 / (*d_in as f64).sqrt();
                Tensor::rand(-b, b, s.as_slice(), &device)?.to_dtype(dtype)
            }
            _ => candle::bail!("a weight is a vector or a matrix"),
        })
        .collect::<candle::Result<_>>()?;
    let x = Tensor::randn(0f32, 1.0, (batch, seq, c.hidden), &device)?.to_dtype(dtype)?;
    let target = Tensor::randn(0f32, 1.0, (batch, seq, c.hidden), &device)?;
    let positions = Tensor::new((0..(batch * seq) as i64).map(|i| i % seq as i64).collect::<Vec<_>>(), &device)?;

    println!("step  loss (fused)  loss (candle ops)  ms/step (fused, candle ops)");
    let mut runs = Vec::new();
    for ops in [Ops::Fused, Ops::Unfused] {
        let block = LlamaBlock::new(c, weights.clone().try_into().map_err(|_| candle::Error::msg("nine weights"))?)?;
        let mut steps = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            let y = block.forward(&x, &positions, ops)?.to_dtype(DType::F32)?;
            let loss = y.sub(&target)?.sqr()?.mean_all()?;
            let grads = loss.backward()?;
            for v in block.vars() {
                if let Some(g) = grads.get(v.as_tensor()) {
                    v.set(&(v.as_tensor() - (g * 0.5)?)?)?;
                }
            }
            let loss = loss.to_scalar::<f32>()?;
            steps.push((loss, start.elapsed().as_secs_f64() * 1e3));
        }
        runs.push(steps);
    }
    for (i, ((lf, tf), (lu, tu))) in runs[0].iter().zip(&runs[1]).enumerate() {
        println!("{i:>4}  {lf:>12.6}  {lu:>17.6}  {tf:>8.1}, {tu:.1}");
    }
    Ok(())
}
