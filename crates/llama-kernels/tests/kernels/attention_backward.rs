//! Attention backward: dQ, dK, dV against the f64 reference gradient of the same saved state
//! (every dtype, head dim and mask, tile-edge lengths, GQA ratios and packs, varlen batches with
//! empty sequences and cached prefixes, Llama 4 chunked attention with temperature, custom scale,
//! fused QKV views, device offsets); bit-identical under every schedule; the reference against
//! central differences and PyTorch float64 autograd; non-finite values at masked pairs;
//! validation errors.

use crate::common;

use llama_kernels::dev::testing::{Rng, Tolerance, compare};
use llama_kernels::dev::verify::{AttentionCase, attention_backward_case};
use llama_kernels::ops::attention::{
    AttentionBackwardPath, AttentionBackwardTensors, AttentionMask, AttentionOptions, AttentionTensors,
    AttentionWorkspace, KvTensors, Llama4Temperature, Offsets, backward_path,
};
use llama_kernels::reference::attention::{AttentionGradInputs, AttentionSpec, attention, attention_backward};
use llama_kernels::{DType, Device, Error, Tensor};

fn assert_pass(device: &Device, case: &AttentionCase) {
    let r = attention_backward_case(device, case).unwrap_or_else(|e| panic!("{case:?} on {device:?}: {e}"));
    assert!(r.pass, "{} on {device:?}", r.describe());
}

const MASKS: [AttentionMask; 3] =
    [AttentionMask::None, AttentionMask::Causal, AttentionMask::ChunkedCausal { chunk_size: 24 }];

#[test]
fn tile_edge_lengths_every_dtype_mask_and_head_dim() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for head_dim in [32, 64, 96, 128, 256] {
                // 16 and 32 rows (keys) per block at head_dim 256 and below: one short of a
                // block, a block and one over.
                for len in [1, 16, 33] {
                    for mask in MASKS {
                        assert_pass(&device, &AttentionCase::single(dtype, len, 4, 2, head_dim, mask));
                    }
                }
            }
        }
    }
}

#[test]
fn gqa_ratios_packs_and_many_tiles() {
    for device in common::devices() {
        for dtype in [DType::BF16, DType::F32] {
            for (q_heads, kv_heads) in [(4, 4), (8, 2), (8, 1), (10, 2)] {
                let group = q_heads / kv_heads;
                for pack in [1, group] {
                    let mut case = AttentionCase::single(dtype, 70, q_heads, kv_heads, 64, AttentionMask::Causal);
                    case.opts.gqa_pack = Some(pack);
                    assert_pass(&device, &case);
                }
            }
            assert_pass(&device, &AttentionCase::single(dtype, 130, 8, 2, 128, AttentionMask::Causal));
        }
    }
}

#[test]
fn varlen_batches_with_empty_sequences_prefixes_and_fully_masked_rows() {
    // (q_len, k_len): unequal lengths, an empty sequence, queries after a cached prefix, keys
    // without queries (their dK, dV are zeros), queries without keys and more queries than keys
    // (rows that see no key: dQ zeros).
    let seqs = [(17, 17), (0, 0), (5, 70), (0, 9), (3, 0), (1, 40), (20, 6)];
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for mask in MASKS {
                assert_pass(&device, &AttentionCase::new(dtype, &seqs, 4, 2, 64, mask));
            }
        }
    }
}

#[test]
fn llama4_temperature_chunks_custom_scale_fused_views_and_device_offsets() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            let temp = Some(Llama4Temperature { floor_scale: 16.0, attn_scale: 0.1 });
            for mask in [AttentionMask::Causal, AttentionMask::ChunkedCausal { chunk_size: 32 }] {
                let mut case = AttentionCase::new(dtype, &[(40, 100), (50, 50)], 4, 1, 128, mask);
                case.opts.temperature = temp;
                assert_pass(&device, &case);
            }
            let mut case = AttentionCase::single(dtype, 33, 4, 2, 64, AttentionMask::None);
            case.opts.scale = Some(0.3);
            assert_pass(&device, &case);
            let mut case = AttentionCase::new(dtype, &[(21, 21), (40, 40)], 8, 2, 128, AttentionMask::Causal);
            case.fused_qkv = true;
            assert_pass(&device, &case);
            case.device_offsets = true;
            assert_pass(&device, &case);
        }
    }
}

