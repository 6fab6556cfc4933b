use candle::{D, DType, Device, Tensor};
use llama_kernels::ops::rope::{RopeConfig, RopeLayout};
use llama_kernels_candle::{RotaryEmbedding, rope};

use crate::common::{FLOATS, check, rand, tol, var};

/// candle's unfused RoPE in f64 on `[tokens, heads, d]` with the kernel's frequencies.
fn plain(x: &Tensor, positions: &[i64], config: &RopeConfig) -> Tensor {
    let inv = llama_kernels::spec::rope::inv_freq(config);
    let half = inv.len();
    let angles: Vec<f64> = positions.iter().flat_map(|&p| inv.iter().map(move |f| p as f64 * f)).collect();
    let angles = Tensor::from_vec(angles, (positions.len(), 1, half), &Device::Cpu).unwrap();
    let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
    let (a, b) = match config.layout {
        RopeLayout::HalfSplit => (x.narrow(D::Minus1, 0, half).unwrap(), x.narrow(D::Minus1, half, half).unwrap()),
        RopeLayout::Interleaved => {
            let (t, h, d) = x.dims3().unwrap();
            let pairs = x.reshape((t, h, d / 2, 2)).unwrap();
            (pairs.narrow(3, 0, 1).unwrap().squeeze(3).unwrap(), pairs.narrow(3, 1, 1).unwrap().squeeze(3).unwrap())
        }
    };
    let ra = (a.broadcast_mul(&cos).unwrap() - b.broadcast_mul(&sin).unwrap()).unwrap();
    let rb = (b.broadcast_mul(&cos).unwrap() + a.broadcast_mul(&sin).unwrap()).unwrap();
    match config.layout {
        RopeLayout::HalfSplit => Tensor::cat(&[ra, rb], D::Minus1).unwrap(),
        RopeLayout::Interleaved => Tensor::stack(&[ra, rb], D::Minus1).unwrap().flatten_from(2).unwrap(),
    }
}

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
            let y64 = plain(x64.as_tensor(), &positions, &config);
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
