//! The engine-facing layer: borrowed views and explicit queues, planned calls that allocate and
//! wait for nothing (the counting hook), device-resident sequence offsets, device identity; and
//! one regression test per defect that a survey of bad and edge inputs found.

use crate::common;

use half::bf16;
use llama_kernels::dev::testing::{Rng, Tolerance, compare};
use llama_kernels::dev::verify::{AttentionCase, attention_case, attention_tolerance};
use llama_kernels::ops::attention::AttentionWorkspace;
use llama_kernels::ops::attention::{AttentionArgs, AttentionTensors, KvInput, KvTensors, Offsets};
use llama_kernels::ops::{self, AttentionMask, AttentionOptions, CuSeqlens, GateUp, GateUpView, Rope, RopeConfig};
use llama_kernels::reference::attention::{AttentionSpec, attention, nan_exposed_rows};
use llama_kernels::{DType, Device, DeviceCounters, Error, Tensor, TensorView, TensorViewMut};

fn bits_f32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn view_level_calls_match_the_tensor_api_bit_for_bit() {
    let d = Device::emulated();
    let mut rng = Rng::new(11);
    let (rows, hidden) = (3, 64);
    let x: Vec<f32> = (0..rows * hidden).map(|_| rng.normal() as f32).collect();
    let w: Vec<f32> = (0..hidden).map(|_| 1.0 + 0.1 * rng.normal() as f32).collect();

    // RMSNorm: tensors vs borrowed host slices, out of place and in place.
    let (xt, wt) =
        (Tensor::from_slice(&d, &x, &[rows, hidden]).unwrap(), Tensor::from_slice(&d, &w, &[hidden]).unwrap());
    let yt = Tensor::poisoned(&d, DType::F32, &[rows, hidden]).unwrap();
    ops::rms_norm(&xt, &wt, 1e-5, &yt).unwrap();
    let mut y = vec![f32::NAN; rows * hidden];
    {
        let (xv, wv) = (TensorView::host(&x, &[rows, hidden]).unwrap(), TensorView::host(&w, &[hidden]).unwrap());
        let mut yv = TensorViewMut::host(&mut y, &[rows, hidden]).unwrap();
        ops::rms_norm_on(&d, Some(&xv), &wv, 1e-5, &mut yv).unwrap();
    }
    assert_eq!(bits_f32(&y), bits_f32(&yt.to_vec::<f32>().unwrap()));
    let mut inplace = x.clone();
    {
        let wv = TensorView::host(&w, &[hidden]).unwrap();
        let mut v = TensorViewMut::host(&mut inplace, &[rows, hidden]).unwrap();
        ops::rms_norm_on(&d, None, &wv, 1e-5, &mut v).unwrap();
    }
    assert_eq!(bits_f32(&inplace), bits_f32(&y));

    // SwiGLU from a packed [gate | up] host buffer.
    let packed: Vec<f32> = (0..rows * 2 * hidden).map(|_| rng.normal() as f32).collect();
    let pt = Tensor::from_slice(&d, &packed, &[rows, 2 * hidden]).unwrap();
    let ot = Tensor::poisoned(&d, DType::F32, &[rows, hidden]).unwrap();
    ops::swiglu(GateUp::GateThenUp(&pt), &ot).unwrap();
    let mut o = vec![f32::NAN; rows * hidden];
    {
        let pv = TensorView::host(&packed, &[rows, 2 * hidden]).unwrap();
        let mut ov = TensorViewMut::host(&mut o, &[rows, hidden]).unwrap();
        ops::swiglu_on(&d, GateUpView::GateThenUp(&pv), &mut ov).unwrap();
    }
    assert_eq!(bits_f32(&o), bits_f32(&ot.to_vec::<f32>().unwrap()));

    // RoPE on bf16 host slices.
    let (t, hq, hk, hd) = (5, 4, 2, 64);
    let rope = Rope::new(&d, RopeConfig::llama3_1(hd)).unwrap();
    let q: Vec<bf16> = (0..t * hq * hd).map(|_| bf16::from_f64(rng.normal())).collect();
    let k: Vec<bf16> = (0..t * hk * hd).map(|_| bf16::from_f64(rng.normal())).collect();
    let pos: Vec<i64> = vec![0, 7, 8191, 131071, 3];
    let (qt, kt) =
        (Tensor::from_slice(&d, &q, &[t, hq, hd]).unwrap(), Tensor::from_slice(&d, &k, &[t, hk, hd]).unwrap());
    rope.apply(&qt, Some(&kt), &Tensor::from_slice(&d, &pos, &[t]).unwrap()).unwrap();
    let (mut qh, mut kh) = (q.clone(), k.clone());
    {
        let pv = TensorView::host(&pos, &[t]).unwrap();
        let mut qv = TensorViewMut::host(&mut qh, &[t, hq, hd]).unwrap();
        let mut kv = TensorViewMut::host(&mut kh, &[t, hk, hd]).unwrap();
        rope.apply_on(&d, &mut qv, Some(&mut kv), &pv).unwrap();
    }
    assert_eq!(qh, qt.to_vec::<bf16>().unwrap());
    assert_eq!(kh, kt.to_vec::<bf16>().unwrap());

    // Attention with host and device-resident offsets, on host slices.
    let (hq, hk, hd) = (4, 2, 64);
    let (cu_q, cu_k) = ([0i32, 3, 10], [0i32, 8, 15]);
    let q: Vec<f32> = (0..10 * hq * hd).map(|_| rng.normal() as f32).collect();
    let k: Vec<f32> = (0..15 * hk * hd).map(|_| rng.normal() as f32).collect();
    let v: Vec<f32> = (0..15 * hk * hd).map(|_| rng.normal() as f32).collect();
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
    let out_t = Tensor::poisoned(&d, DType::F32, &[10, hq, hd]).unwrap();
    ops::AttentionWorkspace::new(Tensor::from_slice(&d, &q, &[10, hq, hd]).unwrap().device())
        .forward(
            AttentionTensors {
                q: &Tensor::from_slice(&d, &q, &[10, hq, hd]).unwrap(),
                kv: KvTensors::Contiguous {
                    k: &Tensor::from_slice(&d, &k, &[15, hk, hd]).unwrap(),
                    v: &Tensor::from_slice(&d, &v, &[15, hk, hd]).unwrap(),
                },
                cu_seqlens: Offsets::Host { q: &cu_q, k: &cu_k },
                out: &out_t,
                lse: None,
            },
            &opts,
        )
        .unwrap();
    let expect = bits_f32(&out_t.to_vec::<f32>().unwrap());
    let mut ws = AttentionWorkspace::plan(&d, 4).unwrap();
    for device_offsets in [false, true] {
        let mut out = vec![f32::NAN; 10 * hq * hd];
        {
            let (qv, kv, vv) = (
                TensorView::host(&q, &[10, hq, hd]).unwrap(),
                TensorView::host(&k, &[15, hk, hd]).unwrap(),
                TensorView::host(&v, &[15, hk, hd]).unwrap(),
            );
            let (cqv, ckv) = (TensorView::host(&cu_q, &[3]).unwrap(), TensorView::host(&cu_k, &[3]).unwrap());
            let cu = if device_offsets {
                CuSeqlens::Device { q: &cqv, k: &ckv }
            } else {
                CuSeqlens::Host { q: &cu_q, k: &cu_k }
            };
            let mut ov = TensorViewMut::host(&mut out, &[10, hq, hd]).unwrap();
            let kv = KvInput::Contiguous { k: &kv, v: &vv };
            ws.forward_on(&d, AttentionArgs { q: &qv, kv, cu_seqlens: cu, out: &mut ov, lse: None }, &opts).unwrap();
        }
        assert_eq!(bits_f32(&out), expect, "device offsets: {device_offsets}");
    }
    ws.check_errors().unwrap();
}