#[test]
fn schedules_agree_bit_for_bit() {
    for dtype in DType::FLOATS {
        for mask in MASKS {
            let case = AttentionCase::new(dtype, &[(40, 40), (9, 30), (0, 7)], 4, 2, 64, mask);
            common::assert_schedules_agree(&format!("{case:?}"), |d| attention_backward_case(d, &case));
        }
    }
    let case = AttentionCase::new(DType::BF16, &[(20, 35)], 4, 1, 256, AttentionMask::Causal);
    common::assert_schedules_agree(&format!("{case:?}"), |d| attention_backward_case(d, &case));
}

/// The reference's exact gradient against central differences of `<dO, attention(q, k, v)>`.
#[test]
fn the_reference_gradient_matches_central_differences() {
    let mut rng = Rng::new(35);
    let (q_heads, kv_heads, d) = (4, 2, 8);
    let temp = Some(Llama4Temperature { floor_scale: 3.0, attn_scale: 0.2 });
    let variants = [
        (AttentionMask::Causal, None, vec![(3, 5), (4, 4)]),
        (AttentionMask::ChunkedCausal { chunk_size: 3 }, temp, vec![(7, 7)]),
        (AttentionMask::None, None, vec![(2, 3), (0, 2), (3, 0)]),
        (AttentionMask::Causal, None, vec![(5, 2)]), // fully masked rows
    ];
    let mut worst: f64 = 0.0;
    for (mask, temperature, seqs) in variants {
        let cu = |i: usize| {
            let mut total = 0;
            let running = seqs.iter().map(|s| {
                total += [s.0, s.1][i];
                total
            });
            std::iter::once(0).chain(running).collect::<Vec<_>>()
        };
        let (cu_q, cu_k) = (cu(0), cu(1));
        let (tq, tk) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
        let spec = AttentionSpec { q_heads, kv_heads, head_dim: d, mask, scale: 0.4, temperature };
        let q = rng.normal_vec(tq * q_heads * d, 1.0, DType::F32);
        let k = rng.normal_vec(tk * kv_heads * d, 1.0, DType::F32);
        let v = rng.normal_vec(tk * kv_heads * d, 1.0, DType::F32);
        let g = rng.normal_vec(tq * q_heads * d, 1.0, DType::F32);
        let inputs = AttentionGradInputs {
            q: &q,
            k: &k,
            v: &v,
            d_out: &g,
            cu_seqlens_q: &cu_q,
            cu_seqlens_k: &cu_k,
            saved: None,
            rounded: None,
        };
        let (dq, dk, dv) = attention_backward(&inputs, &spec).unwrap();
        let loss = |q: &[f64], k: &[f64], v: &[f64]| {
            let (o, _) = attention(q, k, v, &cu_q, &cu_k, &spec).unwrap();
            o.iter().zip(&g).map(|(a, b)| a * b).sum::<f64>()
        };
        worst = worst.max(common::central_difference_error(&q, &dq, |x| loss(x, &k, &v)));
        worst = worst.max(common::central_difference_error(&k, &dk, |x| loss(&q, x, &v)));
        worst = worst.max(common::central_difference_error(&v, &dv, |x| loss(&q, &k, x)));
    }
    println!("largest |central difference - reference gradient|: {worst:.2e}");
    assert!(worst < 1e-7, "{worst}");
}

