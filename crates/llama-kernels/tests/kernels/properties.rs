//! Randomized differential testing: every op on random shapes, strides, offsets (so alignment
//! varies and both the 16-byte and the scalar paths run), dtypes, in-place and view combinations,
//! compared with the f64 reference on the emulated target. Outputs live in poisoned buffers with
//! gaps, and the gaps must come back untouched.
//!
//! `cargo test` runs a fixed number of cases per property (`LLK_PROPTEST_CASES`, default 24);
//! `scripts/proptest-long.sh` runs thousands. proptest records a failing case under
//! `proptest-regressions/` and replays it first on every later run: commit those files, and turn
//! each one into a named regression test.

use llama_kernels::dev::testing::{Rng, Tolerance, compare};
use llama_kernels::dev::verify::{attention_tolerance, rope_tolerance};
use llama_kernels::ops::attention::{AttentionTensors, KvTensors, Offsets};
use llama_kernels::ops::{
    self, AttentionMask, AttentionOptions, AttentionWorkspace, GateUp, Llama3Scaling, Rope, RopeConfig, RopeLayout,
};
use llama_kernels::reference;
use llama_kernels::{DType, Device, Tensor};
use proptest::prelude::*;
use proptest::test_runner::Config;

fn config(default_cases: u32) -> Config {
    let cases = std::env::var("LLK_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default_cases);
    Config { cases, max_shrink_iters: 64, ..Config::default() }
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

/// A `[rows, cols]` view into a larger buffer: rows `cols + pad` apart, starting at `offset`.
#[derive(Clone, Copy, Debug)]
struct Layout {
    pad: usize,
    offset: usize,
}

fn layout() -> impl Strategy<Value = Layout> {
    (prop_oneof![Just(0usize), 0usize..9], prop_oneof![Just(0usize), 0usize..9])
        .prop_map(|(pad, offset)| Layout { pad, offset })
}

/// A buffer holding `rows x cols` random values in the view and NaN poison everywhere else.
struct Placed {
    buf: Tensor,
    view: Tensor,
    values: Vec<f64>,
}

fn place(device: &Device, dtype: DType, rows: usize, cols: usize, l: Layout, rng: &mut Rng) -> Placed {
    let stride = cols + l.pad;
    let len = l.offset + rows * stride + 1;
    let buf = Tensor::poisoned(device, dtype, &[len]).unwrap();
    let view = buf.as_strided(&[rows, cols], &[stride, 1], l.offset).unwrap();
    let values = rng.normal_vec(rows * cols, 1.0, dtype);
    view.copy_from_f64(&values).unwrap();
    Placed { buf, view, values }
}

/// Every buffer element outside the view is still NaN poison.
fn gaps_untouched(p: &Placed, rows: usize, cols: usize, l: Layout) -> bool {
    let all = p.buf.to_f64_vec().unwrap();
    let stride = cols + l.pad;
    all.iter().enumerate().all(|(i, v)| {
        let inside = i >= l.offset && (i - l.offset) < rows * stride && (i - l.offset) % stride < cols;
        inside || v.is_nan()
    })
}

proptest! {
    #![proptest_config(config(24))]

    #[test]
    fn rms_norm_matches_the_reference(
        dtype in dtype(), rows in 0usize..7, cols in 1usize..300, fused in any::<bool>(), in_place in any::<bool>(),
        lx in layout(), ly in layout(), lr in layout(), seed in any::<u64>(),
    ) {
        let d = Device::emulated();
        let mut rng = Rng::new(seed);
        let x = place(&d, dtype, rows, cols, lx, &mut rng);
        let w = rng.normal_vec(cols, 1.0, dtype);
        let wt = Tensor::from_f64(&d, dtype, &w, &[cols]).unwrap();
        let y = if in_place { None } else { Some(place(&d, dtype, rows, cols, ly, &mut rng)) };
        let out = y.as_ref().map_or(&x.view, |y| &y.view);
        if let Some(y) = &y {
            y.view.fill_bytes(0xff).unwrap(); // poison the output itself too
        }
        let eps = 1e-5;
        let tol = Tolerance::rounded_output(dtype);
        if fused {
            let r = place(&d, dtype, rows, cols, lr, &mut rng);
            ops::fused_add_rms_norm(&x.view, &r.view, &wt, eps, out).unwrap();
            let (sum, yref) =
                reference::rms_norm::fused_add_rms_norm(&x.values, &r.values, &w, cols, f64::from(eps), dtype).unwrap();
            let c = compare(&r.view.to_f64_vec().unwrap(), &sum, tol);
            prop_assert!(c.pass, "residual: {}", c.describe(&[rows, cols]));
            let c = compare(&out.to_f64_vec().unwrap(), &yref, tol);
            prop_assert!(c.pass, "y: {}", c.describe(&[rows, cols]));
            prop_assert!(gaps_untouched(&r, rows, cols, lr));
        } else {
            ops::rms_norm(&x.view, &wt, eps, out).unwrap();
            let yref = reference::rms_norm::rms_norm(&x.values, &w, cols, f64::from(eps)).unwrap();
            let c = compare(&out.to_f64_vec().unwrap(), &yref, tol);
            prop_assert!(c.pass, "{}", c.describe(&[rows, cols]));
        }
        match &y {
            Some(y) => prop_assert!(gaps_untouched(y, rows, cols, ly)),
            None => prop_assert!(gaps_untouched(&x, rows, cols, lx)),
        }
    }

    #[test]
    fn swiglu_matches_the_reference(
        dtype in dtype(), rows in 0usize..7, d_half in 1usize..200, kind in 0u8..3, in_place in any::<bool>(),
        lg in layout(), lu in layout(), lo in layout(), seed in any::<u64>(),
    ) {
        let dev = Device::emulated();
        let mut rng = Rng::new(seed);
        let tol = Tolerance::rounded_output(dtype);
        let out = place(&dev, dtype, rows, d_half, lo, &mut rng);
        out.view.fill_bytes(0xff).unwrap();
        let (got, expect, out_p, out_l) = match kind {
            0 => {
                let g = place(&dev, dtype, rows, d_half, lg, &mut rng);
                let u = place(&dev, dtype, rows, d_half, lu, &mut rng);
                let expect = reference::swiglu::swiglu(&g.values, &u.values).unwrap();
                if in_place {
                    ops::swiglu(GateUp::Separate { gate: &g.view, up: &u.view }, &g.view).unwrap();
                    (g.view.to_f64_vec().unwrap(), expect, g, lg)
                } else {
                    ops::swiglu(GateUp::Separate { gate: &g.view, up: &u.view }, &out.view).unwrap();
                    (out.view.to_f64_vec().unwrap(), expect, out, lo)
                }
            }
            1 => {
                let p = place(&dev, dtype, rows, 2 * d_half, lg, &mut rng);
                let (g, u): (Vec<f64>, Vec<f64>) = (
                    p.values.chunks(2 * d_half).flat_map(|r| r[..d_half].to_vec()).collect(),
                    p.values.chunks(2 * d_half).flat_map(|r| r[d_half..].to_vec()).collect(),
                );
                let expect = reference::swiglu::swiglu(&g, &u).unwrap();
                if in_place {
                    let gate = p.view.narrow(1, 0, d_half).unwrap();
                    ops::swiglu(GateUp::GateThenUp(&p.view), &gate).unwrap();
                    let got = gate.to_f64_vec().unwrap();
                    (got, expect, out, lo)
                } else {
                    ops::swiglu(GateUp::GateThenUp(&p.view), &out.view).unwrap();
                    (out.view.to_f64_vec().unwrap(), expect, out, lo)
                }
            }
            _ => {
                let p = place(&dev, dtype, rows, 2 * d_half, lg, &mut rng);
                let g: Vec<f64> = p.values.iter().step_by(2).copied().collect();
                let u: Vec<f64> = p.values.iter().skip(1).step_by(2).copied().collect();
                let expect = reference::swiglu::swiglu(&g, &u).unwrap();
                ops::swiglu(GateUp::Interleaved(&p.view), &out.view).unwrap();
                (out.view.to_f64_vec().unwrap(), expect, out, lo)
            }
        };
        let c = compare(&got, &expect, tol);
        prop_assert!(c.pass, "{}", c.describe(&[rows, d_half]));
        // The packed in-place case writes the gate half of a packed buffer: skip its gap check.
        if !(kind == 1 && in_place) {
            prop_assert!(gaps_untouched(&out_p, rows, d_half, out_l));
        }
    }

    #[test]
    fn rope_matches_the_reference(
        dtype in dtype(), tokens in 0usize..5, q_heads in 1usize..4, kv_heads in 0usize..3,
        head_dim in prop_oneof![Just(8usize), Just(16), Just(64), Just(80), Just(96), Just(128)],
        rotary_frac in 1usize..5, interleaved in any::<bool>(), scaled in any::<bool>(), norm in any::<bool>(),
        i64_positions in any::<bool>(), head_pad in 0usize..9, token_pad in 0usize..9, offset in 0usize..9,
        seed in any::<u64>(),
    ) {
        let d = Device::emulated();
        let mut rng = Rng::new(seed);
        let rotary_dim = ((head_dim * rotary_frac / 4) & !1).max(2);
        let cfg = RopeConfig {
            head_dim,
            rotary_dim,
            theta: 500_000.0,
            layout: if interleaved { RopeLayout::Interleaved } else { RopeLayout::HalfSplit },
            scaling: scaled.then_some(Llama3Scaling::LLAMA_3_1),
            qk_norm_eps: norm.then_some(1e-5),
        };
        let rope = Rope::new(&d, cfg).unwrap();
        // q and k heads interleaved in one buffer ([t, q_heads + kv_heads, head_dim + pad]).
        let heads = q_heads + kv_heads;
        let (hs, ts) = (head_dim + head_pad, heads * (head_dim + head_pad) + token_pad);
        let buf = Tensor::poisoned(&d, dtype, &[offset + tokens * ts + 1]).unwrap();
        let q = buf.as_strided(&[tokens, q_heads, head_dim], &[ts, hs, 1], offset).unwrap();
        let k = buf.as_strided(&[tokens, kv_heads, head_dim], &[ts, hs, 1], offset + q_heads * hs).unwrap();
        let (qv, kv) = (rng.normal_vec(tokens * q_heads * head_dim, 1.0, dtype), rng.normal_vec(tokens * kv_heads * head_dim, 1.0, dtype));
        q.copy_from_f64(&qv).unwrap();
        k.copy_from_f64(&kv).unwrap();
        let positions: Vec<i64> = (0..tokens).map(|_| rng.below(1 << 25) as i64 - (1 << 24)).collect();
        let pos = if i64_positions {
            Tensor::from_slice(&d, &positions, &[tokens]).unwrap()
        } else {
            Tensor::from_slice(&d, &positions.iter().map(|&p| p as i32).collect::<Vec<_>>(), &[tokens]).unwrap()
        };
        rope.apply(&q, (kv_heads > 0).then_some(&k), &pos).unwrap();
        let tol = rope_tolerance(dtype);
        let qr = reference::rope::rope(&qv, q_heads, &positions, &cfg).unwrap();
        let c = compare(&q.to_f64_vec().unwrap(), &qr, tol);
        prop_assert!(c.pass, "q: {}", c.describe(&[tokens, q_heads, head_dim]));
        if kv_heads > 0 {
            let kr = reference::rope::rope(&kv, kv_heads, &positions, &cfg).unwrap();
            let c = compare(&k.to_f64_vec().unwrap(), &kr, tol);
            prop_assert!(c.pass, "k: {}", c.describe(&[tokens, kv_heads, head_dim]));
        }
        // Padding between heads and tokens is untouched.
        let all = buf.to_f64_vec().unwrap();
        for (i, v) in all.iter().enumerate() {
            let inside = i >= offset && (i - offset) < tokens * ts && {
                let r = (i - offset) % ts;
                r < heads * hs && r % hs < head_dim
            };
            prop_assert!(inside || v.is_nan(), "gap element {} written", i);
        }
    }

    #[test]
    fn attention_matches_the_reference(
        dtype in dtype(), head_dim in prop_oneof![Just(64usize), Just(96), Just(128)],
        kv_heads in 1usize..3, group in prop_oneof![Just(1usize), Just(2), Just(4)],
        lens in proptest::collection::vec((0usize..20, 0usize..28), 1..4),
        mask_kind in 0u8..3, chunk in 1usize..20, temperature in any::<bool>(), with_lse in any::<bool>(),
        device_offsets in any::<bool>(), token_pad in 0usize..3, seed in any::<u64>(),
    ) {
        let d = Device::emulated();
        let mut rng = Rng::new(seed);
        let q_heads = kv_heads * group;
        let mut cu_q = vec![0i32];
        let mut cu_k = vec![0i32];
        for &(ql, kl) in &lens {
            cu_q.push(cu_q[cu_q.len() - 1] + ql as i32);
            cu_k.push(cu_k[cu_k.len() - 1] + kl as i32);
        }
        let (tq, tk) = (cu_q[lens.len()] as usize, cu_k[lens.len()] as usize);
        // Token strides padded by whole 16-byte vectors (the tensor-core path needs aligned rows).
        let pad = token_pad * dtype.vec16();
        let make = |t: usize, h: usize, rng: &mut Rng| {
            let ts = h * head_dim + pad;
            let buf = Tensor::poisoned(&d, dtype, &[t * ts + 1]).unwrap();
            let view = buf.as_strided(&[t, h, head_dim], &[ts, head_dim, 1], 0).unwrap();
            let values = rng.normal_vec(t * h * head_dim, 1.0, dtype);
            view.copy_from_f64(&values).unwrap();
            (view, values)
        };
        let (q, qv) = make(tq, q_heads, &mut rng);
        let (k, kv) = make(tk, kv_heads, &mut rng);
        let (v, vv) = make(tk, kv_heads, &mut rng);
        let (out, _) = make(tq, q_heads, &mut rng);
        out.fill_bytes(0xff).unwrap();
        let lse = with_lse.then(|| Tensor::poisoned(&d, DType::F32, &[q_heads, tq]).unwrap());
        let mask = match mask_kind {
            0 => AttentionMask::None,
            1 => AttentionMask::Causal,
            _ => AttentionMask::ChunkedCausal { chunk_size: chunk },
        };
        let opts = AttentionOptions {
            mask,
            temperature: temperature.then_some(ops::Llama4Temperature { floor_scale: 4.0, attn_scale: 0.5 }),
            ..Default::default()
        };
        let mut ws = AttentionWorkspace::new(&d);
        if device_offsets {
            let cq = Tensor::from_slice(&d, &cu_q, &[cu_q.len()]).unwrap();
            let ck = Tensor::from_slice(&d, &cu_k, &[cu_k.len()]).unwrap();
            ws.forward(AttentionTensors { q: &q, kv: KvTensors::Contiguous { k: &k, v: &v }, cu_seqlens: Offsets::Device { q: &cq, k: &ck }, out: &out, lse: lse.as_ref() }, &opts).unwrap();
            ws.check_errors().unwrap();
        } else {
            ws.forward(AttentionTensors { q: &q, kv: KvTensors::Contiguous { k: &k, v: &v }, cu_seqlens: Offsets::Host { q: &cu_q, k: &cu_k }, out: &out, lse: lse.as_ref() }, &opts).unwrap();
        }
        let spec = reference::attention::AttentionSpec {
            q_heads, kv_heads, head_dim, mask, scale: 1.0 / (head_dim as f64).sqrt(), temperature: opts.temperature,
        };
        let (oref, lref) = reference::attention::attention(&qv, &kv, &vv, &cu_q, &cu_k, &spec).unwrap();
        let c = compare(&out.to_f64_vec().unwrap(), &oref, attention_tolerance(dtype));
        prop_assert!(c.pass, "out: {}", c.describe(&[tq, q_heads, head_dim]));
        if let Some(l) = &lse {
            let c = compare(&l.to_f64_vec().unwrap(), &lref, llama_kernels::dev::verify::LSE_TOLERANCE);
            prop_assert!(c.pass, "lse: {}", c.describe(&[q_heads, tq]));
        }
    }
}