#[test]
fn planned_calls_allocate_copy_and_wait_for_nothing() {
    let d = Device::emulated();
    let dt = DType::BF16;
    let (t, hq, hk, hd, ffn) = (6, 8, 2, 64, 128);
    let mut rng = Rng::new(3);
    let f = |n: usize, rng: &mut Rng| rng.normal_vec(n, 1.0, dt);
    let x = Tensor::from_f64(&d, dt, &f(t * hq * hd, &mut rng), &[t, hq * hd]).unwrap();
    let res = Tensor::from_f64(&d, dt, &f(t * hq * hd, &mut rng), &[t, hq * hd]).unwrap();
    let w = Tensor::from_f64(&d, dt, &f(hq * hd, &mut rng), &[hq * hd]).unwrap();
    let y = Tensor::zeros(&d, dt, &[t, hq * hd]).unwrap();
    let q = Tensor::from_f64(&d, dt, &f(t * hq * hd, &mut rng), &[t, hq, hd]).unwrap();
    let k = Tensor::from_f64(&d, dt, &f(t * hk * hd, &mut rng), &[t, hk, hd]).unwrap();
    let v = Tensor::from_f64(&d, dt, &f(t * hk * hd, &mut rng), &[t, hk, hd]).unwrap();
    let o = Tensor::zeros(&d, dt, &[t, hq, hd]).unwrap();
    let pos = Tensor::from_slice(&d, &[0i32, 1, 2, 0, 1, 2], &[t]).unwrap();
    let gate_up = Tensor::from_f64(&d, dt, &f(t * 2 * ffn, &mut rng), &[t, 2 * ffn]).unwrap();
    let h = Tensor::zeros(&d, dt, &[t, ffn]).unwrap();
    let (cu_host, cu) = ([0i32, 3, 6], Tensor::from_slice(&d, &[0i32, 3, 6], &[3]).unwrap());
    // Planning: the only allocations and uploads.
    let rope = Rope::new(&d, RopeConfig::llama3_1(hd)).unwrap();
    let mut ws = AttentionWorkspace::plan(&d, 8).unwrap();
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };

    let before = d.counters();
    for _ in 0..2 {
        ops::rms_norm(&x, &w, 1e-5, &y).unwrap();
        ops::fused_add_rms_norm(&x, &res, &w, 1e-5, &y).unwrap();
        rope.apply(&q, Some(&k), &pos).unwrap();
        ops::swiglu(GateUp::GateThenUp(&gate_up), &h).unwrap();
        ws.forward(
            AttentionTensors {
                q: &q,
                kv: KvTensors::Contiguous { k: &k, v: &v },
                cu_seqlens: Offsets::Device { q: &cu, k: &cu },
                out: &o,
                lse: None,
            },
            &opts,
        )
        .unwrap();
    }
    let after = d.counters();
    assert_eq!(
        after,
        DeviceCounters { launches: before.launches + 2 * 6, ..before },
        "a planned call allocated, copied or waited"
    );
    // Host offsets cost exactly one pinned upload (no pageable copy, no wait).
    ws.forward(
        AttentionTensors {
            q: &q,
            kv: KvTensors::Contiguous { k: &k, v: &v },
            cu_seqlens: Offsets::Host { q: &cu_host, k: &cu_host },
            out: &o,
            lse: None,
        },
        &opts,
    )
    .unwrap();
    assert_eq!(
        d.counters(),
        DeviceCounters { launches: after.launches + 1, pinned_uploads: after.pinned_uploads + 1, ..after }
    );
    // The hook is able to fail: an allocation, a pageable upload and a read-back all count.
    let c0 = d.counters();
    let tmp = Tensor::from_slice(&d, &[1.0f32], &[1]).unwrap();
    let _ = tmp.to_vec::<f32>().unwrap();
    let c1 = d.counters();
    assert_eq!(
        (c1.allocations, c1.pageable_uploads, c1.downloads),
        (c0.allocations + 1, c0.pageable_uploads + 1, c0.downloads + 1)
    );
    // A workspace planned too small grows once (an allocation), then is planned again.
    let mut small = AttentionWorkspace::new(&d);
    let c2 = d.counters();
    small
        .forward(
            AttentionTensors {
                q: &q,
                kv: KvTensors::Contiguous { k: &k, v: &v },
                cu_seqlens: Offsets::Device { q: &cu, k: &cu },
                out: &o,
                lse: None,
            },
            &opts,
        )
        .unwrap();
    assert!(d.counters().allocations > c2.allocations);
}