/// PyTorch's SDPA in float64 (scripts/make_autograd_fixtures.py): the f64 reference to 1e-12,
/// and the f32 kernels (forward, then backward) through the public API.
#[test]
fn gradients_match_pytorch_autograd_in_float64() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/autograd/autograd.json")).expect("the fixture is JSON");
    let device = Device::emulated();
    let mut checked = 0;
    for c in fixture["cases"].as_array().unwrap().iter().filter(|c| c["op"] == "attention") {
        let n = |k: &str| c[k].as_u64().unwrap() as usize;
        let ints = |k: &str| c[k].as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as i32).collect::<Vec<_>>();
        let get = |k: &str| crate::rms_norm_backward::f64s(c[k].as_str().unwrap());
        let (q_heads, kv_heads, d) = (n("q_heads"), n("kv_heads"), n("head_dim"));
        let (cu_q, cu_k) = (ints("cu_seqlens_q"), ints("cu_seqlens_k"));
        let (tq, tk) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
        let mask = match c["mask"].as_str().unwrap() {
            "causal" => AttentionMask::Causal,
            "chunked" => AttentionMask::ChunkedCausal { chunk_size: n("chunk_size") },
            _ => AttentionMask::None,
        };
        let scale = c["scale"].as_f64();
        let temperature = c["temperature"].as_array().map(|t| Llama4Temperature {
            floor_scale: t[0].as_f64().unwrap() as f32,
            attn_scale: t[1].as_f64().unwrap() as f32,
        });
        let spec = AttentionSpec {
            q_heads,
            kv_heads,
            head_dim: d,
            mask,
            scale: scale.unwrap_or(1.0 / (d as f64).sqrt()),
            temperature,
        };
        let (q, k, v, g) = (get("q"), get("k"), get("v"), get("d_out"));
        let inputs = AttentionGradInputs {
            q: &q,
            k: &k,
            v: &v,
            d_out: &g,
            cu_seqlens_q: &cu_q,
            cu_seqlens_k: &cu_k,
            saved: None,
            rounded: None,
        };
        let (rq, rk, rv) = attention_backward(&inputs, &spec).unwrap();
        let tight = Tolerance { atol: 1e-12, rtol: 1e-12 };
        for (name, got, want) in [("dq", &rq, get("dq")), ("dk", &rk, get("dk")), ("dv", &rv, get("dv"))] {
            let cmp = compare(got, &want, tight);
            assert!(cmp.pass, "reference {name}: {}", cmp.describe(&[got.len()]));
        }

        // The kernels in f32 on the fixture's values (rounded to f32 on upload; O(1) gradients).
        let t =
            |x: &[f64], rows: usize, heads: usize| Tensor::from_f64(&device, DType::F32, x, &[rows, heads, d]).unwrap();
        let (qt, kt, vt, gt) = (t(&q, tq, q_heads), t(&k, tk, kv_heads), t(&v, tk, kv_heads), t(&g, tq, q_heads));
        let out = Tensor::poisoned(&device, DType::F32, &[tq, q_heads, d]).unwrap();
        let lse = Tensor::poisoned(&device, DType::F32, &[q_heads, tq]).unwrap();
        let (dq, dk, dv) = (
            Tensor::poisoned(&device, DType::F32, &[tq, q_heads, d]).unwrap(),
            Tensor::poisoned(&device, DType::F32, &[tk, kv_heads, d]).unwrap(),
            Tensor::poisoned(&device, DType::F32, &[tk, kv_heads, d]).unwrap(),
        );
        let opts = AttentionOptions { mask, scale: scale.map(|s| s as f32), temperature, gqa_pack: None };
        let cu_seqlens = Offsets::Host { q: &cu_q, k: &cu_k };
        let mut ws = AttentionWorkspace::new(&device);
        let kv = KvTensors::Contiguous { k: &kt, v: &vt };
        ws.forward(AttentionTensors { q: &qt, kv, cu_seqlens, out: &out, lse: Some(&lse) }, &opts).unwrap();
        let call = AttentionBackwardTensors {
            q: &qt,
            k: &kt,
            v: &vt,
            out: &out,
            lse: &lse,
            d_out: &gt,
            cu_seqlens,
            dq: &dq,
            dk: &dk,
            dv: &dv,
        };
        ws.backward(call, &opts).unwrap();
        let f32_tol = Tolerance { atol: 2e-5, rtol: 2e-5 };
        for (name, got, want) in [("dq", &dq, get("dq")), ("dk", &dk, get("dk")), ("dv", &dv, get("dv"))] {
            let cmp = compare(&got.to_f64_vec().unwrap(), &want, f32_tol);
            assert!(cmp.pass, "kernel {name} ({mask:?}): {}", cmp.describe(got.shape()));
        }
        checked += 1;
    }
    assert_eq!(checked, 3);
}

