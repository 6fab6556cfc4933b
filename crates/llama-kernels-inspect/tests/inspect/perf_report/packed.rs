//! The packed-weight kernels and the layer predictions built on them.

use super::*;

/// The packed decode GEMV at every Llama 3 8B projection: its two chunks of loads in flight per
/// lane (the one-ahead pipeline) cover DRAM latency (nearly, for the narrow k/v projection), so
/// latency is never the bound; at one row of
/// a 4-bit format the SIMT dequantization (a byte extract, a conversion and an fma or two per
/// value, the rounding to bf16) and the bf16 unpacking of x keep it issue-bound: the model
/// predicts 41-57% of copy bandwidth on the packed bytes (Q4_K's sub-block scales cost most),
/// below the 85% a bandwidth-bound kernel would reach, and says so. Each row adds its fmas and x unpacking: 16 rows cost more.
#[test]
fn packed_gemv_covers_dram_latency_and_reports_its_issue_bound() {
    use llama_kernels::spec::quant::QuantFormat;
    use llama_kernels_inspect::qlinear_model::{SHAPES, predict_gemv};
    for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q4_K, QuantFormat::NF4] {
        for &(shape, out, inp) in &SHAPES {
            let g = predict_gemv(format, shape, out, inp, 1).unwrap();
            assert!(g.weight_bytes_per_iteration >= 16, "{} {shape}: {g:?}", g.kernel);
            // The k/v projection's 512 blocks leave 16 warps per SM: cover just under 1 there.
            assert!(g.memory.cover >= 0.9, "{} {shape}: latency not covered: {g:?}", g.kernel);
            assert_ne!(g.memory.bound, "latency", "{} {shape}: {g:?}", g.kernel);
            assert!(g.memory.steady_fraction >= 0.40, "{} {shape}: {g:?}", g.kernel);
            let g16 = predict_gemv(format, shape, out, inp, 16).unwrap();
            assert!(g16.slots_per_iteration > g.slots_per_iteration, "{} {shape}", g.kernel);
            assert_eq!(g16.memory.bound, "issue", "{} {shape}: {g16:?}", g.kernel);
        }
    }
}

/// The packed prefill GEMM's main loop: HMMA fed from shared memory, its dequantization paid
/// in issue slots; predicted at 70% or more of our dense mma.sync GEMM's rate, first order.
#[test]
fn packed_gemm_reaches_70_percent_of_the_dense_mma_sync_rate() {
    use llama_kernels::spec::quant::QuantFormat;
    use llama_kernels_inspect::qlinear_model::{predict_dense_peer, predict_gemm};
    let dense = predict_dense_peer().unwrap();
    assert!(dense.hmma >= 32, "{dense:?}");
    for format in QuantFormat::ALL {
        let q = predict_gemm(format).unwrap();
        assert!(q.hmma >= 64 && q.blocks_per_sm >= 2, "{q:?}");
        assert!(q.tflops >= 0.70 * dense.tflops, "{q:?} vs {dense:?}");
    }
}

/// The input gradient through a packed weight is the forward GEMM with W's dimensions exchanged:
/// the same chunks dequantized per step and the same HMMA, its B fragments by ldmatrix.trans, so
/// its loop costs the forward's issue slots and shared-memory bytes per HMMA within 10%.
#[test]
fn packed_input_gradient_costs_what_the_forward_gemm_costs() {
    use llama_kernels::spec::quant::QuantFormat;
    use llama_kernels_inspect::qlinear_model::{predict_gemm, predict_gemm_input_grad};
    for format in QuantFormat::ALL {
        let (f, b) = (predict_gemm(format).unwrap(), predict_gemm_input_grad(format).unwrap());
        assert_eq!((b.hmma, b.blocks_per_sm), (f.hmma, f.blocks_per_sm), "{b:?} vs {f:?}");
        assert!(b.slots_per_hmma <= 1.10 * f.slots_per_hmma, "{b:?} vs {f:?}");
        assert!(b.smem_bytes_per_hmma <= 1.10 * f.smem_bytes_per_hmma, "{b:?} vs {f:?}");
        println!("{format}: forward {:.0} TFLOP/s, input gradient {:.0} TFLOP/s", f.tflops, b.tflops);
    }
}