#[test]
fn device_offsets_match_host_offsets_and_invalid_ones_write_nothing() {
    for dtype in DType::FLOATS {
        let mut case =
            AttentionCase::new(dtype, &[(17, 40), (0, 5), (33, 33), (1, 0)], 8, 2, 64, AttentionMask::Causal);
        let host = attention_case(&Device::emulated(), &case).unwrap();
        case.device_offsets = true;
        let dev = attention_case(&Device::emulated(), &case).unwrap();
        assert!(host.pass && dev.pass, "{} / {}", host.describe(), dev.describe());
        assert!(common::bitwise_equal(&host.outputs, &dev.outputs), "{dtype}: device offsets change the result");
    }
    let d = Device::emulated();
    let (hq, hk, hd) = (4, 1, 64);
    let q = Tensor::zeros(&d, DType::BF16, &[9, hq, hd]).unwrap();
    let kv = Tensor::zeros(&d, DType::BF16, &[9, hk, hd]).unwrap();
    let mut ws = AttentionWorkspace::plan(&d, 4).unwrap();
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
    for bad in [[0, 5, 3, 9], [1, 3, 5, 9], [0, 3, 5, 8], [0, 3, 5, 10], [0, -4, 5, 9]] {
        let cu = Tensor::from_slice(&d, &bad, &[4]).unwrap();
        let good = Tensor::from_slice(&d, &[0i32, 3, 5, 9], &[4]).unwrap();
        for (cq, ck) in [(&cu, &good), (&good, &cu)] {
            let out = Tensor::poisoned(&d, DType::BF16, &[9, hq, hd]).unwrap();
            ws.forward(
                AttentionTensors {
                    q: &q,
                    kv: KvTensors::Contiguous { k: &kv, v: &kv },
                    cu_seqlens: Offsets::Device { q: cq, k: ck },
                    out: &out,
                    lse: None,
                },
                &opts,
            )
            .unwrap();
            assert!(out.to_f64_vec().unwrap().iter().all(|v| v.is_nan()), "{bad:?}: invalid offsets wrote output");
            let e = ws.check_errors().unwrap_err();
            assert!(matches!(e, Error::DeviceReported { .. }), "{bad:?}: {e}");
            ws.check_errors().unwrap(); // read and cleared
        }
    }
    // Shape errors of device offsets are caught on the host.
    let cu3 = Tensor::from_slice(&d, &[0i32, 9, 9], &[3]).unwrap();
    let cu4 = Tensor::from_slice(&d, &[0i32, 3, 5, 9], &[4]).unwrap();
    let out = Tensor::zeros(&d, DType::BF16, &[9, hq, hd]).unwrap();
    let e = ws
        .forward(
            AttentionTensors {
                q: &q,
                kv: KvTensors::Contiguous { k: &kv, v: &kv },
                cu_seqlens: Offsets::Device { q: &cu4, k: &cu3 },
                out: &out,
                lse: None,
            },
            &opts,
        )
        .unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "cu_seqlens_k", .. }), "{e}");
    let cu_i64 = Tensor::from_slice(&d, &[0i64, 9], &[2]).unwrap();
    let e = ws
        .forward(
            AttentionTensors {
                q: &q,
                kv: KvTensors::Contiguous { k: &kv, v: &kv },
                cu_seqlens: Offsets::Device { q: &cu_i64, k: &cu_i64 },
                out: &out,
                lse: None,
            },
            &opts,
        )
        .unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "cu_seqlens_q", .. }), "{e}");
}