/// On the SIMT path (head_dim 96 here, every dtype) a non-finite K or V value at a key some rows
/// do not attend (another chunk) reaches none of their gradients: masked pairs are skipped, not
/// multiplied by 0. The saved state is the reference's (the forward's own NaN contract, which
/// the tensor-core path shares, is tested with the forward).
#[test]
fn non_finite_keys_outside_a_rows_chunk_never_reach_its_gradients_on_the_simt_path() {
    let (q_heads, kv_heads, d, len, chunk) = (2, 1, 96, 20, 8);
    assert_eq!(backward_path(DType::BF16, d), AttentionBackwardPath::Simt);
    let mask = AttentionMask::ChunkedCausal { chunk_size: chunk };
    let spec = AttentionSpec { q_heads, kv_heads, head_dim: d, mask, scale: 0.125, temperature: None };
    let cu = [0, len as i32];
    for device in common::devices() {
        for dtype in DType::FLOATS {
            let mut rng = Rng::new(7);
            let q = rng.normal_vec(len * q_heads * d, 1.0, dtype);
            let mut k = rng.normal_vec(len * kv_heads * d, 1.0, dtype);
            let mut v = rng.normal_vec(len * kv_heads * d, 1.0, dtype);
            let g = rng.normal_vec(len * q_heads * d, 1.0, dtype);
            k[3 * d + 5] = f64::NAN; // key 3: chunk 0, attended by queries 0..8 only
            v[3 * d + 9] = f64::INFINITY;
            let (o, l) = attention(&q, &k, &v, &cu, &cu, &spec).unwrap();
            let t = |x: &[f64], dt, shape: &[usize]| Tensor::from_f64(&device, dt, x, shape).unwrap();
            let (qt, kt, vt) =
                (t(&q, dtype, &[len, q_heads, d]), t(&k, dtype, &[len, 1, d]), t(&v, dtype, &[len, 1, d]));
            let (ot, lt, gt) = (
                t(&o, dtype, &[len, q_heads, d]),
                t(&l, DType::F32, &[q_heads, len]),
                t(&g, dtype, &[len, q_heads, d]),
            );
            let dq = Tensor::poisoned(&device, dtype, &[len, q_heads, d]).unwrap();
            let (dk, dv) = (
                Tensor::poisoned(&device, dtype, &[len, 1, d]).unwrap(),
                Tensor::poisoned(&device, dtype, &[len, 1, d]).unwrap(),
            );
            let call = AttentionBackwardTensors {
                q: &qt,
                k: &kt,
                v: &vt,
                out: &ot,
                lse: &lt,
                d_out: &gt,
                cu_seqlens: Offsets::Host { q: &cu, k: &cu },
                dq: &dq,
                dk: &dk,
                dv: &dv,
            };
            let opts = AttentionOptions { mask, scale: Some(0.125), ..Default::default() };
            AttentionWorkspace::new(&device).backward(call, &opts).unwrap();
            // The same saved state as the kernel read (rounded to its dtype).
            let (so, sl) = (ot.to_f64_vec().unwrap(), lt.to_f64_vec().unwrap());
            let inputs = AttentionGradInputs {
                q: &q,
                k: &k,
                v: &v,
                d_out: &g,
                cu_seqlens_q: &cu,
                cu_seqlens_k: &cu,
                saved: Some((&so, &sl)),
                rounded: None,
            };
            let (rq, rk, rv) = attention_backward(&inputs, &spec).unwrap();
            // Rows (tokens) 8.. attend chunks 1 and 2 only; keys 8.. are attended by them only.
            let (row, key) = (q_heads * d, d);
            let tail = |x: &[f64], w: usize| x[chunk * w..].to_vec();
            for (name, got, want, w) in [("dq", &dq, &rq, row), ("dk", &dk, &rk, key), ("dv", &dv, &rv, key)] {
                let got = tail(&got.to_f64_vec().unwrap(), w);
                let want = tail(want, w);
                assert!(want.iter().all(|x| x.is_finite()), "the reference {name} tail is finite");
                let cmp =
                    compare(&got, &want, llama_kernels::dev::verify::attention_gradient_tolerance(dtype, len, 4.0));
                assert!(cmp.pass, "{dtype} {name}: {}", cmp.describe(&[len - chunk, w]));
            }
        }
    }
}

