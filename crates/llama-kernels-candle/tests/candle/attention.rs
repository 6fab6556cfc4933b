use candle::{DType, Tensor};
use llama_kernels_candle::ops::attention::Llama4Temperature;
use llama_kernels_candle::{AttentionMask, AttentionOptions, flash_attn, flash_attn_varlen, unfused};

use crate::common::{check, rand, var};

/// candle's unfused attention in f64.
fn plain(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Tensor {
    let mask = if causal { AttentionMask::Causal } else { AttentionMask::None };
    unfused::attention(q, k, v, &AttentionOptions { mask, ..Default::default() }).unwrap()
}

fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (2e-6, 4e-6),
        DType::F16 => (1.5e-3, 3e-3),
        _ => (1.2e-2, 2.4e-2),
    }
}

#[test]
fn gqa_causal_and_full_match_candle_unfused_forward_and_gradients() {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for (causal, (b, sq, sk, hq, hkv, d)) in
            [(true, (2, 9, 9, 4, 2, 64)), (false, (1, 5, 12, 3, 1, 32)), (true, (1, 6, 70, 2, 2, 128))]
        {
            let what = format!("{dtype:?} causal {causal} b{b} sq{sq} sk{sk} hq{hq} hkv{hkv} d{d}");
            let q = rand(11, &[b, sq, hq, d], dtype, 1.0);
            let k = rand(12, &[b, sk, hkv, d], dtype, 1.0);
            let v = rand(13, &[b, sk, hkv, d], dtype, 1.0);
            let r = rand(14, q.dims(), DType::F64, 1.0);
            let to64 = |t: &Tensor| var(&t.to_dtype(DType::F64).unwrap());
            let (q64, k64, v64) = (to64(&q), to64(&k), to64(&v));
            let o64 = plain(q64.as_tensor(), k64.as_tensor(), v64.as_tensor(), causal);
            let g64 = o64.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();

            let (qv, kv, vv) = (var(&q), var(&k), var(&v));
            let mask = if causal { AttentionMask::Causal } else { AttentionMask::None };
            let opts = AttentionOptions { mask, ..Default::default() };
            let o = flash_attn(qv.as_tensor(), kv.as_tensor(), vv.as_tensor(), &opts).unwrap();
            let (fwd, bwd) = tolerance(dtype);
            check(&format!("attention out {what}"), &o, &o64, fwd);
            let g = o.to_dtype(DType::F64).unwrap().mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            for (name, ours, theirs) in [("dq", &qv, &q64), ("dk", &kv, &k64), ("dv", &vv, &v64)] {
                check(
                    &format!("attention {name} {what}"),
                    g.get(ours.as_tensor()).unwrap(),
                    g64.get(theirs.as_tensor()).unwrap(),
                    bwd,
                );
            }
        }
    }
}

#[test]
fn varlen_batches_are_each_sequence_on_its_own() {
    let (hq, hkv, d) = (4, 1, 64);
    let (cu_q, cu_k) = ([0, 3, 10], [0, 5, 12]);
    let q = rand(21, &[10, hq, d], DType::BF16, 1.0);
    let k = rand(22, &[12, hkv, d], DType::BF16, 1.0);
    let v = rand(23, &[12, hkv, d], DType::BF16, 1.0);
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
    let o = flash_attn_varlen(&q, &k, &v, &cu_q, &cu_k, &opts).unwrap();
    for s in 0..2 {
        let (q0, ql) = (cu_q[s] as usize, (cu_q[s + 1] - cu_q[s]) as usize);
        let (k0, kl) = (cu_k[s] as usize, (cu_k[s + 1] - cu_k[s]) as usize);
        let part = |t: &Tensor, a, l| t.narrow(0, a, l).unwrap().to_dtype(DType::F64).unwrap().unsqueeze(0).unwrap();
        let want = plain(&part(&q, q0, ql), &part(&k, k0, kl), &part(&v, k0, kl), true).squeeze(0).unwrap();
        check(&format!("varlen sequence {s}"), &o.narrow(0, q0, ql).unwrap(), &want, 1.2e-2);
    }
}

#[test]
fn chunked_mask_scale_and_llama4_temperature_match_candle_unfused() {
    let temperature = Llama4Temperature { floor_scale: 3.0, attn_scale: 0.5 };
    for dtype in [DType::F32, DType::BF16] {
        for (what, opts) in [
            (
                "chunked, scale 0.3",
                AttentionOptions {
                    mask: AttentionMask::ChunkedCausal { chunk_size: 4 },
                    scale: Some(0.3),
                    ..Default::default()
                },
            ),
            (
                "causal, temperature",
                AttentionOptions { mask: AttentionMask::Causal, temperature: Some(temperature), ..Default::default() },
            ),
        ] {
            // 11 queries after 3 cached keys: positions 3..=13, temperature factors 1.35 to 1.80.
            let (b, sq, sk, hq, hkv, d) = (1, 11, 14, 2, 1, 64);
            let q = rand(51, &[b, sq, hq, d], dtype, 1.0);
            let k = rand(52, &[b, sk, hkv, d], dtype, 1.0);
            let v = rand(53, &[b, sk, hkv, d], dtype, 1.0);
            let r = rand(54, q.dims(), DType::F64, 1.0);
            let to64 = |t: &Tensor| var(&t.to_dtype(DType::F64).unwrap());
            let (q64, k64, v64) = (to64(&q), to64(&k), to64(&v));
            let o64 = unfused::attention(q64.as_tensor(), k64.as_tensor(), v64.as_tensor(), &opts).unwrap();
            let g64 = o64.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            let (qv, kv, vv) = (var(&q), var(&k), var(&v));
            let o = flash_attn(qv.as_tensor(), kv.as_tensor(), vv.as_tensor(), &opts).unwrap();
            let (fwd, bwd) = tolerance(dtype);
            check(&format!("{what} attention out {dtype:?}"), &o, &o64, fwd);
            let g = o.to_dtype(DType::F64).unwrap().mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
            for (name, ours, theirs) in [("dq", &qv, &q64), ("dk", &kv, &k64), ("dv", &vv, &v64)] {
                let (got, want) = (g.get(ours.as_tensor()).unwrap(), g64.get(theirs.as_tensor()).unwrap());
                check(&format!("{what} attention {name} {dtype:?}"), got, want, bwd);
            }
        }
    }
}

#[test]
fn forward_and_backward_are_bit_identical_run_to_run() {
    let q = var(&rand(61, &[2, 9, 4, 64], DType::BF16, 1.0));
    let k = var(&rand(62, &[2, 9, 2, 64], DType::BF16, 1.0));
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
    let run = || {
        let o = flash_attn(q.as_tensor(), k.as_tensor(), k.as_tensor(), &opts).unwrap();
        let g = o.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        let bits = |t: &Tensor| t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        (bits(&o), bits(g.get(q.as_tensor()).unwrap()), bits(g.get(k.as_tensor()).unwrap()))
    };
    let (a, b) = (run(), run());
    assert!(a.0.iter().zip(&b.0).all(|(x, y)| x.to_bits() == y.to_bits()), "outputs differ");
    assert!(a.1.iter().zip(&b.1).all(|(x, y)| x.to_bits() == y.to_bits()), "dq differs");
    assert!(a.2.iter().zip(&b.2).all(|(x, y)| x.to_bits() == y.to_bits()), "dk differs");
}