#[test]
fn every_op_accepts_every_empty_view() {
    // Found by the survey: zero-token views (narrowed, or fresh [0, n]) were rejected with
    // BadLayout although empty batches are documented as no-ops.
    let d = Device::emulated();
    let base = Tensor::zeros(&d, DType::BF16, &[4, 128]).unwrap();
    let w = Tensor::zeros(&d, DType::BF16, &[128]).unwrap();
    let (x0, y0) =
        (base.narrow(0, 0, 0).unwrap(), Tensor::zeros(&d, DType::BF16, &[4, 128]).unwrap().narrow(0, 1, 0).unwrap());
    ops::rms_norm(&x0, &w, 1e-5, &y0).unwrap();
    ops::rms_norm(&x0, &w, 1e-5, &x0).unwrap();
    let r0 = Tensor::zeros(&d, DType::BF16, &[0, 128]).unwrap();
    ops::fused_add_rms_norm(&x0, &r0, &w, 1e-5, &y0).unwrap();
    let packed = Tensor::zeros(&d, DType::BF16, &[0, 256]).unwrap();
    let h = Tensor::zeros(&d, DType::BF16, &[0, 128]).unwrap();
    ops::swiglu(GateUp::GateThenUp(&packed), &h).unwrap();
    ops::swiglu(GateUp::Interleaved(&packed), &h).unwrap();
    ops::swiglu(GateUp::Separate { gate: &x0, up: &y0 }, &h).unwrap();
    let rope = Rope::new(&d, RopeConfig::llama3_1(64)).unwrap();
    let q = Tensor::zeros(&d, DType::BF16, &[3, 4, 64]).unwrap().narrow(0, 2, 0).unwrap();
    let k = Tensor::zeros(&d, DType::BF16, &[3, 1, 64]).unwrap().narrow(0, 1, 0).unwrap();
    let pos = Tensor::zeros(&d, DType::I32, &[3]).unwrap().narrow(0, 3, 0).unwrap();
    rope.apply(&q, Some(&k), &pos).unwrap();
    let kv = Tensor::zeros(&d, DType::BF16, &[0, 1, 64]).unwrap();
    let opts = AttentionOptions::default();
    ops::AttentionWorkspace::new(q.device())
        .forward(
            AttentionTensors {
                q: &q,
                kv: KvTensors::Contiguous { k: &kv, v: &kv },
                cu_seqlens: Offsets::Host { q: &[0, 0], k: &[0, 0] },
                out: &q.clone(),
                lse: None,
            },
            &opts,
        )
        .unwrap_or_else(|e| {
            // q and out are the same (empty) view: empty views overlap nothing.
            panic!("empty attention: {e}")
        });
    ops::AttentionWorkspace::new(q.device())
        .forward(
            AttentionTensors {
                q: &q,
                kv: KvTensors::Contiguous { k: &kv, v: &kv },
                cu_seqlens: Offsets::Host { q: &[0], k: &[0] },
                out: &Tensor::zeros(&d, DType::BF16, &[0, 4, 64]).unwrap(),
                lse: None,
            },
            &opts,
        )
        .unwrap();
    // And on borrowed empty host slices.
    let (e_in, mut e_out) = (Vec::<f32>::new(), Vec::<f32>::new());
    let wv = vec![1.0f32; 16];
    ops::rms_norm_on(
        &d,
        Some(&TensorView::host(&e_in, &[0, 16]).unwrap()),
        &TensorView::host(&wv, &[16]).unwrap(),
        1e-5,
        &mut TensorViewMut::host(&mut e_out, &[0, 16]).unwrap(),
    )
    .unwrap();
}