#[test]
fn every_validation_error_is_named() {
    let dev = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&dev, dtype, shape).unwrap();
    let (q, k, v, o, g) = (
        t(DType::BF16, &[6, 4, 64]),
        t(DType::BF16, &[6, 2, 64]),
        t(DType::BF16, &[6, 2, 64]),
        t(DType::BF16, &[6, 4, 64]),
        t(DType::BF16, &[6, 4, 64]),
    );
    let lse = t(DType::F32, &[4, 6]);
    let (dq, dk, dv) = (t(DType::BF16, &[6, 4, 64]), t(DType::BF16, &[6, 2, 64]), t(DType::BF16, &[6, 2, 64]));
    let cu = [0, 2, 6];
    let call = AttentionBackwardTensors {
        q: &q,
        k: &k,
        v: &v,
        out: &o,
        lse: &lse,
        d_out: &g,
        cu_seqlens: Offsets::Host { q: &cu, k: &cu },
        dq: &dq,
        dk: &dk,
        dv: &dv,
    };
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
    let mut ws = AttentionWorkspace::new(&dev);
    ws.backward(call, &opts).unwrap();
    let err = |c: AttentionBackwardTensors<'_>, o: &AttentionOptions| {
        AttentionWorkspace::new(&dev).backward(c, o).expect_err("an invalid call")
    };
    let named = |e: Error| {
        assert!(e.to_string().contains("attention_backward"), "{e}");
        e
    };

    let lse16 = t(DType::BF16, &[4, 6]);
    let e = named(err(AttentionBackwardTensors { lse: &lse16, ..call }, &opts));
    assert!(matches!(e, Error::DTypeMismatch { what: "lse", .. }), "{e}");
    let lse_t = t(DType::F32, &[6, 4]);
    let e = named(err(AttentionBackwardTensors { lse: &lse_t, ..call }, &opts));
    assert!(matches!(e, Error::ShapeMismatch { what: "lse", .. }), "{e}");
    let dq_small = t(DType::BF16, &[6, 2, 64]);
    let e = named(err(AttentionBackwardTensors { dq: &dq_small, ..call }, &opts));
    assert!(matches!(e, Error::ShapeMismatch { what: "dq", .. }), "{e}");
    let dk32 = t(DType::F32, &[6, 2, 64]);
    let e = named(err(AttentionBackwardTensors { dk: &dk32, ..call }, &opts));
    assert!(matches!(e, Error::DTypeMismatch { what: "dk", .. }), "{e}");
    let g_short = t(DType::BF16, &[5, 4, 64]);
    let e = named(err(AttentionBackwardTensors { d_out: &g_short, ..call }, &opts));
    assert!(matches!(e, Error::ShapeMismatch { what: "d_out", .. }), "{e}");
    let h48 = |_| t(DType::BF16, &[6, 4, 48]);
    let [q48, o48, g48, dq48] = [0, 1, 2, 3].map(h48);
    let e = named(err(AttentionBackwardTensors { q: &q48, out: &o48, d_out: &g48, dq: &dq48, ..call }, &opts));
    assert!(matches!(e, Error::InvalidArgument { name: "head_dim", .. }), "{e}");
    let (k3, v3, dk3, dv3) = (
        t(DType::BF16, &[6, 3, 64]),
        t(DType::BF16, &[6, 3, 64]),
        t(DType::BF16, &[6, 3, 64]),
        t(DType::BF16, &[6, 3, 64]),
    );
    let e = named(err(AttentionBackwardTensors { k: &k3, v: &v3, dk: &dk3, dv: &dv3, ..call }, &opts));
    assert!(matches!(e, Error::InvalidArgument { name: "q_heads", .. }), "{e}");
    // Outputs over inputs, or over each other.
    let e = named(err(AttentionBackwardTensors { dq: &q, ..call }, &opts));
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    let e = named(err(AttentionBackwardTensors { dv: &dk, ..call }, &opts));
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    // Offsets and options.
    let bad = [0, 3, 2];
    let e = named(err(AttentionBackwardTensors { cu_seqlens: Offsets::Host { q: &bad, k: &cu }, ..call }, &opts));
    assert!(matches!(e, Error::InvalidArgument { name: "cu_seqlens_q", .. }), "{e}");
    let e = named(err(call, &AttentionOptions { gqa_pack: Some(3), ..opts }));
    assert!(matches!(e, Error::InvalidArgument { name: "gqa_pack", .. }), "{e}");
    let e = named(err(call, &AttentionOptions { scale: Some(f32::NAN), ..opts }));
    assert!(matches!(e, Error::InvalidArgument { name: "scale", .. }), "{e}");
    // An empty batch writes nothing and is no error.
    let (e4, e2, el) = (t(DType::BF16, &[0, 4, 64]), t(DType::BF16, &[0, 2, 64]), t(DType::F32, &[4, 0]));
    let (f4, f2a, f2b) = (t(DType::BF16, &[0, 4, 64]), t(DType::BF16, &[0, 2, 64]), t(DType::BF16, &[0, 2, 64]));
    let zero = [0];
    let empty = AttentionBackwardTensors {
        q: &e4,
        k: &e2,
        v: &e2,
        out: &e4,
        lse: &el,
        d_out: &e4,
        cu_seqlens: Offsets::Host { q: &zero, k: &zero },
        dq: &f4,
        dk: &f2a,
        dv: &f2b,
    };
    ws.backward(empty, &opts).unwrap();
}

