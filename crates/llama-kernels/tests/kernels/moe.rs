//! MoE parity against the f64 reference (emulated, and CUDA when present): routing in every mode
//! over the expert/k/token sweep, ties and NaN logits; the permutation (empty experts, one expert
//! taking everything, invalid ids, hundreds of thousands of slots); gather; the grouped GEMM in
//! both weight layouts, every epilogue, both block sizes, every dtype; combine; the whole layer
//! (Llama 4 Scout and Mixtral shaped, scaled down, and grouped routing); schedules bit for bit;
//! no allocation or host wait in a planned forward; every validation error.

use crate::common;

use llama_kernels::dev::verify::{
    CaseResult, GemmWeights, IdPattern, LogitPattern, MoeAlignCase, MoeCombineCase, MoeFfnCase, MoeGatherCase,
    MoeGemmCase, MoeRouteCase, moe_align_case, moe_combine_case, moe_ffn_case, moe_gather_case, moe_gemm_case,
    moe_route_case,
};
use llama_kernels::ops::moe::{
    self, ExpertWeights, GemmGroups, MoeAlign, MoeFfnConfig, MoeResidual, MoeRouting, WeightLayout,
};
use llama_kernels::ops::moe::{GateUpTensors, MoeFfn, MoeFfnWeights, SharedExpertTensors};
use llama_kernels::{DType, Device, Error, Tensor, TensorView, TensorViewMut};

fn assert_pass(what: &str, device: &Device, r: llama_kernels::Result<CaseResult>) -> CaseResult {
    let r = r.unwrap_or_else(|e| panic!("{what} on {device:?}: {e}"));
    assert!(r.pass, "{} on {device:?}", r.describe());
    r
}

/// A valid grouped configuration for `experts` (groups of at least 2, half of them kept), or
/// None when k does not fit in the kept groups.
fn grouped_for(experts: usize, k: usize) -> Option<MoeRouting> {
    let n_group = [8, 4, 2, 1].into_iter().find(|g| experts % g == 0 && experts / g >= 2)?;
    let topk_group = (n_group / 2).max(1);
    (k <= topk_group * (experts / n_group)).then_some(MoeRouting::Grouped {
        n_group,
        topk_group,
        renormalize: true,
        routed_scaling_factor: 2.5,
    })
}

fn modes(experts: usize, k: usize) -> Vec<MoeRouting> {
    let mut v =
        vec![MoeRouting::Llama4, MoeRouting::Softmax { renormalize: false }, MoeRouting::Softmax { renormalize: true }];
    v.extend(grouped_for(experts, k));
    v
}

// ------------------------------------------------------------------------------------ routing