#[test]
fn empty_shapes_with_huge_dimensions_never_overflow() {
    // Found by the survey: [0, 1 << 60, 64] made gqa_attention panic in debug builds
    // ("attempt to multiply with overflow") and wrap silently in release.
    let d = Device::emulated();
    let q = Tensor::zeros(&d, DType::BF16, &[0, 1 << 60, 64]).unwrap();
    let k = Tensor::zeros(&d, DType::BF16, &[0, 1 << 58, 64]).unwrap();
    let out = Tensor::zeros(&d, DType::BF16, &[0, 1 << 60, 64]).unwrap();
    let lse = Tensor::zeros(&d, DType::F32, &[1 << 60, 0]).unwrap();
    ops::AttentionWorkspace::new(q.device())
        .forward(
            AttentionTensors {
                q: &q,
                kv: KvTensors::Contiguous { k: &k, v: &k },
                cu_seqlens: Offsets::Host { q: &[0, 0], k: &[0, 0] },
                out: &out,
                lse: Some(&lse),
            },
            &AttentionOptions::default(),
        )
        .unwrap();
    ops::rms_norm(&q, &Tensor::zeros(&d, DType::BF16, &[64]).unwrap(), 1e-5, &out).unwrap();
    let rope = Rope::new(&d, RopeConfig::llama3_1(64)).unwrap();
    rope.apply(&q, Some(&k), &Tensor::zeros(&d, DType::I32, &[0]).unwrap()).unwrap();
    // Non-empty shapes whose size overflows are named errors.
    let e = Tensor::zeros(&d, DType::BF16, &[1 << 40, 1 << 40]).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    let e = Tensor::zeros(&d, DType::BF16, &[1 << 62, 4]).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
}