/// Whole-layer predictions: finite, shares of the step summing to 1, the graph cheaper than
/// eager launches, and decode at batch 1 dominated by the stages that stream weights.
#[test]
fn layer_predictions_are_consistent_and_decode_is_weight_bound() {
    use llama_kernels_inspect::layer_model::{Phase, layer_predictions};
    let all = layer_predictions(&llama_kernels_inspect::perf::prefill_attention_model().unwrap());
    assert_eq!(all.len(), 15);
    for (m, p, r) in all {
        let sp = r.unwrap_or_else(|e| panic!("{} {p:?}: {e}", m.name));
        for v in
            [sp.layer_eager, sp.layer_graph, sp.step_eager, sp.step_graph, sp.tokens_per_s_eager, sp.tokens_per_s_graph]
        {
            assert!(v.is_finite() && v > 0.0, "{} {p:?}: {v}", m.name);
        }
        assert!(sp.stages.iter().all(|s| s.body.is_finite() && s.body >= 0.0 && s.share >= 0.0), "{} {p:?}", m.name);
        let shares: f64 = sp.stages.iter().map(|s| s.share).sum();
        assert!((shares - 1.0).abs() < 1e-9, "{} {p:?}: shares sum to {shares}", m.name);
        assert!(sp.step_graph < sp.step_eager, "{} {p:?}", m.name);
        if let Phase::Decode { batch: 1, .. } = p {
            let weights: f64 = sp.stages.iter().filter(|s| s.weight_stage).map(|s| s.share).sum();
            assert!(weights >= 0.7, "{} decode b1: weight stages {:.2} of the step", m.name, weights);
            // Below the weight-bandwidth ceiling, and near it for the dense models (cuBLAS streams
            // the weights; the graph hides the launches); Scout's floor guards the m16 GEMM.
            let ceiling = m.decode_ceiling();
            let floor = if m.experts == 0 { 0.8 } else { 0.4 };
            assert!(
                sp.tokens_per_s_graph <= ceiling,
                "{}: {:.0} tok/s above {ceiling:.0}",
                m.name,
                sp.tokens_per_s_graph
            );
            assert!(
                sp.tokens_per_s_graph >= floor * ceiling,
                "{}: {:.0} of {ceiling:.0} tok/s",
                m.name,
                sp.tokens_per_s_graph
            );
        }
    }
}

/// Batch-1 decode with packed 4-bit weights (the tensor-core GEMV) reads about a third of the
/// bf16 bytes: the model predicts at least 2x the bf16 step's tokens/s for Llama 3 8B and 70B
/// (8B about 2.4x: its 4k-context attention and the launches weigh more once the weights
/// shrink; 70B about 3.2x) and no more than the byte ratio; a batch the GEMV does not take, or
/// packed experts, is an error, not a number.
#[test]
fn packed_decode_is_faster_than_bf16_by_the_bytes_it_saves() {
    use llama_kernels_inspect::layer_model::{
        LLAMA3_8B, LLAMA3_70B, LLAMA4_SCOUT, PACKED_FORMATS, PHASES, Phase, Weights, predict_step, predict_step_with,
    };
    let attn = llama_kernels_inspect::perf::prefill_attention_model().unwrap();
    for m in [LLAMA3_8B, LLAMA3_70B] {
        let bf16 = predict_step(&m, PHASES[0], &attn).unwrap();
        for format in PACKED_FORMATS {
            let p = predict_step_with(&m, PHASES[0], &attn, Weights::Packed(format)).unwrap();
            let ratio = p.tokens_per_s_graph / bf16.tokens_per_s_graph;
            // At least 2x, and no more than the byte ratio (16 bits over 4.5) allows.
            assert!((2.0..=16.0 / 4.5).contains(&ratio), "{} {format}: {ratio:.2}x bf16", m.name);
            assert!(p.memory_bytes < 0.4 * bf16.memory_bytes, "{} {format}: {} GB", m.name, p.memory_bytes / 1e9);
        }
    }
    let q4 = Weights::Packed(llama_kernels::spec::quant::QuantFormat::Q4_0);
    assert!(predict_step_with(&LLAMA3_8B, Phase::Decode { batch: 32, context: 4096 }, &attn, q4).is_err());
    assert!(predict_step_with(&LLAMA4_SCOUT, PHASES[0], &attn, q4).is_err());
    let v: serde_json::Value = serde_json::from_str(&report_json_text()).expect("the JSON report parses");
    let packed = v["layers"]["packed_decode"].as_array().expect("packed_decode");
    assert_eq!(packed.len(), 2 * PACKED_FORMATS.len());
    for p in packed {
        assert!(p["tokens_per_s_graph"].as_f64().is_some_and(|t| t.is_finite() && t > 0.0), "{p}");
    }
}