#[test]
fn routing_sweep_every_mode_expert_count_k_and_token_count() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for experts in [4, 8, 16, 60, 128, 256] {
                for k in [1, 2, 8] {
                    if k > experts {
                        continue;
                    }
                    for tokens in [1, 3, 64, 257] {
                        for routing in modes(experts, k) {
                            let mut c = MoeRouteCase::new(dtype, tokens, experts, k, routing);
                            c.bias = matches!(routing, MoeRouting::Grouped { .. }) && tokens != 3;
                            c.seed = (tokens * 31 + experts) as u64;
                            assert_pass(&format!("{c:?}"), &device, moe_route_case(&device, &c));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn routing_at_the_limits_512_experts_and_16_grouped_slots() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for routing in modes(512, 8) {
                let c = MoeRouteCase::new(dtype, 37, 512, 8, routing);
                assert_pass(&format!("{c:?}"), &device, moe_route_case(&device, &c));
            }
            for (experts, n_group, topk_group) in [(160, 8, 3), (384, 16, 4), (512, 32, 8)] {
                let routing =
                    MoeRouting::Grouped { n_group, topk_group, renormalize: false, routed_scaling_factor: 1.0 };
                let mut c = MoeRouteCase::new(dtype, 20, experts, 16, routing);
                c.bias = true;
                assert_pass(&format!("{c:?}"), &device, moe_route_case(&device, &c));
            }
            // Strided logit rows.
            let mut c = MoeRouteCase::new(dtype, 9, 60, 2, MoeRouting::Softmax { renormalize: true });
            c.pad = 4;
            assert_pass(&format!("{c:?}"), &device, moe_route_case(&device, &c));
        }
    }
}

#[test]
fn exact_ties_go_to_the_lower_expert_and_nan_is_chosen_last() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for experts in [8, 60, 256] {
                for k in [2, 8] {
                    for routing in modes(experts, k) {
                        for logits in [LogitPattern::Ties, LogitPattern::NaN] {
                            let mut c = MoeRouteCase::new(dtype, 64, experts, k, routing);
                            c.logits = logits;
                            c.bias = matches!(routing, MoeRouting::Grouped { .. });
                            assert_pass(&format!("{c:?}"), &device, moe_route_case(&device, &c));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn documented_tie_and_nan_semantics() {
    let d = Device::emulated();
    // Row 0: all equal -> experts 0, 1, 2. Row 1: all NaN -> 0, 1, 2 with NaN weights. Row 2:
    // NaN everywhere but experts 5 and 6 -> 5, 6, then the lowest NaN expert (0), weight NaN.
    let e = 8;
    let mut l = vec![0.5f32; 3 * e];
    l[e..2 * e].fill(f32::NAN);
    l[2 * e..].fill(f32::NAN);
    l[2 * e + 5] = 1.0;
    l[2 * e + 6] = 1.0;
    let logits = Tensor::from_slice(&d, &l, &[3, e]).unwrap();
    for routing in [MoeRouting::Llama4, MoeRouting::Softmax { renormalize: false }] {
        let ids = Tensor::poisoned(&d, DType::I32, &[3, 3]).unwrap();
        let w = Tensor::poisoned(&d, DType::F32, &[3, 3]).unwrap();
        moe::moe_route(&logits, None, routing, &ids, &w).unwrap();
        assert_eq!(ids.to_vec::<i32>().unwrap(), vec![0, 1, 2, 0, 1, 2, 5, 6, 0], "{routing:?}");
        let w = w.to_vec::<f32>().unwrap();
        assert!(w[..3].iter().all(|v| v.is_finite()), "{routing:?}: {w:?}");
        assert!(w[3..6].iter().all(|v| v.is_nan()), "{routing:?}: {w:?}");
        assert!(w[6].is_finite() && w[7].is_finite() && w[8].is_nan(), "{routing:?}: {w:?}");
        if routing == MoeRouting::Llama4 {
            assert!((w[0] - 1.0 / (1.0 + (-0.5f32).exp())).abs() < 1e-6, "{w:?}");
        } else {
            assert!((w[0] - 1.0 / 8.0).abs() < 1e-7 && (w[6] - 0.5).abs() < 1e-7, "{w:?}");
        }
    }
}

// ------------------------------------------------------------------------------------ align

#[test]
fn align_empty_experts_one_expert_and_invalid_ids() {
    for device in common::devices() {
        for (tokens, experts, k) in [(1, 4, 1), (3, 8, 2), (64, 16, 1), (257, 60, 2), (257, 128, 8), (100, 256, 8)] {
            for block_m in [16, 64] {
                for ids in [IdPattern::Random, IdPattern::Sparse, IdPattern::OneExpert, IdPattern::Invalid] {
                    let c = MoeAlignCase { tokens, experts, top_k: k, block_m, ids, seed: 3 };
                    assert_pass(&format!("{c:?}"), &device, moe_align_case(&device, &c));
                }
            }
        }
    }
}

#[test]
fn align_hundreds_of_thousands_of_slots() {
    // 200 000 slots: more than 128 chunks of 1024, so each chunk holds 2048 slots.
    for device in common::devices() {
        for (tokens, experts, k) in [(25_000, 128, 8), (150_000, 16, 1)] {
            let c = MoeAlignCase { tokens, experts, top_k: k, block_m: 64, ids: IdPattern::Random, seed: 9 };
            assert_pass(&format!("{c:?}"), &device, moe_align_case(&device, &c));
        }
        let c = MoeAlignCase { tokens: 20_000, experts: 512, top_k: 8, block_m: 16, ids: IdPattern::Sparse, seed: 9 };
        assert_pass(&format!("{c:?}"), &device, moe_align_case(&device, &c));
    }
}

// ------------------------------------------------------------------------------------ gather, combine

#[test]
fn gather_scaled_and_unscaled_vector_and_scalar_paths() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for (tokens, experts, k, hidden) in
                [(1, 4, 1, 64), (3, 8, 2, 72), (64, 16, 1, 128), (257, 60, 2, 68), (33, 128, 8, 100)]
            {
                for scaled in [false, true] {
                    let c = MoeGatherCase { dtype, tokens, experts, top_k: k, hidden, scaled, seed: 5 };
                    assert_pass(&format!("{c:?}"), &device, moe_gather_case(&device, &c));
                }
            }
        }
    }
}

#[test]
fn combine_weighted_unweighted_shared_and_residual() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for (tokens, experts, k, hidden) in [(1, 4, 1, 64), (3, 8, 2, 72), (64, 16, 8, 128), (257, 60, 2, 68)] {
                for weighted in [false, true] {
                    for (shared, residual) in [(false, 0), (true, 1), (true, 2), (false, 2)] {
                        let c = MoeCombineCase {
                            dtype,
                            tokens,
                            experts,
                            top_k: k,
                            hidden,
                            weighted,
                            shared,
                            residual,
                            seed: 7,
                        };
                        assert_pass(&format!("{c:?}"), &device, moe_combine_case(&device, &c));
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------ grouped GEMM

const LAYOUTS: [WeightLayout; 2] = [WeightLayout::InOut, WeightLayout::OutIn];
const EPILOGUES: [GemmWeights; 3] = [GemmWeights::Plain, GemmWeights::SwiGluPacked, GemmWeights::SwiGluSeparate];

#[test]
fn grouped_gemm_both_layouts_every_epilogue_both_block_sizes() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for layout in LAYOUTS {
                for weights in EPILOGUES {
                    for block_m in [16, 64] {
                        for (tokens, experts, k, kin, n) in
                            [(3, 8, 2, 64, 64), (64, 16, 1, 128, 192), (40, 4, 2, 96, 136)]
                        {
                            let mut c = MoeGemmCase::new(dtype, tokens, experts, k, kin, n);
                            (c.layout, c.weights, c.block_m) = (layout, weights, block_m);
                            assert_pass(&format!("{c:?}"), &device, moe_gemm_case(&device, &c));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn grouped_gemm_empty_experts_one_expert_k_tails_strides_and_dense() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for layout in LAYOUTS {
                // Some experts get nothing; all rows on one expert (several full blocks).
                for ids in [IdPattern::Sparse, IdPattern::OneExpert] {
                    let mut c = MoeGemmCase::new(dtype, 150, 16, 1, 64, 128);
                    (c.layout, c.weights, c.ids) = (layout, GemmWeights::SwiGluPacked, ids);
                    assert_pass(&format!("{c:?}"), &device, moe_gemm_case(&device, &c));
                }
                // k not a multiple of the 64-deep tile; strided x, y and weight rows.
                let mut c = MoeGemmCase::new(dtype, 20, 8, 2, 72, 64);
                (c.layout, c.pad) = (layout, 8);
                assert_pass(&format!("{c:?}"), &device, moe_gemm_case(&device, &c));
                // One group (the shared expert and the router use this).
                for (tokens, weights) in [(5, GemmWeights::SwiGluSeparate), (70, GemmWeights::Plain)] {
                    let mut c = MoeGemmCase::new(dtype, tokens, 1, 1, 64, 128);
                    (c.layout, c.weights, c.dense) = (layout, weights, true);
                    assert_pass(&format!("{c:?}"), &device, moe_gemm_case(&device, &c));
                }
            }
            // An output width that is not a multiple of 8 ([experts, out, in] only): a router
            // for 60 experts.
            let mut c = MoeGemmCase::new(dtype, 9, 1, 1, 64, 60);
            (c.layout, c.dense) = (WeightLayout::OutIn, true);
            assert_pass(&format!("{c:?}"), &device, moe_gemm_case(&device, &c));
        }
    }
}

// ------------------------------------------------------------------------------------ the layer

#[test]
fn llama4_scout_and_mixtral_shaped_layers_every_dtype() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for tokens in [1, 3, 64, 257] {
                for c in [MoeFfnCase::llama4_scout(dtype, tokens), MoeFfnCase::mixtral(dtype, tokens)] {
                    assert_pass(&format!("{c:?}"), &device, moe_ffn_case(&device, &c));
                }
            }
        }
    }
}

#[test]
fn layer_variants_grouped_routing_layouts_and_forms() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for tokens in [3, 64] {
                assert_pass("grouped", &device, moe_ffn_case(&device, &MoeFfnCase::grouped(dtype, tokens)));
                // Llama 4 routing with nn.Linear experts and separate gate/up, no shared expert.
                let mut c = MoeFfnCase::llama4_scout(dtype, tokens);
                (c.layout, c.packed, c.shared, c.residual) = (WeightLayout::OutIn, false, 0, false);
                assert_pass(&format!("{c:?}"), &device, moe_ffn_case(&device, &c));
                // Mixtral routing with Llama 4 style packed weights and a shared expert, 128 experts.
                let mut c = MoeFfnCase::mixtral(dtype, tokens);
                (c.layout, c.packed, c.shared, c.experts, c.top_k) = (WeightLayout::InOut, true, 64, 128, 8);
                assert_pass(&format!("{c:?}"), &device, moe_ffn_case(&device, &c));
            }
        }
    }
}