#[test]
fn rope_rotates_disjoint_q_and_k_views_of_a_neox_fused_qkv_buffer() {
    // Found by the survey: with heads 3·d apart ([t, h, 3, d], GPT-NeoX), the overlap check fell
    // back to whole spans and called disjoint q and k views overlapping.
    let d = Device::emulated();
    let (t, h, hd) = (4, 3, 64);
    let mut rng = Rng::new(5);
    let all = rng.normal_vec(t * h * 3 * hd, 1.0, DType::F32);
    let buf = Tensor::from_f64(&d, DType::F32, &all, &[t, h, 3, hd]).unwrap();
    let view = |i: usize| buf.as_strided(&[t, h, hd], &[h * 3 * hd, 3 * hd, 1], i * hd).unwrap();
    let (q, k, v) = (view(0), view(1), view(2));
    let cfg = RopeConfig::llama3_1(hd);
    let rope = Rope::new(&d, cfg).unwrap();
    let positions = [0i64, 5, 17, 4000];
    let (q0, k0, v0) = (q.to_f64_vec().unwrap(), k.to_f64_vec().unwrap(), v.to_f64_vec().unwrap());
    rope.apply(&q, Some(&k), &Tensor::from_slice(&d, &positions, &[t]).unwrap()).unwrap();
    let tol = Tolerance { atol: 2e-6, rtol: 2e-6 };
    let qr = llama_kernels::reference::rope::rope(&q0, h, &positions, &cfg).unwrap();
    let kr = llama_kernels::reference::rope::rope(&k0, h, &positions, &cfg).unwrap();
    assert!(compare(&q.to_f64_vec().unwrap(), &qr, tol).pass);
    assert!(compare(&k.to_f64_vec().unwrap(), &kr, tol).pass);
    assert_eq!(v.to_f64_vec().unwrap(), v0, "v must be untouched");
    // Overlapping views are still refused.
    let shifted = buf.as_strided(&[t, h, hd], &[h * 3 * hd, 3 * hd, 1], hd - 1).unwrap();
    let e = rope.apply(&q, Some(&shifted), &Tensor::from_slice(&d, &positions, &[t]).unwrap()).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
}

