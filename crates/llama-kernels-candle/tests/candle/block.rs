//! A Llama block trained in candle with the fused ops and with candle's plain ops, from the same
//! weights: the gradients and the loss curves agree.

use candle::{DType, Device, Tensor};
use llama_kernels::ops::rope::RopeConfig;
use llama_kernels_candle::nn::{BlockConfig, LlamaBlock, Ops};

use crate::common::{check, rand};

fn config() -> BlockConfig {
    BlockConfig {
        hidden: 64,
        q_heads: 4,
        kv_heads: 2,
        head_dim: 32,
        intermediate: 96,
        eps: 1e-5,
        rope: RopeConfig::llama3_1(32),
    }
}

/// Seeded weights: norms near 1, projections uniform in ±1/√in.
fn weights(c: &BlockConfig, dtype: DType) -> [Tensor; 9] {
    let shapes = LlamaBlock::shapes(c);
    let ws: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| match s.as_slice() {
            [n] => (rand(100 + i as u64, &[*n], DType::F64, 0.1) + 1.0).unwrap().to_dtype(dtype).unwrap(),
            [_, d_in] => rand(100 + i as u64, s, dtype, 1.0 / (*d_in as f64).sqrt()),
            _ => unreachable!(),
        })
        .collect();
    ws.try_into().unwrap()
}

/// `steps` of plain SGD on the mean squared error to a fixed target; the losses.
fn train(ops: Ops, dtype: DType, steps: usize) -> (Vec<f64>, Vec<Tensor>) {
    let c = config();
    let block = LlamaBlock::new(c, weights(&c, dtype)).unwrap();
    let (b, s) = (2, 12);
    let x = rand(1, &[b, s, c.hidden], dtype, 1.0);
    let target = rand(2, &[b, s, c.hidden], DType::F32, 1.0);
    let positions =
        Tensor::new((0..(b * s) as i64).map(|i| i % s as i64 + 3).collect::<Vec<_>>(), &Device::Cpu).unwrap();
    let mut losses = Vec::new();
    let mut first_grads = Vec::new();
    for step in 0..steps {
        let y = block.forward(&x, &positions, ops).unwrap().to_dtype(DType::F32).unwrap();
        let loss = y.sub(&target).unwrap().sqr().unwrap().mean_all().unwrap();
        losses.push(f64::from(loss.to_scalar::<f32>().unwrap()));
        let grads = loss.backward().unwrap();
        for v in block.vars() {
            let g = grads.get(v.as_tensor()).expect("every weight gets a gradient");
            if step == 0 {
                first_grads.push(g.clone());
            }
            v.set(&(v.as_tensor() - (g * 0.5).unwrap()).unwrap()).unwrap();
        }
    }
    (losses, first_grads)
}

#[test]
fn fused_and_unfused_blocks_train_alike() {
    for (dtype, grad_tol, loss_tol) in [(DType::F32, 1e-5, 1e-5), (DType::BF16, 4e-2, 1e-2)] {
        let (fused, g_fused) = train(Ops::Fused, dtype, 4);
        let (plain, g_plain) = train(Ops::Unfused, dtype, 4);
        eprintln!("{dtype:?} losses fused {fused:?} unfused {plain:?}");
        for (name, (a, b)) in LlamaBlock::WEIGHTS.iter().zip(g_fused.iter().zip(&g_plain)) {
            check(&format!("{dtype:?} block d{name}"), a, b, grad_tol);
        }
        assert!(fused[3] < fused[0], "{dtype:?}: the loss must fall: {fused:?}");
        for (step, (a, b)) in fused.iter().zip(&plain).enumerate() {
            let rel = (a - b).abs() / b.abs();
            assert!(rel <= loss_tol, "{dtype:?} step {step}: fused loss {a} vs unfused {b} ({rel:.2e})");
        }
    }
}