// ------------------------------------------------------------------------------------ schedules

#[test]
fn schedules_agree_bit_for_bit() {
    for dtype in DType::FLOATS {
        let mut route = MoeRouteCase::new(dtype, 37, 60, 8, grouped_for(60, 8).unwrap_or(MoeRouting::Llama4));
        route.bias = true;
        common::assert_schedules_agree("route", |d| moe_route_case(d, &route));
        let route = MoeRouteCase::new(dtype, 37, 128, 2, MoeRouting::Softmax { renormalize: true });
        common::assert_schedules_agree("route softmax", |d| moe_route_case(d, &route));
        let gather = MoeGatherCase { dtype, tokens: 40, experts: 8, top_k: 2, hidden: 64, scaled: true, seed: 2 };
        common::assert_schedules_agree("gather", |d| moe_gather_case(d, &gather));
        for layout in LAYOUTS {
            for (weights, block_m) in [(GemmWeights::SwiGluPacked, 64), (GemmWeights::Plain, 16)] {
                // k = 256: four 64-deep tiles, so pipeline stages are refilled while in use.
                let mut c = MoeGemmCase::new(dtype, 70, 4, 2, 256, 128);
                (c.layout, c.weights, c.block_m) = (layout, weights, block_m);
                common::assert_schedules_agree(&format!("{c:?}"), |d| moe_gemm_case(d, &c));
            }
        }
        let combine = MoeCombineCase {
            dtype,
            tokens: 40,
            experts: 8,
            top_k: 8,
            hidden: 64,
            weighted: true,
            shared: true,
            residual: 1,
            seed: 2,
        };
        common::assert_schedules_agree("combine", |d| moe_combine_case(d, &combine));
        for c in [MoeFfnCase::llama4_scout(dtype, 33), MoeFfnCase::mixtral(dtype, 33)] {
            common::assert_schedules_agree(&format!("{c:?}"), |d| moe_ffn_case(d, &c));
        }
    }
    let align = MoeAlignCase { tokens: 3000, experts: 60, top_k: 2, block_m: 64, ids: IdPattern::Random, seed: 2 };
    common::assert_schedules_agree("align", |d| moe_align_case(d, &align));
}