#[test]
fn rope_positions_outside_the_domain_are_clamped_rotations() {
    // Found by the survey: |p| >= 2^24 returned Ok with wrong angles, and i64::MAX gave values of
    // 1e29 and inf (not a rotation). Now: clamped to +-(2^24 - 1), on both targets, and the
    // reference agrees.
    let max = ops::rope::MAX_POSITION;
    let positions = [max, max + 1, -max - 1, i64::MAX, i64::MIN, 1 << 40, -(1 << 33), 12345];
    let hd = 64;
    let cfg = RopeConfig { layout: ops::RopeLayout::Interleaved, ..RopeConfig::llama3_1(hd) };
    for device in common::devices() {
        let rope = Rope::new(&device, cfg).unwrap();
        let mut rng = Rng::new(17);
        let x = rng.normal_vec(positions.len() * hd, 1.0, DType::F32);
        let q = Tensor::from_f64(&device, DType::F32, &x, &[positions.len(), 1, hd]).unwrap();
        rope.apply(&q, None, &Tensor::from_slice(&device, &positions, &[positions.len()]).unwrap()).unwrap();
        let got = q.to_f64_vec().unwrap();
        let expect = llama_kernels::reference::rope::rope(&x, 1, &positions, &cfg).unwrap();
        let c = compare(&got, &expect, Tolerance { atol: 3e-6, rtol: 3e-6 });
        assert!(c.pass, "{}", c.describe(&[positions.len(), hd]));
        // A rotation: every pair keeps its length.
        for (i, (g, x)) in got.chunks(2).zip(x.chunks(2)).enumerate() {
            let (a, b) = ((g[0] * g[0] + g[1] * g[1]).sqrt(), (x[0] * x[0] + x[1] * x[1]).sqrt());
            assert!(
                g.iter().all(|v| v.is_finite()) && (a - b).abs() <= 1e-5 * b.max(1.0),
                "pair {i}: {g:?} from {x:?}"
            );
        }
        // Clamped: the same as rotating at the domain's edge.
        let edge = [max, max, -max, max, -max, max, -max, 12345];
        let at_edge = llama_kernels::reference::rope::rope(&x, 1, &edge, &cfg).unwrap();
        assert_eq!(expect, at_edge);
    }
}

