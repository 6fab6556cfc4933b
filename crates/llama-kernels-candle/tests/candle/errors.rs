//! Bad input through candle gives a candle error carrying the kernels' named error (op,
//! argument, reason), never a panic; layouts candle passes are handled or named.

use candle::{DType, Device, Tensor};
use llama_kernels::ops::rope::RopeConfig;
use llama_kernels_candle::{
    AttentionMask, AttentionOptions, Lora, LoraConfig, RotaryEmbedding, flash_attn, flash_attn_varlen, rms_norm,
    swiglu, swiglu_packed,
};

use crate::common::{check, rand};

/// The error's message names every one of `parts`.
#[track_caller]
fn fails_naming<T: std::fmt::Debug>(r: candle::Result<T>, parts: &[&str]) {
    let e = r.expect_err("bad input must be an error").to_string();
    for p in parts {
        assert!(e.contains(p), "error {e:?} should name {p:?}");
    }
}

#[test]
fn rms_norm_names_dtype_shape_eps_and_hidden_errors() {
    let x = rand(1, &[3, 16], DType::F32, 1.0);
    fails_naming(rms_norm(&x, &rand(2, &[16], DType::BF16, 1.0), 1e-5), &["rms_norm", "weight", "bf16", "f32"]);
    fails_naming(rms_norm(&x, &rand(2, &[8], DType::F32, 1.0), 1e-5), &["rms_norm", "weight", "[8]"]);
    fails_naming(rms_norm(&x, &rand(2, &[16], DType::F32, 1.0), 0.0), &["rms_norm", "eps"]);
    fails_naming(rms_norm(&x, &rand(2, &[16], DType::F32, 1.0), f32::NAN), &["rms_norm", "eps"]);
    let ints = Tensor::zeros((3, 16), DType::I64, &Device::Cpu).unwrap();
    fails_naming(rms_norm(&ints, &ints.narrow(0, 0, 1).unwrap().squeeze(0).unwrap(), 1e-5), &["rms_norm", "i64"]);
    fails_naming(rms_norm(&Tensor::zeros((2, 3), DType::U32, &Device::Cpu).unwrap(), &x, 1e-5), &["U32"]);
}

#[test]
fn empty_batches_give_empty_results_and_gradients() {
    let x = candle::Var::from_tensor(&rand(1, &[0, 16], DType::F32, 1.0)).unwrap();
    let w = candle::Var::from_tensor(&rand(2, &[16], DType::F32, 1.0)).unwrap();
    let y = rms_norm(x.as_tensor(), w.as_tensor(), 1e-5).unwrap();
    assert_eq!(y.dims(), &[0, 16]);
    let g = y.sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(x.as_tensor()).unwrap().dims(), &[0, 16]);
    let dw: Vec<f32> = g.get(w.as_tensor()).unwrap().to_vec1().unwrap();
    assert!(dw.iter().all(|&v| v == 0.0), "no rows: dw = 0");
    let gate = rand(3, &[0, 8], DType::BF16, 1.0);
    assert_eq!(swiglu(&gate, &gate).unwrap().dims(), &[0, 8]);
}

#[test]
fn non_contiguous_inputs_are_read_through_their_layout() {
    // A transposed x and a strided gate: the result equals the contiguous one's.
    let x = rand(4, &[16, 5], DType::F32, 1.0).t().unwrap();
    let w = rand(5, &[16], DType::F32, 1.0);
    let y = rms_norm(&x, &w, 1e-5).unwrap();
    check("transposed x", &y, &rms_norm(&x.contiguous().unwrap(), &w, 1e-5).unwrap(), 0.0);
    let wide = rand(6, &[4, 24], DType::F32, 1.0);
    let (gate, up) = (wide.narrow(1, 0, 8).unwrap(), wide.narrow(1, 8, 8).unwrap());
    let want = swiglu(&gate.contiguous().unwrap(), &up.contiguous().unwrap()).unwrap();
    check("narrowed gate/up", &swiglu(&gate, &up).unwrap(), &want, 0.0);
    let emb = RotaryEmbedding::new(RopeConfig::llama3_1(32)).unwrap();
    let pos = Tensor::new(&[3i64, 9, 1], &Device::Cpu).unwrap();
    let bhsd = rand(7, &[1, 2, 3, 32], DType::F32, 1.0); // [batch, heads, seq, d]
    let y = emb.forward(&bhsd.transpose(1, 2).unwrap(), &pos).unwrap();
    let want = emb.forward(&bhsd.transpose(1, 2).unwrap().contiguous().unwrap(), &pos).unwrap();
    check("rope of a transposed view", &y, &want, 0.0);
}