// ------------------------------------------------------------------------------------ planning

fn small_layer(d: &Device, dtype: DType, max_tokens: usize) -> MoeFfn {
    let (h, i, e) = (64, 64, 8);
    let t = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|j| ((j * 37 % 101) as f64 - 50.0) / 400.0).collect();
        Tensor::from_f64(d, dtype, &v, shape).unwrap()
    };
    let weights = MoeFfnWeights {
        router: t(&[e, h]),
        router_bias: None,
        layout: WeightLayout::InOut,
        gate_up: GateUpTensors::Packed(t(&[e, h, 2 * i])),
        down: t(&[e, i, h]),
        shared: Some(SharedExpertTensors { gate: t(&[i, h]), up: t(&[i, h]), down: t(&[h, i]) }),
    };
    MoeFfn::plan(d, MoeFfnConfig::llama4(h, i, e, 1), weights, max_tokens).unwrap()
}

#[test]
fn a_planned_forward_allocates_nothing_and_never_waits() {
    for device in common::devices() {
        let mut ffn = small_layer(&device, DType::BF16, 64);
        let x = Tensor::zeros(&device, DType::BF16, &[40, 64]).unwrap();
        let out = Tensor::zeros(&device, DType::BF16, &[40, 64]).unwrap();
        ffn.forward(&x, None, &out).unwrap(); // warm: kernel images load on first use
        device.synchronize().unwrap();
        let before = device.counters();
        for tokens in [40, 1, 64] {
            let x = x.narrow(0, 0, tokens.min(40)).unwrap();
            let out = out.narrow(0, 0, tokens.min(40)).unwrap();
            ffn.forward(&x, Some(&out), &out).unwrap();
        }
        let after = device.counters();
        assert_eq!(after.allocations, before.allocations, "{device:?}");
        assert_eq!(after.synchronizations, before.synchronizations);
        assert_eq!(after.downloads, before.downloads);
        assert_eq!(after.pageable_uploads, before.pageable_uploads);
        assert_eq!(after.pinned_uploads, before.pinned_uploads);
        // router, route, 3 align, gather, 2 expert GEMMs, 2 shared GEMMs, combine.
        assert_eq!(after.launches - before.launches, 3 * 11);
    }
}