#[test]
fn non_finite_values_follow_the_documented_attention_contract() {
    // Found by the survey: a NaN in V at key j also reached causal rows before j that share its
    // tile (0 * NaN in P V), as in PyTorch's SDPA. The contract (reference::attention::
    // nan_exposed_rows): attended NaN -> NaN; masked NaN -> exact or NaN; other sequences exact.
    for dtype in DType::FLOATS {
        let d = Device::emulated();
        let (hq, hk, hd) = (4, 2, 64);
        let (cu_q, cu_k) = ([0i32, 100, 130], [0i32, 100, 130]);
        let mut rng = Rng::new(23);
        let q = rng.normal_vec(130 * hq * hd, 1.0, dtype);
        let k = rng.normal_vec(130 * hk * hd, 1.0, dtype);
        let mut v = rng.normal_vec(130 * hk * hd, 1.0, dtype);
        v[(70 * hk) * hd + 3] = f64::NAN; // key 70 of sequence 0, kv head 0
        let mut kk = k.clone();
        kk[(90 * hk + 1) * hd + 5] = f64::INFINITY; // key 90, kv head 1
        let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
        let out = Tensor::poisoned(&d, dtype, &[130, hq, hd]).unwrap();
        let lse = Tensor::poisoned(&d, DType::F32, &[hq, 130]).unwrap();
        ops::AttentionWorkspace::new(Tensor::from_f64(&d, dtype, &q, &[130, hq, hd]).unwrap().device())
            .forward(
                AttentionTensors {
                    q: &Tensor::from_f64(&d, dtype, &q, &[130, hq, hd]).unwrap(),
                    kv: KvTensors::Contiguous {
                        k: &Tensor::from_f64(&d, dtype, &kk, &[130, hk, hd]).unwrap(),
                        v: &Tensor::from_f64(&d, dtype, &v, &[130, hk, hd]).unwrap(),
                    },
                    cu_seqlens: Offsets::Host { q: &cu_q, k: &cu_k },
                    out: &out,
                    lse: Some(&lse),
                },
                &opts,
            )
            .unwrap();
        let spec = AttentionSpec {
            q_heads: hq,
            kv_heads: hk,
            head_dim: hd,
            mask: opts.mask,
            scale: 1.0 / (hd as f64).sqrt(),
            temperature: None,
        };
        let (oref, lref) = attention(&q, &kk, &v, &cu_q, &cu_k, &spec).unwrap();
        let exposed = nan_exposed_rows(&kk, &v, &cu_q, &cu_k, &spec).unwrap();
        assert!(exposed.iter().any(|&e| e) && exposed.iter().any(|&e| !e));
        let (og, lg) = (out.to_f64_vec().unwrap(), lse.to_f64_vec().unwrap());
        let tol = attention_tolerance(dtype);
        for row in 0..130 * hq {
            let (token, head) = (row / hq, row % hq);
            for e in 0..hd {
                let (g, r) = (og[row * hd + e], oref[row * hd + e]);
                let exact = if r.is_nan() { g.is_nan() } else { (g - r).abs() <= tol.atol + tol.rtol * r.abs() };
                assert!(exact || (exposed[row] && g.is_nan()), "{dtype} token {token} head {head} dim {e}: {g} vs {r}");
            }
            let (g, r) = (lg[head * 130 + token], lref[head * 130 + token]);
            let exact = if r.is_nan() { g.is_nan() } else { (g - r).abs() <= 1e-4 + 1e-5 * r.abs() };
            assert!(exact || (exposed[row] && g.is_nan()), "{dtype} lse token {token} head {head}: {g} vs {r}");
            if token >= 100 {
                assert!(!exposed[row], "the other sequence is never exposed");
            }
        }
        // Rows that attend the NaN are NaN in the reference, hence in the kernel.
        assert!(oref[(80 * hq) * hd + 3].is_nan() && og[(80 * hq) * hd + 3].is_nan());
    }
}

#[test]
fn zero_kv_heads_get_their_own_message() {
    let d = Device::emulated();
    let q = Tensor::zeros(&d, DType::BF16, &[4, 8, 64]).unwrap();
    let kv = Tensor::zeros(&d, DType::BF16, &[4, 0, 64]).unwrap();
    let e = ops::AttentionWorkspace::new(q.device())
        .forward(
            AttentionTensors {
                q: &q,
                kv: KvTensors::Contiguous { k: &kv, v: &kv },
                cu_seqlens: Offsets::Host { q: &[0, 4], k: &[0, 4] },
                out: &q.clone(),
                lse: None,
            },
            &AttentionOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "kv_heads", .. }), "{e}");
    assert!(e.to_string().contains("kv_heads = 0"), "{e}");
}

#[test]
fn devices_are_identified_by_context_and_stream() {
    let a = Device::emulated();
    let a2 = a.clone();
    let b = Device::emulated();
    assert!(a.same(&a2) && a.same_context(&a2));
    assert!(!a.same(&b) && !a.same_context(&b));
    let x = Tensor::zeros(&a, DType::F32, &[2, 8]).unwrap();
    let w = Tensor::zeros(&b, DType::F32, &[8]).unwrap();
    let e = ops::rms_norm(&x, &w, 1e-5, &x.clone()).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { what: "weight", .. }), "{e}");
    let sel = Device::select();
    if let Some(reason) = &sel.cuda_skipped {
        assert!(!reason.to_string().is_empty());
    }
}