/// Invalid device-resident offsets are found by the device: the call writes nothing and the
/// workspace's error flag reports it.
#[test]
fn invalid_device_offsets_write_nothing_and_raise_the_flag() {
    for device in common::devices() {
        let t = |shape: &[usize]| Tensor::zeros(&device, DType::F32, shape).unwrap();
        let p = |shape: &[usize]| Tensor::poisoned(&device, DType::F32, shape).unwrap();
        let (q, k, v, o, g, lse) =
            (t(&[6, 2, 32]), t(&[6, 1, 32]), t(&[6, 1, 32]), t(&[6, 2, 32]), t(&[6, 2, 32]), t(&[2, 6]));
        let (dq, dk, dv) = (p(&[6, 2, 32]), p(&[6, 1, 32]), p(&[6, 1, 32]));
        let cq = Tensor::from_slice(&device, &[0i32, 4, 3], &[3]).unwrap(); // decreasing
        let ck = Tensor::from_slice(&device, &[0i32, 2, 6], &[3]).unwrap();
        let call = AttentionBackwardTensors {
            q: &q,
            k: &k,
            v: &v,
            out: &o,
            lse: &lse,
            d_out: &g,
            cu_seqlens: Offsets::Device { q: &cq, k: &ck },
            dq: &dq,
            dk: &dk,
            dv: &dv,
        };
        let mut ws = AttentionWorkspace::new(&device);
        ws.backward(call, &AttentionOptions::default()).unwrap();
        let e = ws.check_errors().expect_err("the flag is raised");
        assert!(e.to_string().contains("cu_seqlens"), "{e}");
        for out in [&dq, &dk, &dv] {
            assert!(out.to_f64_vec().unwrap().iter().all(|x| x.is_nan()), "written despite invalid offsets");
        }
    }
}