/// The row count from which bf16/f16 products take the tensor-core GEMM sits at the crossover the
/// SASS predicts (issue slots per weight of the GEMV's decode and rows against the GEMM's loop),
/// within two rows for every format.
#[test]
fn the_gemm_takes_over_from_the_gemv_where_the_model_says_it_is_cheaper() {
    use llama_kernels::ops::qlinear::GEMM_FROM_ROWS;
    use llama_kernels::spec::quant::QuantFormat;
    use llama_kernels::{DType, ops::qlinear::has_mma_gemv};
    use llama_kernels_inspect::qlinear_model::gemm_crossover_rows;
    for format in QuantFormat::ALL.into_iter().filter(|&f| !has_mma_gemv(f, DType::BF16)) {
        let r = gemm_crossover_rows(format).unwrap();
        assert!(
            (r - GEMM_FROM_ROWS as f64).abs() <= 2.0,
            "{format}: crossover {r:.2} rows vs GEMM_FROM_ROWS {GEMM_FROM_ROWS}"
        );
    }
}

/// The tensor-core GEMV at every Llama 3 8B projection (bf16, 1 to 8 rows): its loop issues fewer
/// slots per weight than the CUDA-core GEMV's at one row and than the tensor-core GEMM's loop (so
/// the GEMM takes over only past its 8 rows), its loads in flight cover DRAM latency, and the
/// model puts every format at 85% of copy bandwidth or more on the packed bytes (the issue's
/// target; Q4_K, whose sub-block scales and minimums are decoded per chunk, stays issue-bound at
/// about 92%, NF4, whose code book is looked up by byte permutes, at about 87%).
#[test]
fn tensor_core_gemv_reaches_the_bandwidth_bound_for_4_bit_weights() {
    use llama_kernels::spec::quant::QuantFormat;
    use llama_kernels_inspect::qlinear_model::{SHAPES, mma_gemv_and_gemm_slots, predict_gemv, predict_mma_gemv};
    for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q4_K, QuantFormat::Q6_K, QuantFormat::NF4] {
        let (gemv, gemm) = mma_gemv_and_gemm_slots(format).unwrap();
        let simt = predict_gemv(format, SHAPES[0].0, SHAPES[0].1, SHAPES[0].2, 1).unwrap().slots_per_iteration;
        assert!(gemv < simt && gemv < gemm, "{format}: {gemv:.0} slots vs CUDA-core {simt:.0}, GEMM {gemm:.0}");
        let floor = 0.85;
        for &(shape, out, inp) in &SHAPES {
            let g = predict_mma_gemv(format, shape, out, inp, 1).unwrap();
            assert!(g.weight_bytes_per_iteration >= 32, "{} {shape}: {g:?}", g.kernel);
            assert!(g.memory.cover >= 0.9, "{} {shape}: latency not covered: {g:?}", g.kernel);
            assert!(g.memory.steady_fraction >= floor, "{} {shape}: {g:?}", g.kernel);
            let g8 = predict_mma_gemv(format, shape, out, inp, 8).unwrap();
            assert_eq!(g8.slots_per_iteration, g.slots_per_iteration, "{} {shape}", g.kernel);
        }
    }
}