#[test]
fn swiglu_and_rope_name_their_errors() {
    let g = rand(1, &[4, 8], DType::F32, 1.0);
    fails_naming(swiglu(&g, &rand(2, &[4, 6], DType::F32, 1.0)), &["swiglu", "up"]);
    fails_naming(swiglu(&g, &rand(2, &[4, 8], DType::F16, 1.0)), &["swiglu", "f16"]);
    fails_naming(swiglu_packed(&rand(3, &[4, 7], DType::F32, 1.0)), &["swiglu", "even"]);
    let emb = RotaryEmbedding::new(RopeConfig::llama3_1(64)).unwrap();
    let x = rand(4, &[3, 2, 32], DType::F32, 1.0);
    let pos = Tensor::new(&[0i64, 1, 2], &Device::Cpu).unwrap();
    fails_naming(emb.forward(&x, &pos), &["rope", "64"]);
    let x = rand(4, &[3, 2, 64], DType::F32, 1.0);
    fails_naming(emb.forward(&x, &Tensor::new(&[0i64, 1], &Device::Cpu).unwrap()), &["rope", "positions"]);
    fails_naming(emb.forward(&x, &Tensor::new(&[0f32, 1., 2.], &Device::Cpu).unwrap()), &["rope", "positions"]);
    fails_naming(emb.forward(&rand(4, &[64], DType::F32, 1.0), &pos), &["rope", "[tokens, heads, head_dim]"]);
    fails_naming(RotaryEmbedding::new(RopeConfig { rotary_dim: 65, ..RopeConfig::llama3_1(64) }), &["rotary"]);
}

#[test]
fn attention_names_head_dim_gqa_offset_and_dtype_errors() {
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
    let t = |seed, shape: &[usize], dtype| rand(seed, shape, dtype, 1.0);
    let (q, k) = (t(1, &[1, 4, 2, 48], DType::BF16), t(2, &[1, 4, 1, 48], DType::BF16));
    fails_naming(flash_attn(&q, &k, &k, &opts), &["head_dim", "48"]);
    let (q, k) = (t(1, &[1, 4, 3, 64], DType::BF16), t(2, &[1, 4, 2, 64], DType::BF16));
    fails_naming(flash_attn(&q, &k, &k, &opts), &["heads"]);
    let (q, k) = (t(1, &[1, 4, 2, 64], DType::BF16), t(2, &[1, 4, 1, 64], DType::F16));
    fails_naming(flash_attn(&q, &k, &k, &opts), &["attention", "f16"]);
    fails_naming(flash_attn(&t(1, &[4, 2, 64], DType::BF16), &k, &k, &opts), &["[batch, seq, heads, head_dim]"]);
    let (q, k) = (t(1, &[5, 2, 64], DType::BF16), t(2, &[5, 1, 64], DType::BF16));
    fails_naming(flash_attn_varlen(&q, &k, &k, &[0, 2, 4], &[0, 2, 5], &opts), &["cu_seqlens"]);
    fails_naming(flash_attn_varlen(&q, &k, &k, &[0, 3, 2, 5], &[0, 3, 2, 5], &opts), &["cu_seqlens"]);
    fails_naming(flash_attn_varlen(&q, &k, &k, &[0, 5], &[0], &opts), &["cu_seqlens"]);
    let bad_scale = AttentionOptions { scale: Some(f32::NAN), ..opts };
    fails_naming(flash_attn_varlen(&q, &k, &k, &[0, 5], &[0, 5], &bad_scale), &["scale"]);
}

#[test]
fn lora_names_rank_dropout_and_shape_errors() {
    let x = rand(1, &[3, 16], DType::F32, 1.0);
    let (a, b) = (rand(2, &[4, 16], DType::F32, 1.0), rand(3, &[8, 4], DType::F32, 1.0));
    let lora = |r, dropout| Lora { config: LoraConfig { r, alpha: 8.0, dropout, rslora: false }, seed: 1, stream: 0 };
    assert_eq!(lora(4, 0.1).branch(&x, &a, &b).unwrap().dims(), &[3, 8]);
    fails_naming(lora(8, 0.0).branch(&x, &a, &b), &["lora", "r = 8"]);
    fails_naming(lora(4, 1.0).branch(&x, &a, &b), &["lora dropout"]);
    fails_naming(lora(0, 0.0).branch(&x, &a, &b), &["lora r"]);
    fails_naming(lora(4, 0.0).branch(&rand(1, &[3, 12], DType::F32, 1.0), &a, &b), &["lora", "x"]);
    fails_naming(lora(4, 0.0).branch(&x, &a.to_dtype(DType::BF16).unwrap(), &b), &["lora A", "bf16"]);
}