#[test]
fn view_level_forward_on_host_slices_matches_the_tensor_api() {
    let d = Device::emulated();
    let mut ffn = small_layer(&d, DType::F32, 16);
    let x: Vec<f32> = (0..5 * 64).map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0).collect();
    let res: Vec<f32> = (0..5 * 64).map(|i| ((i * 7 % 17) as f32 - 8.0) / 5.0).collect();
    let mut out = res.clone();
    let xv = TensorView::host(&x, &[5, 64]).unwrap();
    ffn.forward_on(&d, &xv, MoeResidual::InPlace, &mut TensorViewMut::host(&mut out, &[5, 64]).unwrap()).unwrap();
    let xt = Tensor::from_slice(&d, &x, &[5, 64]).unwrap();
    let ot = Tensor::from_slice(&d, &res, &[5, 64]).unwrap();
    ffn.forward(&xt, Some(&ot), &ot).unwrap();
    assert_eq!(out, ot.to_vec::<f32>().unwrap());
}

// ------------------------------------------------------------------------------------ errors

fn invalid(r: llama_kernels::Result<()>, name: &str) {
    match r {
        Err(Error::InvalidArgument { name: n, .. }) if n == name => {}
        other => panic!("expected InvalidArgument({name}), got {other:?}"),
    }
}
fn shape(r: llama_kernels::Result<()>, what: &str) {
    match r {
        Err(Error::ShapeMismatch { what: w, .. }) if w == what => {}
        other => panic!("expected ShapeMismatch({what}), got {other:?}"),
    }
}

#[test]
fn every_routing_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, s: &[usize]| Tensor::zeros(&d, dtype, s).unwrap();
    let logits = t(DType::BF16, &[4, 16]);
    let route =
        |l: &Tensor, b: Option<&Tensor>, r: MoeRouting, ids: &Tensor, w: &Tensor| moe::moe_route(l, b, r, ids, w);
    let (ids2, w2) = (t(DType::I32, &[4, 2]), t(DType::F32, &[4, 2]));
    route(&logits, None, MoeRouting::Llama4, &ids2, &w2).unwrap();
    // k > experts, k too large (llama4/softmax 8, grouped 16), experts over the limit.
    let small = t(DType::BF16, &[4, 4]);
    let (ids8, w8) = (t(DType::I32, &[4, 8]), t(DType::F32, &[4, 8]));
    invalid(route(&small, None, MoeRouting::Llama4, &ids8, &w8), "top_k");
    let (ids9, w9) = (t(DType::I32, &[4, 9]), t(DType::F32, &[4, 9]));
    invalid(route(&logits, None, MoeRouting::Softmax { renormalize: true }, &ids9, &w9), "top_k");
    let g = |n_group, topk_group| MoeRouting::Grouped {
        n_group,
        topk_group,
        renormalize: true,
        routed_scaling_factor: 1.0,
    };
    let (ids17, w17) = (t(DType::I32, &[4, 17]), t(DType::F32, &[4, 17]));
    invalid(route(&t(DType::BF16, &[4, 64]), None, g(4, 4), &ids17, &w17), "top_k");
    invalid(route(&t(DType::BF16, &[4, 513]), None, MoeRouting::Llama4, &ids2, &w2), "experts");
    // Groups: not dividing the experts, too small, topk_group out of range, k beyond the kept.
    invalid(route(&t(DType::BF16, &[4, 60]), None, g(8, 2), &ids2, &w2), "n_group");
    invalid(route(&logits, None, g(16, 2), &ids2, &w2), "n_group");
    invalid(route(&logits, None, g(4, 5), &ids2, &w2), "topk_group");
    invalid(route(&logits, None, g(4, 1), &ids8, &w8), "top_k");
    // Bias only with grouped routing, one per expert.
    let bias = t(DType::F32, &[16]);
    invalid(route(&logits, Some(&bias), MoeRouting::Llama4, &ids2, &w2), "bias");
    shape(route(&logits, Some(&t(DType::F32, &[15])), g(4, 2), &ids2, &w2), "bias");
    // Shapes and dtypes.
    shape(route(&logits, None, MoeRouting::Llama4, &t(DType::I32, &[3, 2]), &w2), "ids");
    shape(route(&logits, None, MoeRouting::Llama4, &ids2, &t(DType::F32, &[4, 3])), "weights");
    assert!(matches!(
        route(&logits, None, MoeRouting::Llama4, &t(DType::I64, &[4, 2]), &w2),
        Err(Error::DTypeMismatch { what: "ids", .. })
    ));
    assert!(matches!(
        route(&logits, None, MoeRouting::Llama4, &ids2, &t(DType::BF16, &[4, 2])),
        Err(Error::DTypeMismatch { what: "weights", .. })
    ));
    assert!(matches!(
        route(&t(DType::I32, &[4, 16]), None, MoeRouting::Llama4, &ids2, &w2),
        Err(Error::UnsupportedDType { what: "logits", .. })
    ));
}

