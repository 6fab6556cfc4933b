//! Per-kernel levers asserted from the sm_90 SASS: memory-level parallelism, issue slots per element, tensor-core feeds, occupancy.

use super::*;

#[test]
fn the_report_covers_every_spec() {
    let text = report();
    println!("{text}");
    assert!(text.contains("a MODEL, not a measurement"));
    for s in SPECS {
        assert!(text.contains(s.kernel) && !text.contains(&format!("{}: cannot analyze", s.kernel)), "{}", s.kernel);
    }
}

#[test]
fn rms_norm_keeps_several_16_byte_loads_in_flight() {
    // All cached loads are issued before the first conversion: 4 per thread (8 when fused: x and
    // residual), back to back, instead of one load behind each conversion.
    let plain = kernel("rms_norm_vec_bf16");
    assert!(plain.loads_in_flight >= 4, "rms_norm: {} loads in flight", plain.loads_in_flight);
    let fused = kernel("fused_add_rms_norm_vec_bf16");
    assert!(fused.loads_in_flight >= 8, "fused: {} loads in flight", fused.loads_in_flight);
    for k in [&plain, &fused] {
        assert_eq!((k.resources.spill_stores, k.resources.spill_loads, k.mix.local), (0, 0, 0), "{}", k.spec.kernel);
        assert!(k.bound != "issue" && k.bound != "latency", "{}: {}", k.spec.kernel, k.predicted);
    }
}

#[test]
fn rope_costs_at_most_14_issue_slots_per_element_without_the_norm() {
    for name in ["rope_half_split_vec_bf16", "rope_interleaved_vec_bf16"] {
        let k = kernel(name);
        assert!(k.slots_per_elem <= 14.0, "{name}: {:.1} issue slots per element", k.slots_per_elem);
        // The angle is computed outside the head loop: no MUFU or trigonometry inside it.
        assert_eq!(k.mix.mufu, 0, "{name}: MUFU in the head loop");
        assert_eq!(k.bound, "bandwidth", "{name}: {}", k.predicted);
    }
}

#[test]
fn swiglu_costs_at_most_12_issue_slots_per_element() {
    let k = kernel("swiglu_vec_bf16");
    assert!(k.slots_per_elem <= 12.0, "swiglu: {:.1} issue slots per element", k.slots_per_elem);
    // Two MUFU per element (ex2 and rcp), no IEEE division slow path.
    assert!(k.mix.mufu as f64 <= 2.0 * k.elements, "swiglu: {} MUFU for {} elements", k.mix.mufu, k.elements);
    assert_eq!(k.bound, "bandwidth", "{}", k.predicted);
}

#[test]
fn attention_feeds_3_hmma_per_ldsm_at_most_4_2_issue_slots_each() {
    // Two 16-row m-tiles per warp (128-row blocks): each K ldmatrix.x4 feeds 4 HMMA and each V
    // ldmatrix.x4.trans 4, Q re-read per k-step (2 LDSM per 16 HMMA): 256 HMMA per 80 LDSM a
    // tile. Issue slots per HMMA on the hot path: what an interior tile runs (no mask, contiguous
    // K/V, the O rescale counted as if every tile moved a row maximum).
    let k = kernel("attention_hd128_bf16");
    let whole = k.whole_loop.clone().expect("attention marks its cold paths");
    assert_eq!(k.mix.hmma, 256, "HMMA per tile on the hot path");
    assert_eq!(whole.hmma, k.mix.hmma, "the cold paths hold no HMMA");
    assert!(k.mix.total < whole.total, "the hot path leaves out the cold paths");
    let per_ldsm = k.mix.hmma as f64 / k.mix.ldsm as f64;
    assert!(per_ldsm >= 3.0, "attention: {per_ldsm:.2} HMMA per LDSM");
    assert!(k.slots_per_hmma <= 4.2, "attention: {:.2} issue slots per HMMA", k.slots_per_hmma);
    // 255 registers and 96 KB of shared memory: two blocks per SM.
    assert!(k.blocks_per_sm >= 2, "attention: {} blocks per SM", k.blocks_per_sm);
    // The registers hold 192 accumulators; what does not fit is mostly loop-invariant (ldmatrix
    // offsets, loop bounds), spilled once before the loop and reloaded from L1, plus at most one
    // loop-carried value stored back per tile: few local accesses per 256 HMMA.
    assert!(k.mix.local_stores <= 1, "attention: {} local stores per tile", k.mix.local_stores);
    assert!(k.mix.local <= 16, "attention: {} local accesses per tile", k.mix.local);
}

