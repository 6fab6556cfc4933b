use candle::{DType, Device, Module, Tensor};
use llama_kernels_candle::{PackedWeight, QLinear};

use crate::common::{FLOATS, check, rand, tol, var};

#[test]
fn nf4_layer_matches_candle_matmul_of_the_dequantized_weight_forward_and_input_gradient() {
    let (d_out, d_in) = (48, 128);
    let dense: Vec<f32> = rand(1, &[d_out * d_in], DType::F32, 0.5).to_vec1().unwrap();
    let packed = PackedWeight::quantize_nf4(d_out, d_in, 64, &dense).unwrap();
    let w64 = Tensor::from_vec(packed.dequantize(), (d_out, d_in), &Device::Cpu).unwrap().to_dtype(DType::F64).unwrap();
    let layer = QLinear::new(packed);
    assert_eq!(layer.shape(), [d_out, d_in]);
    for dtype in FLOATS {
        // 1 row (the GEMV paths) and 40 rows (the GEMM paths), with leading dimensions.
        for lead in [vec![1], vec![2, 20]] {
            let what = format!("{dtype:?} {lead:?}");
            let x_dims: Vec<usize> = lead.iter().copied().chain([d_in]).collect();
            let x = rand(2, &x_dims, dtype, 1.0);
            let y_dims: Vec<usize> = lead.iter().copied().chain([d_out]).collect();
            let r = rand(3, &y_dims, DType::F64, 1.0);
            let xv = var(&x);
            let y = layer.forward(xv.as_tensor()).unwrap();
            let x64 = var(&x.to_dtype(DType::F64).unwrap());
            let y64 = x64.as_tensor().broadcast_matmul(&w64.t().unwrap()).unwrap();
            // The weight's values rounded to the dtype on some paths: one more rounding.
            check(&format!("qlinear y {what}"), &y, &y64, 2.0 * tol(dtype));
            let g = y.to_dtype(DType::F64).unwrap().mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            let g64 = y64.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            check(
                &format!("qlinear dx {what}"),
                g.get(xv.as_tensor()).unwrap(),
                g64.get(x64.as_tensor()).unwrap(),
                2.0 * tol(dtype),
            );
        }
    }
    let bad = layer.forward(&rand(4, &[3, 64], DType::F32, 1.0));
    assert!(bad.unwrap_err().to_string().contains("[..., 128]"));
}