#[test]
fn every_permutation_gemm_and_combine_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, s: &[usize]| Tensor::zeros(&d, dtype, s).unwrap();
    invalid(MoeAlign::plan(&d, 513, 8).map(|_| ()), "experts");
    invalid(MoeAlign::plan(&d, 0, 8).map(|_| ()), "experts");
    let mut a = MoeAlign::plan(&d, 8, 16).unwrap();
    let ids = Tensor::from_slice(&d, &[0i32, 1, 2, 3, 4, 5], &[3, 2]).unwrap();
    invalid(a.align(&ids, 32), "block_m");
    shape(a.align(&ids.reshape(&[6]).unwrap(), 16), "ids");
    // Using the permutation before aligning it.
    let x = t(DType::BF16, &[3, 64]);
    let rows = moe::padded_rows(6, 8, 16).unwrap();
    assert!(matches!(moe::moe_gather(&x, &a, None, &t(DType::BF16, &[rows, 64])), Err(Error::InvalidView { .. })));
    a.align(&ids, 16).unwrap();
    // Gather: too few rows, wrong tokens, weights of the wrong shape.
    moe::moe_gather(&x, &a, None, &t(DType::BF16, &[rows, 64])).unwrap();
    shape(moe::moe_gather(&x, &a, None, &t(DType::BF16, &[rows - 1, 64])), "out");
    shape(moe::moe_gather(&t(DType::BF16, &[4, 64]), &a, None, &t(DType::BF16, &[rows, 64])), "x");
    shape(moe::moe_gather(&x, &a, Some(&t(DType::F32, &[3, 1])), &t(DType::BF16, &[rows, 64])), "weights");
    assert!(matches!(
        moe::moe_gather(&x, &a, None, &t(DType::F16, &[rows, 64])),
        Err(Error::DTypeMismatch { what: "out", .. })
    ));
    // GEMM: weights of the wrong layout or shape, dtype mismatch, k not a multiple of 8 on
    // tensor cores, output width.
    let xp = t(DType::BF16, &[rows, 64]);
    let gemm = |x: &Tensor, layout, w: ExpertWeights<'_>, y: &Tensor| {
        moe::moe_grouped_gemm(x, layout, w, GemmGroups::Experts(&a), y)
    };
    let w_io = t(DType::BF16, &[8, 64, 256]); // [E, in 64, out 2 x 128]
    gemm(&xp, WeightLayout::InOut, ExpertWeights::SwiGluPacked(&w_io), &t(DType::BF16, &[rows, 128])).unwrap();
    shape(gemm(&xp, WeightLayout::OutIn, ExpertWeights::SwiGluPacked(&w_io), &t(DType::BF16, &[rows, 128])), "weights");
    shape(
        gemm(
            &xp,
            WeightLayout::InOut,
            ExpertWeights::SwiGluPacked(&t(DType::BF16, &[8, 64, 255])),
            &t(DType::BF16, &[rows, 127]),
        ),
        "weights",
    );
    shape(
        gemm(
            &xp,
            WeightLayout::InOut,
            ExpertWeights::Plain(&t(DType::BF16, &[4, 64, 128])),
            &t(DType::BF16, &[rows, 128]),
        ),
        "weights",
    );
    shape(gemm(&xp, WeightLayout::InOut, ExpertWeights::Plain(&w_io), &t(DType::BF16, &[rows, 128])), "y");
    shape(
        gemm(
            &t(DType::BF16, &[rows - 1, 64]),
            WeightLayout::InOut,
            ExpertWeights::Plain(&w_io),
            &t(DType::BF16, &[rows - 1, 256]),
        ),
        "x",
    );
    let up_other = t(DType::BF16, &[8, 64, 64]);
    shape(
        gemm(
            &xp,
            WeightLayout::InOut,
            ExpertWeights::SwiGluSeparate { gate: &t(DType::BF16, &[8, 64, 128]), up: &up_other },
            &t(DType::BF16, &[rows, 128]),
        ),
        "up weights",
    );
    assert!(matches!(
        gemm(
            &xp,
            WeightLayout::InOut,
            ExpertWeights::Plain(&t(DType::F16, &[8, 64, 128])),
            &t(DType::BF16, &[rows, 128])
        ),
        Err(Error::DTypeMismatch { what: "weights", .. })
    ));
    let x60 = t(DType::BF16, &[rows, 60]);
    invalid(
        gemm(
            &x60,
            WeightLayout::OutIn,
            ExpertWeights::Plain(&t(DType::BF16, &[8, 64, 60])),
            &t(DType::BF16, &[rows, 64]),
        ),
        "k",
    );
    invalid(
        gemm(
            &xp,
            WeightLayout::InOut,
            ExpertWeights::Plain(&t(DType::BF16, &[8, 64, 60])),
            &t(DType::BF16, &[rows, 60]),
        ),
        "n",
    );
    // The same on f32 (SIMT) is fine.
    moe::moe_grouped_gemm(
        &t(DType::F32, &[rows, 60]),
        WeightLayout::OutIn,
        ExpertWeights::Plain(&t(DType::F32, &[8, 60, 60])),
        GemmGroups::Experts(&a),
        &t(DType::F32, &[rows, 60]),
    )
    .unwrap();
    // Misaligned rows on tensor cores (a view starting one element in).
    let wide = t(DType::BF16, &[rows, 72]);
    let skewed = wide.narrow(1, 1, 64).unwrap();
    assert!(matches!(
        gemm(
            &skewed,
            WeightLayout::InOut,
            ExpertWeights::Plain(&t(DType::BF16, &[8, 64, 64])),
            &t(DType::BF16, &[rows, 64])
        ),
        Err(Error::BadLayout { what: "x", .. })
    ));
    // Overlap: y over x.
    let both = t(DType::BF16, &[rows, 64]);
    let w64 = t(DType::BF16, &[8, 64, 64]);
    assert!(matches!(
        moe::moe_grouped_gemm(&both, WeightLayout::OutIn, ExpertWeights::Plain(&w64), GemmGroups::Experts(&a), &both),
        Err(Error::Overlap { .. })
    ));
    // More slots per token than any routing produces: combine keeps a token's slots in shared
    // arrays of MAX_TOP_K_GROUPED entries, so the alignment (which gather and combine take k
    // from) refuses them (k = 17 overflowed those arrays in combine).
    let mut wide = MoeAlign::plan(&d, 32, 64).unwrap();
    let ids17 = Tensor::from_slice(&d, &(0..17).collect::<Vec<i32>>(), &[1, 17]).unwrap();
    invalid(wide.align(&ids17, 16), "top_k");
    assert_eq!(wide.aligned_for(), None, "a refused alignment leaves no state");
    let ids16 = Tensor::from_slice(&d, &(0..16).collect::<Vec<i32>>(), &[1, 16]).unwrap();
    wide.align(&ids16, 16).unwrap();
    invalid(wide.align(&t(DType::I32, &[2, 0]), 16), "top_k");
    // Sizes whose padded row count overflows are named errors, not panics or wraps.
    invalid(MoeAlign::plan(&d, 8, usize::MAX).map(|_| ()), "slots");
    invalid(MoeAlign::plan(&d, 8, usize::MAX / 16).map(|_| ()), "slots");
    assert!(moe::padded_rows(usize::MAX - 3, 8, 64).is_err());
    for max_tokens in [usize::MAX, usize::MAX / 2, 1 << 60] {
        let r = llama_kernels::ops::moe::MoeWorkspace::plan(
            &d,
            MoeFfnConfig::llama4(64, 64, 8, 1),
            DType::BF16,
            64,
            max_tokens,
        );
        assert!(r.is_err(), "max_tokens {max_tokens} planned");
    }
    // Combine: y rows, out tokens, shared shape, weights dtype.
    let y = t(DType::BF16, &[rows, 64]);
    moe::moe_combine(&y, &a, None, None, None, &t(DType::BF16, &[3, 64])).unwrap();
    shape(moe::moe_combine(&t(DType::BF16, &[rows - 1, 64]), &a, None, None, None, &t(DType::BF16, &[3, 64])), "y");
    shape(moe::moe_combine(&y, &a, None, None, None, &t(DType::BF16, &[2, 64])), "out");
    shape(moe::moe_combine(&y, &a, None, Some(&t(DType::BF16, &[3, 32])), None, &t(DType::BF16, &[3, 64])), "shared");
    assert!(matches!(
        moe::moe_combine(&y, &a, Some(&t(DType::BF16, &[3, 2])), None, None, &t(DType::BF16, &[3, 64])),
        Err(Error::DTypeMismatch { what: "weights", .. })
    ));
}