/// Paged decode attention at Llama 3 8B geometry: the split planner fills the GPU at batch 1 and
/// leaves batch 32+ unsplit; bf16 pages stream at 80% or more of copy bandwidth in steady state,
/// with the cp.async stages covering DRAM latency; fp8 pages read half the bytes (their
/// conversions make them issue-bound: the floor guards that cost).
#[test]
fn paged_decode_streams_the_kv_pages_it_reads() {
    use llama_kernels_inspect::coverage::{decode_cases, decode_splits, predict_decode};
    for c in decode_cases() {
        let (d, merge) = predict_decode(&c).unwrap();
        println!(
            "{} b{} {}k: {} splits, {} blocks, {:.1} us, steady {:.2}, cover {:.1}, {}",
            d.kernel,
            c.batch,
            c.context / 1024,
            d.splits.unwrap(),
            d.grid_blocks,
            1e6 * d.seconds,
            d.steady_fraction,
            d.memory.cover,
            d.bound
        );
        let splits = d.splits.unwrap();
        assert_eq!(splits, decode_splits(&c));
        assert!(d.grid_blocks >= 0.9 * h200::SMS, "{c:?}: {} blocks", d.grid_blocks);
        if c.batch == 1 {
            assert!(splits >= 8 && merge.is_some(), "{c:?}: batch 1 must split ({splits})");
            let m = merge.unwrap();
            assert!(m.seconds < d.seconds, "{c:?}: merge {:.1} us vs decode {:.1}", 1e6 * m.seconds, 1e6 * d.seconds);
        } else {
            assert!(merge.is_none() && splits == 1, "{c:?}: {splits} splits");
        }
        assert_ne!(d.bound, "latency", "{c:?}: {d:?}");
        assert!(d.memory.cover >= 1.0, "{c:?}: cover {:.2}", d.memory.cover);
        let floor = if c.page_bytes == 2 { 0.8 } else { 0.3 };
        assert!(d.steady_fraction >= floor, "{c:?}: steady {:.2}", d.steady_fraction);
        if c.page_bytes == 1 {
            let bf16 = predict_decode(&llama_kernels_inspect::coverage::DecodeCase { page_bytes: 2, ..c }).unwrap().0;
            assert!((2.0 * d.memory.t_dram - bf16.memory.t_dram).abs() < 0.05 * bf16.memory.t_dram, "{c:?}");
        }
    }
}

/// The public merge of two attention states streams both at 70% of copy bandwidth or more
/// once the launch is amortized (16k tokens x 32 heads).
#[test]
fn merge_states_streams_both_states() {
    use llama_kernels_inspect::coverage::predict_merge_states;
    let m = predict_merge_states(16384, 32, 128).unwrap();
    // Its loads in flight nearly cover DRAM latency (the model calls it latency-bound by a hair).
    assert!(m.memory.cover >= 0.8, "{m:?}");
    assert!(m.steady_fraction >= 0.7, "{m:?}");
}

/// kv_append: bf16 pages are bandwidth-bound once the launch is amortized; fp8 pages pay for
/// the per-element scaling and rounding in issue slots (the model says issue-bound; the floor
/// guards that cost).
#[test]
fn kv_append_is_bandwidth_bound_at_prefill() {
    use llama_kernels_inspect::coverage::predict_kv_append;
    let k = predict_kv_append(4096, 8, 128, false).unwrap();
    assert_eq!(k.bound, "bandwidth", "{k:?}");
    assert!(k.steady_fraction >= 0.8, "{k:?}");
    let f = predict_kv_append(4096, 8, 128, true).unwrap();
    assert!(f.steady_fraction >= 0.35 && f.bound != "latency", "{f:?}");
    assert!(f.seconds < 2.0 * k.seconds, "fp8 {:.1} us vs bf16 {:.1} us", 1e6 * f.seconds, 1e6 * k.seconds);
}

