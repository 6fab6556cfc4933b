use candle::{DType, Device, Tensor};
use llama_kernels::ops::rope::{RopeConfig, RopeLayout};
use llama_kernels_candle::{RotaryEmbedding, rope, unfused};

use crate::common::{FLOATS, check, rand, tol, var};

#[test]
fn both_layouts_match_candle_unfused_forward_and_gradients() {
    for dtype in FLOATS {
        for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
            let config = RopeConfig { layout, ..RopeConfig::llama3_1(64) };
            let emb = RotaryEmbedding::new(config).unwrap();
            let positions: Vec<i64> = vec![0, 1, 2, 7, 100, 8191, 3];
            let pos = Tensor::new(positions.as_slice(), &Device::Cpu).unwrap();
            let x = rand(5, &[positions.len(), 3, 64], dtype, 1.5);
            let r = rand(6, x.dims(), DType::F64, 1.0);
            let what = format!("{dtype:?} {layout:?}");
            let xv = var(&x);
            let y = emb.forward(xv.as_tensor(), &pos).unwrap();
            let x64 = var(&x.to_dtype(DType::F64).unwrap());
            let y64 = unfused::rope(x64.as_tensor(), &positions, &config).unwrap();
            check(&format!("rope y {what}"), &y, &y64, tol(dtype));
            let g = y.to_dtype(DType::F64).unwrap().mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            let g64 = y64.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            check(
                &format!("rope dx {what}"),
                g.get(xv.as_tensor()).unwrap(),
                g64.get(x64.as_tensor()).unwrap(),
                2.0 * tol(dtype),
            );

            // [batch, seq, heads, d] with i32 positions [batch, seq], and the one-off function.
            let x4 = x.narrow(0, 0, 6).unwrap().reshape((2, 3, 3, 64)).unwrap();
            let pos4 = Tensor::new(&[[0i32, 1, 2], [7, 100, 8191]], &Device::Cpu).unwrap();
            let y4 = rope(&x4, &pos4, &config).unwrap();
            check(
                &format!("rope 4-d {what}"),
                &y4.reshape((6, 3, 64)).unwrap(),
                &y64.narrow(0, 0, 6).unwrap(),
                tol(dtype),
            );
        }
    }
}

#[test]
fn llama4_qk_norm_matches_candle_unfused_rope_then_norm() {
    for dtype in [DType::F32, DType::BF16] {
        let config = RopeConfig::llama4_scout(64);
        let eps = f64::from(config.qk_norm_eps.unwrap());
        let emb = RotaryEmbedding::new(config).unwrap();
        let positions: Vec<i64> = vec![0, 5, 9000, 3];
        let pos = Tensor::new(positions.as_slice(), &Device::Cpu).unwrap();
        let x = rand(71, &[4, 2, 64], dtype, 1.0);
        let r = rand(72, x.dims(), DType::F64, 1.0);
        let xv = var(&x);
        let y = emb.forward(xv.as_tensor(), &pos).unwrap();
        let x64 = var(&x.to_dtype(DType::F64).unwrap());
        let no_norm = RopeConfig { qk_norm_eps: None, ..config };
        let ones = Tensor::ones(64, DType::F64, &Device::Cpu).unwrap();
        let y64 =
            unfused::rms_norm(&unfused::rope(x64.as_tensor(), &positions, &no_norm).unwrap(), &ones, eps).unwrap();
        check(&format!("qk-norm rope y {dtype:?}"), &y, &y64, tol(dtype));
        let g = y.to_dtype(DType::F64).unwrap().mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
        let g64 = y64.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
        check(
            &format!("qk-norm rope dx {dtype:?}"),
            g.get(xv.as_tensor()).unwrap(),
            g64.get(x64.as_tensor()).unwrap(),
            2.0 * tol(dtype),
        );
    }
}