#[test]
fn every_layer_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, s: &[usize]| Tensor::zeros(&d, dtype, s).unwrap();
    let (h, i, e) = (64, 128, 8);
    let good = || MoeFfnWeights {
        router: t(DType::BF16, &[e, h]),
        router_bias: None,
        layout: WeightLayout::InOut,
        gate_up: GateUpTensors::Packed(t(DType::BF16, &[e, h, 2 * i])),
        down: t(DType::BF16, &[e, i, h]),
        shared: None,
    };
    let cfg = MoeFfnConfig::llama4(h, i, e, 1);
    let new = |c: MoeFfnConfig, w: MoeFfnWeights| MoeFfn::plan(&d, c, w, 8).map(|_| ());
    new(cfg, good()).unwrap();
    // Weights of the wrong layout: [E, out, in] passed as [E, in, out].
    shape(new(cfg, MoeFfnWeights { down: t(DType::BF16, &[e, h, i]), ..good() }), "down");
    shape(
        new(cfg, MoeFfnWeights { gate_up: GateUpTensors::Packed(t(DType::BF16, &[e, 2 * i, h])), ..good() }),
        "gate_up",
    );
    shape(new(cfg, MoeFfnWeights { layout: WeightLayout::OutIn, ..good() }), "gate_up");
    shape(new(cfg, MoeFfnWeights { router: t(DType::BF16, &[e + 1, h]), ..good() }), "router");
    assert!(matches!(
        new(cfg, MoeFfnWeights { down: t(DType::F16, &[e, i, h]), ..good() }),
        Err(Error::DTypeMismatch { what: "down", .. })
    ));
    invalid(new(MoeFfnConfig { top_k: 9, ..cfg }, good()), "top_k");
    invalid(
        new(MoeFfnConfig { top_k: 3, experts: 2, ..cfg }, MoeFfnWeights { router: t(DType::BF16, &[2, h]), ..good() }),
        "top_k",
    );
    invalid(new(cfg, MoeFfnWeights { router_bias: Some(t(DType::F32, &[e])), ..good() }), "router_bias");
    let grouped = MoeFfnConfig {
        routing: MoeRouting::Grouped { n_group: 3, topk_group: 1, renormalize: true, routed_scaling_factor: 1.0 },
        ..cfg
    };
    invalid(new(grouped, good()), "n_group");
    // Forward: too many tokens, wrong hidden, dtype.
    let mut ffn = MoeFfn::plan(&d, cfg, good(), 8).unwrap();
    invalid(ffn.forward(&t(DType::BF16, &[9, h]), None, &t(DType::BF16, &[9, h])), "tokens");
    shape(ffn.forward(&t(DType::BF16, &[4, h + 8]), None, &t(DType::BF16, &[4, h + 8])), "x");
    shape(ffn.forward(&t(DType::BF16, &[4, h]), None, &t(DType::BF16, &[3, h])), "out");
    assert!(matches!(
        ffn.forward(&t(DType::F32, &[4, h]), None, &t(DType::F32, &[4, h])),
        Err(Error::DTypeMismatch { what: "x", .. })
    ));
    ffn.forward(&t(DType::BF16, &[0, h]), None, &t(DType::BF16, &[0, h])).unwrap();
}
