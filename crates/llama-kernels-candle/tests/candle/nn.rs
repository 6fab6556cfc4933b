use candle::{DType, Device, Module, Tensor};
use llama_kernels_candle::nn::{Base, LoraLinear, RmsNorm};
use llama_kernels_candle::{Lora, LoraConfig, PackedWeight, QLinear, rms_norm, unfused};

use crate::common::{check, rand, tol, var};

#[test]
fn rms_norm_module_is_the_function() {
    let x = rand(1, &[3, 32], DType::BF16, 1.0);
    let w = rand(2, &[32], DType::BF16, 1.0);
    check("RmsNorm module", &RmsNorm::new(w.clone(), 1e-5).forward(&x).unwrap(), &rms_norm(&x, &w, 1e-5).unwrap(), 0.0);
}

/// A LoRA layer on a dense and on a packed (NF4) base: it starts as its base, its training
/// forward is base + peft's branch with the same mask, and gradients reach A, B and x.
#[test]
fn lora_linear_on_dense_and_nf4_bases_matches_base_plus_unfused_branch() {
    let (d_in, d_out) = (64, 48);
    let config = LoraConfig { r: 8, alpha: 16.0, dropout: 0.1, rslora: false };
    let dense: Vec<f32> = rand(3, &[d_out * d_in], DType::F32, 0.2).to_vec1().unwrap();
    let packed = PackedWeight::quantize_nf4(d_out, d_in, 64, &dense).unwrap();
    let deq = Tensor::from_vec(packed.dequantize(), (d_out, d_in), &Device::Cpu).unwrap();
    let bases = [
        (
            "dense",
            Base::Dense { weight: Tensor::from_vec(dense, (d_out, d_in), &Device::Cpu).unwrap(), bias: None },
            false,
        ),
        ("nf4", Base::Packed(QLinear::new(packed)), true),
    ];
    for (name, base, is_packed) in bases {
        let layer = LoraLinear::new(base, config, 2, DType::F32, &Device::Cpu).unwrap();
        let x = var(&rand(4, &[2, 5, d_in], DType::F32, 1.0));
        let w64 = if is_packed {
            deq.clone()
        } else {
            rand(3, &[d_out * d_in], DType::F32, 0.2).reshape((d_out, d_in)).unwrap()
        };
        let base64 = x.as_tensor().broadcast_matmul(&w64.t().unwrap()).unwrap();
        // B = 0 at start: the layer is its base (the branch adds exact zeros).
        check(&format!("{name} LoRA at init"), &layer.forward(x.as_tensor()).unwrap(), &base64, tol(DType::F32));
        // Give B values, then compare the training forward and its gradients.
        let [a, b] = layer.vars();
        b.set(&rand(5, &[d_out, 8], DType::F32, 0.3)).unwrap();
        let y = layer.forward_train(x.as_tensor(), 77).unwrap();
        let lora = Lora { config, seed: 77, stream: 2 };
        let (a2, b2) = (var(a.as_tensor()), var(b.as_tensor()));
        let x2 = var(x.as_tensor());
        let want = (x2.as_tensor().broadcast_matmul(&w64.t().unwrap()).unwrap()
            + unfused::lora_branch(x2.as_tensor(), a2.as_tensor(), b2.as_tensor(), &lora).unwrap())
        .unwrap();
        check(&format!("{name} LoRA train forward"), &y, &want, 2.0 * tol(DType::F32));
        let r = rand(6, y.dims(), DType::F32, 1.0);
        let g = y.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = want.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
        for (what, ours, theirs) in [("dA", a, &a2), ("dB", b, &b2), ("dx", &x, &x2)] {
            let (got, exp) = (g.get(ours.as_tensor()).unwrap(), g2.get(theirs.as_tensor()).unwrap());
            check(&format!("{name} LoRA {what}"), got, exp, 4.0 * tol(DType::F32));
        }
    }
    let bad = LoraConfig { r: 0, ..config };
    let base = Base::Dense { weight: Tensor::zeros((4, 4), DType::F32, &Device::Cpu).unwrap(), bias: None };
    assert!(LoraLinear::new(base, bad, 0, DType::F32, &Device::Cpu).unwrap_err().to_string().contains("lora r"));
}