/// The MoE pipeline of a Llama 4 Scout layer: decode picks the 16-row GEMM (one m16 tile per
/// expert), prefill the 64-row one on tensor cores at 150 TFLOP/s or more (first order);
/// gather and combine stream rows at 70% of copy bandwidth or more at 4096 tokens; routing and
/// alignment are a few launches of a few microseconds.
#[test]
fn moe_pipeline_levers() {
    use llama_kernels_inspect::coverage::{predict_moe, scout_moe};
    use llama_kernels_inspect::qlinear_model::predict_mma_loop;
    for k in [
        "moe_grouped_gemm_kn_swiglu_m16_bf16",
        "moe_grouped_gemm_nk_swiglu_m16_bf16",
        "moe_grouped_gemm_kn_swiglu_m64_bf16",
    ] {
        let smem = if k.contains("m16") { 4 * 80 * 64 * 2 } else { 3 * 192 * 64 * 2 };
        println!("{:?}", predict_mma_loop("moe", k, 128, smem).unwrap());
    }
    let decode = predict_moe(&scout_moe(1)).unwrap();
    let prefill = predict_moe(&scout_moe(4096)).unwrap();
    for c in decode.iter().chain(&prefill) {
        println!(
            "{} {}: {:.1} us, steady {:.2}, {:?} TFLOP/s, {}",
            c.kernel,
            c.shape,
            1e6 * c.seconds,
            c.steady_fraction,
            c.tflops,
            c.bound
        );
        assert!(c.seconds.is_finite() && c.seconds > 0.0, "{c:?}");
        if c.kernel.starts_with("moe_route") || c.kernel.starts_with("moe_align") {
            assert!(c.seconds < 10e-6, "{c:?}");
        }
    }
    for c in decode.iter().filter(|c| c.kernel.starts_with("moe_grouped_gemm") && c.group == "moe") {
        assert!(c.kernel.contains("_m16_") && c.shape.contains("(16 padded)"), "{c:?}");
        assert!(c.steady_fraction >= 0.45, "{}: steady {:.2}", c.kernel, c.steady_fraction);
    }
    for c in prefill.iter().filter(|c| c.kernel.starts_with("moe_grouped_gemm") && c.shape.contains("16384")) {
        // The loop's time (tensor, shared memory or issue, first order) sets it, not the bytes.
        assert!(c.kernel.contains("_m64_") && c.t_tensor >= c.memory.seconds - c.memory.t_launch, "{c:?}");
        assert!(c.tflops.unwrap() >= 150.0, "{}: {:?} TFLOP/s", c.kernel, c.tflops);
    }
    for name in ["moe_gather_vec_bf16", "moe_combine_vec_bf16"] {
        let c = prefill.iter().find(|c| c.kernel == name).unwrap();
        assert!(c.steady_fraction >= 0.7, "{name}: {c:?}");
    }
}

/// The report's shared-memory section: on an A100 (8.0) the main prefill and decode shapes at
/// head_dim 128 run two blocks per SM in the configuration the op uses, as on Hopper.
#[test]
fn a100_runs_two_attention_blocks_per_sm_at_head_dim_128() {
    let v: serde_json::Value = serde_json::from_str(&report_json_text()).expect("the JSON report parses");
    let rows = v["shared_memory"].as_array().expect("shared_memory");
    for what in ["prefill attention, bf16, head_dim 128", "paged decode, bf16 q, bf16 pages, head_dim 128"] {
        for arch in ["8.0 (A100, A30)", "9.0 (H100, H200)"] {
            let used: Vec<_> = rows
                .iter()
                .filter(|r| r["configuration"].as_str().is_some_and(|c| c.starts_with(what)))
                .flat_map(|r| r["archs"].as_array().into_iter().flatten())
                .filter(|a| a["arch"] == arch && a["used"] == true)
                .collect();
            assert_eq!(used.len(), 1, "{what} on {arch}: one configuration used: {used:?}");
            assert_eq!(used[0]["blocks_per_sm"], 2, "{what} on {arch}: {used:?}");
        }
    }
}

/// The embedding lookups in the coverage model: a 4096-token prefill's gather streams at 85% of
/// copy bandwidth or more in steady state from a dense or a packed table, and a packed table
/// reads its packed bytes only (Q6_K's row is about 0.41 of bf16's, so the launch is shorter).
#[test]
fn embedding_lookups_stream_at_copy_bandwidth() {
    use llama_kernels::spec::quant::QuantFormat;
    use llama_kernels_inspect::coverage::predict_embedding;
    let dense = predict_embedding(4096, 4096, None).unwrap();
    for table in [None, Some(QuantFormat::Q8_0), Some(QuantFormat::Q6_K)] {
        let c = predict_embedding(4096, 4096, table).unwrap();
        assert!(c.steady_fraction >= 0.85, "{table:?}: {c:?}");
        assert!(c.memory.cover >= 1.0, "{table:?}: latency not covered: {c:?}");
    }
    let q6 = predict_embedding(4096, 4096, Some(QuantFormat::Q6_K)).unwrap();
    assert!(q6.body_seconds < 0.85 * dense.body_seconds, "{q6:?} vs {dense:?}");
    let one = predict_embedding(1, 4096, None).unwrap();
    assert_eq!(one.bound, "launch", "a decode step's single row is launch-bound: {one:?}");
}
