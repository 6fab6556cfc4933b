//! The static performance report's thresholds: the levers each kernel was tuned with, asserted
//! from its sm_90 SASS, so that a change that loses one fails CI without a GPU. The numbers are a
//! model of an H200 (src/inspect/perf.rs), not a measurement.

use llama_kernels_inspect::perf::{
    SPECS, analyze, calibration, h200, memory_calibration, peer_loop_counts, peer_memory_counts, report,
};
use llama_kernels_inspect::perf_json::report_json_text;

fn kernel(name: &str) -> llama_kernels_inspect::perf::KernelPerf {
    let spec = SPECS.iter().find(|s| s.kernel == name).unwrap_or_else(|| panic!("no spec for {name}"));
    analyze(spec).unwrap_or_else(|e| panic!("{name}: {e}"))
}

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

#[test]
fn the_matrix_model_predicts_flash_attention_2_within_15_percent() {
    // FA2's hd128 forward (same geometry as ours: 128-row blocks, 64-key tiles, 4 warps,
    // mma.sync), compiled here; its main-loop counts in tests/fixtures/perf/. Every published
    // figure, non-causal and causal, within 15%.
    let rows = calibration().expect("calibration");
    assert!(rows.len() >= 4, "{} calibration rows", rows.len());
    for r in &rows {
        assert!(
            r.error.abs() <= 0.15,
            "{} at {}x{}: predicted {:.0} TFLOP/s, published {:.0} ({:+.1}%)",
            r.peer,
            r.workload.batch,
            r.workload.seq,
            r.predicted.tflops,
            r.published_tflops,
            100.0 * r.error
        );
        // The independent-phase figure is an upper bound of the lockstep one.
        assert!(r.predicted_independent_tflops >= r.predicted.tflops, "{}", r.peer);
    }
}

#[test]
fn our_prefill_prediction_is_below_the_mma_sync_rate_for_the_stated_reasons() {
    let k = kernel("attention_hd128_bf16");
    let m = k.matrix.expect("attention has a matrix model");
    let launch = k.prefill.expect("attention has a launch prediction");
    // The first-order figure: the mma.sync rate at the datasheet-derived clock.
    let rate = |ghz: f64| h200::HMMA_PER_CLK * 4096.0 * h200::SMS * ghz * 1e9 / 1e12;
    assert!((m.first_order_tflops - rate(h200::CLOCK_GHZ)).abs() < 1.0, "{:.0}", m.first_order_tflops);
    // 1. The tensor-loaded clock: the mma.sync rate at 1.36 GHz is below the one at 1.83.
    assert!(rate(h200::TENSOR_CLOCK_GHZ) < 0.8 * m.first_order_tflops);
    // 2. The softmax chain between the GEMMs: at least the MUFU time of the ex2 (8 clocks per
    // warp instruction), not hidden by the other warps of the SMSP in lockstep.
    assert!(k.mix.mufu > 0 && m.chain_clk >= m.mufu_clk && m.mufu_clk >= 8.0 * k.mix.mufu as f64);
    assert!(m.utilization < 1.0 && m.utilization > 0.6, "utilization {:.2}", m.utilization);
    assert!((m.loop_tflops - m.utilization * rate(h200::TENSOR_CLOCK_GHZ)).abs() < 1.0);
    // 3. Issue: all warps' slots fit in the period (the loop is not issue-bound).
    assert!(m.issue_clk < m.period_lockstep, "issue {:.0} of {:.0} clk", m.issue_clk, m.period_lockstep);
    // 4. The launch: schedule losses and the launch latency only lower it further.
    assert!(launch.schedule <= 1.0 && launch.tflops < m.loop_tflops, "{launch:?}");
    assert!(launch.tflops < 0.8 * m.first_order_tflops, "prefill {:.0} TFLOP/s", launch.tflops);
    assert!(k.predicted.contains("of the mma.sync rate at that clock"), "{}", k.predicted);
}

#[test]
fn the_memory_model_predicts_llmc_layernorm_within_15_percent() {
    // llm.c's fp32 LayerNorm forward kernels 3 and 5 (dev/cuda/layernorm_forward.cu), compiled
    // here; their counts and the H100 figures published with them in tests/fixtures/perf/.
    let rows = memory_calibration().expect("memory calibration");
    assert!(rows.len() >= 2, "{} memory calibration rows", rows.len());
    for r in &rows {
        assert!(
            r.error.abs() <= 0.15,
            "{} ({}): predicted {:.0} GB/s, published {:.0} ({:+.1}%)",
            r.peer,
            r.workload,
            r.predicted.gbps,
            r.published_gbps,
            100.0 * r.error
        );
        // The harness's write-back only slows the launch, and every term is a positive time.
        assert!(r.predicted_without_harness_gbps > r.predicted.gbps, "{}", r.peer);
        let p = &r.predicted;
        assert!(p.t_dram > 0.0 && p.t_latency > 0.0 && p.t_issue > 0.0 && p.t_launch > 0.0, "{p:?}");
        assert!((p.seconds - p.t_launch - p.t_dram.max(p.t_latency).max(p.t_issue)).abs() < 1e-12, "{p:?}");
    }
}

#[test]
fn memory_bound_kernels_predict_a_fraction_of_copy_bandwidth_from_the_calibrated_model() {
    for s in SPECS.iter().filter(|s| s.bytes_per_elem > 0.0) {
        let k = kernel(s.kernel);
        let m = k.memory.unwrap_or_else(|| panic!("{}: no memory prediction", s.kernel));
        assert!(k.predicted_value > 0.0 && k.predicted_value <= 1.0, "{}: {}", s.kernel, k.predicted_value);
        assert_eq!(k.predicted_value, m.fraction_of_copy, "{}", s.kernel);
        // The launch latency is the one loss of a bandwidth-bound launch: steady state is above.
        assert!(m.steady_fraction >= m.fraction_of_copy, "{}: {m:?}", s.kernel);
        assert_eq!(k.predicted_unit, "fraction of copy bandwidth");
    }
}

#[test]
fn the_json_report_has_every_kernel_and_calibration_row_as_numbers() {
    let v: serde_json::Value = serde_json::from_str(&report_json_text()).expect("the JSON report parses");
    assert_eq!(v["measured"], serde_json::Value::Bool(false));
    let kernels = v["kernels"].as_array().expect("kernels");
    assert_eq!(kernels.len(), SPECS.len());
    let finite = |x: &serde_json::Value, what: &str| {
        let n = x.as_f64().unwrap_or_else(|| panic!("{what}: not a number: {x}"));
        assert!(n.is_finite(), "{what}: {n}");
        n
    };
    for s in SPECS {
        let k = kernels.iter().find(|k| k["kernel"] == s.kernel).unwrap_or_else(|| panic!("{} missing", s.kernel));
        assert!(k.get("error").is_none(), "{}: {}", s.kernel, k["error"]);
        assert_eq!(k["module"], s.module);
        assert_eq!(k["shape"], s.shape);
        assert!(k["bound"].as_str().is_some_and(|b| !b.is_empty()), "{}", s.kernel);
        let value = finite(&k["predicted"]["value"], s.kernel);
        assert!(value > 0.0, "{}: {value}", s.kernel);
        assert!(finite(&k["blocks_per_sm"], s.kernel) >= 1.0, "{}", s.kernel);
        assert!(finite(&k["resources"]["registers"], s.kernel) > 0.0, "{}", s.kernel);
        if s.bytes_per_elem > 0.0 {
            assert_eq!(finite(&k["predicted_fraction_of_copy"], s.kernel), value);
            assert!(value <= 1.0, "{}: {value}", s.kernel);
            finite(&k["memory_model"]["latency_cover"], s.kernel);
        } else {
            assert_eq!(finite(&k["predicted_tflops"], s.kernel), value);
            assert!(finite(&k["predicted_loop_tflops"], s.kernel) >= value, "{}", s.kernel);
        }
    }
    let rows = v["calibration"].as_array().expect("calibration");
    assert_eq!(v["calibration_errors"].as_array().map(Vec::len), Some(0), "{}", v["calibration_errors"]);
    let kind = |k: &str| rows.iter().filter(|r| r["kind"] == k).count();
    assert_eq!(kind("matrix"), calibration().expect("calibration").len());
    assert_eq!(kind("memory"), memory_calibration().expect("memory calibration").len());
    assert_eq!(kind("wgmma"), llama_kernels_inspect::perf::wgmma_calibration().expect("wgmma").len());
    assert!(kind("matrix") >= 4 && kind("memory") >= 2 && kind("wgmma") >= 12, "{} rows", rows.len());
    let hopper = v["hopper"]["kernels"].as_array().unwrap_or_else(|| panic!("hopper: {}", v["hopper"]));
    assert_eq!(hopper.len(), 6, "{}", v["hopper"]);
    for k in hopper {
        assert!(finite(&k["loop_tflops"], "loop_tflops") > 0.0, "{k}");
        let launches = k["launches"].as_array().expect("launches");
        assert_eq!(launches.len(), 6, "{k}");
        for l in launches {
            assert!(finite(&l["tflops"], "tflops") > 0.0, "{l}");
        }
    }
    for r in rows {
        let (published, predicted, error) =
            (finite(&r["published"], "published"), finite(&r["predicted"], "predicted"), finite(&r["error"], "error"));
        assert!(published > 0.0 && predicted > 0.0, "{r}");
        assert!((error - (predicted - published) / published).abs() < 1e-9, "{r}");
        assert!(error.abs() <= 0.15, "calibration off by {:+.1}%: {r}", 100.0 * error);
        assert!(r["source"].as_str().is_some_and(|s| s.len() > 10) && r["peer"].is_string(), "{r}");
    }
}

/// Regenerates the peer counts of tests/fixtures/perf/ from a cubin compiled outside the
/// repository (the fixture's "how"): `LLK_PEER_CUBIN=fa2.cubin LLK_PEER_PTXAS=build.log cargo test
/// --features dev --test perf_report -- --ignored regenerate_peer_counts --nocapture`.
#[test]
#[ignore]
fn regenerate_peer_counts() {
    let cubin = std::fs::read(std::env::var("LLK_PEER_CUBIN").expect("LLK_PEER_CUBIN")).expect("cubin");
    let ptxas =
        std::env::var("LLK_PEER_PTXAS").map(|p| std::fs::read_to_string(p).expect("ptxas log")).unwrap_or_default();
    for r in llama_kernels_inspect::parse_ptxas(&ptxas) {
        let c = peer_loop_counts(&cubin, &r.name).expect("counts");
        println!(
            "{}: registers {}, spill {}/{}; main_loop {{ \"total\": {}, \"hmma\": {}, \"ldsm\": {}, \"ldgsts\": {}, \"mufu\": {}, \"shfl\": {}, \"bar\": {}, \"fp32\": {} }}",
            r.name,
            r.registers,
            r.spill_stores,
            r.spill_loads,
            c.total,
            c.hmma,
            c.ldsm,
            c.ldgsts,
            c.mufu,
            c.shfl,
            c.bar,
            c.fp32
        );
    }
}

/// Regenerates the wgmma peers' loops of tests/fixtures/perf/fa3_bf16_fwd_sm90.json from
/// a cubin compiled outside the repository (the fixture's "how"): `LLK_PEER_CUBIN=fa3.cubin
/// LLK_PEER_PTXAS=build.log cargo test --features dev --test perf_report -- --ignored
/// regenerate_wgmma_peer_counts --nocapture`.
#[test]
#[ignore]
fn regenerate_wgmma_peer_counts() {
    let cubin = std::fs::read(std::env::var("LLK_PEER_CUBIN").expect("LLK_PEER_CUBIN")).expect("cubin");
    let ptxas = std::fs::read_to_string(std::env::var("LLK_PEER_PTXAS").expect("LLK_PEER_PTXAS")).expect("ptxas log");
    for r in llama_kernels_inspect::parse_ptxas(&ptxas) {
        println!("{}: registers {}, spill {}/{}", r.name, r.registers, r.spill_stores, r.spill_loads);
        for l in llama_kernels_inspect::perf::peer_wgmma_loops(&cubin, &r.name).expect("loops") {
            println!(
                "  {{ \"body\": {{ \"total\": {}, \"hgmma\": {}, \"mufu\": {} }}, \"beside\": {{ \"total\": {}, \"mufu\": {} }} }}",
                l.body.total, l.body.hgmma, l.body.mufu, l.beside.total, l.beside.mufu
            );
        }
    }
}

/// Regenerates the memory-bound peer's counts of tests/fixtures/perf/llmc_layernorm_forward_fp32_sm90.json
/// from a cubin compiled outside the repository (the fixture's "how"): `LLK_PEER_CUBIN=ln.cubin
/// LLK_PEER_PTXAS=ptxas.log LLK_PEER_ELEMENTS=3,24 cargo test --features dev --test perf_report --
/// --ignored regenerate_memory_peer_counts --nocapture` (elements per thread of a row).
#[test]
#[ignore]
fn regenerate_memory_peer_counts() {
    let cubin = std::fs::read(std::env::var("LLK_PEER_CUBIN").expect("LLK_PEER_CUBIN")).expect("cubin");
    let ptxas = std::fs::read_to_string(std::env::var("LLK_PEER_PTXAS").expect("LLK_PEER_PTXAS")).expect("ptxas log");
    let elements: Vec<usize> = std::env::var("LLK_PEER_ELEMENTS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|e| e.trim().parse().ok())
        .collect();
    for r in llama_kernels_inspect::parse_ptxas(&ptxas) {
        let c = peer_memory_counts(&cubin, &r.name).expect("counts");
        let per_thread: Vec<String> =
            elements.iter().map(|&e| format!("{e} elements: {}", c.instructions_per_thread(e))).collect();
        println!(
            "{}: registers {}, smem {}, spill {}/{}; bytes_in_flight_per_thread {}; straight-line {}, loops (instructions, row loads) {:?}; LDG {:?}, STG {:?}; instructions per thread: {}",
            r.name,
            r.registers,
            r.smem_bytes,
            r.spill_stores,
            r.spill_loads,
            c.bytes_in_flight_per_thread,
            c.straight_line,
            c.loops,
            c.mix.ldg,
            c.mix.stg,
            per_thread.join(", ")
        );
    }
}

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

#[test]
fn the_json_report_has_the_coverage_and_the_layers() {
    let v: serde_json::Value = serde_json::from_str(&report_json_text()).expect("the JSON report parses");
    let cov = v["coverage"].as_array().expect("coverage");
    assert!(cov.len() >= 40, "{} covered launches", cov.len());
    for c in cov {
        assert!(c.get("error").is_none(), "{c}");
        assert!(c["seconds"].as_f64().is_some_and(|s| s.is_finite() && s > 0.0), "{c}");
    }
    for k in [
        "paged_decode_hd128_bf16",
        "paged_decode_hd128_bf16_fp8",
        "paged_decode_merge_bf16",
        "merge_states_bf16",
        "kv_append_bf16_bf16",
        "moe_route_llama4_e128_bf16",
        "moe_align_scan",
        "moe_gather_vec_bf16",
        "moe_combine_vec_bf16",
        "moe_grouped_gemm_kn_swiglu_m64_bf16",
        "embedding_vec_bf16",
        "qembedding_q8_0_bf16",
        "qembedding_q6_k_bf16",
    ] {
        assert!(cov.iter().any(|c| c["kernel"] == k), "{k} missing from the JSON coverage");
    }
    let layers = &v["layers"];
    assert_eq!(layers["measured"], serde_json::Value::Bool(false));
    let steps = layers["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 15);
    for s in steps {
        assert!(s.get("error").is_none(), "{s}");
        assert!(s["tokens_per_s_graph"].as_f64().is_some_and(|t| t.is_finite() && t > 0.0), "{s}");
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

/// The JSON report carries the packed kernels' predictions as numbers.
#[test]
fn the_json_report_has_the_packed_kernels() {
    let v: serde_json::Value = serde_json::from_str(&report_json_text()).expect("the JSON report parses");
    let p = &v["packed"];
    let gemv = p["gemv"].as_array().expect("gemv");
    assert_eq!(gemv.len(), 6 * 4 * 2);
    for g in gemv {
        assert!(g.get("error").is_none(), "{g}");
        let f = g["steady_fraction_of_copy"].as_f64().expect("steady fraction");
        assert!(f.is_finite() && f > 0.0 && f <= 1.0, "{g}");
    }
    let gemm = p["gemm"].as_array().expect("gemm");
    assert_eq!(gemm.len(), 7);
    for g in gemm {
        assert!(g["tflops"].as_f64().is_some_and(|t| t.is_finite() && t > 0.0), "{g}");
    }
    assert_eq!(p["gemm_crossover_rows"].as_array().map(Vec::len), Some(6));
    let mma = p["mma_gemv"].as_array().expect("mma_gemv");
    assert_eq!(mma.len(), 5 * (4 + 1));
    for g in mma.iter().filter(|g| g.get("kernel").is_some()) {
        assert!(g.get("error").is_none(), "{g}");
        let f = g["steady_fraction_of_copy"].as_f64().expect("steady fraction");
        assert!(f.is_finite() && f > 0.0 && f <= 1.0 + 1e-9, "{g}");
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

#[test]
fn the_report_lists_the_hopper_kernels_with_their_wgmma_loops() {
    use llama_kernels_inspect::perf;
    let text = perf::hopper_text(perf::prefill_attention_model().ok());
    // "N instructions (H HGMMA, M MUFU); beside the in-flight P V: B instructions, E MUFU"
    let numbers = |l: &str| -> Vec<usize> {
        l.split(|c: char| !c.is_ascii_digit()).filter(|w| !w.is_empty()).filter_map(|w| w.parse().ok()).collect()
    };
    for d in [64, 128, 256] {
        for dtype in ["bf16", "f16"] {
            let name = format!("attention_sm90_hd{d}_{dtype}: ");
            let at = text.lines().position(|l| l.trim_start().starts_with(&name)).unwrap_or_else(|| panic!("{name}"));
            let line = text.lines().nth(at).unwrap_or_default();
            assert!(line.contains("0/0 spill"), "{line}");
            // One main loop: S and P V (head_dim / 16 + keys / 16 HGMMA), and the softmax's
            // exponentials (one MUFU.EX2 per score, keys / 2 per thread) while the P V runs.
            let main = text.lines().nth(at + 1).unwrap_or_default();
            let n = numbers(main.split_once("main loop: ").map(|x| x.1).unwrap_or_else(|| panic!("{name}: {main}")));
            let keys = if d == 256 { 64 } else { 128 };
            assert_eq!(n.len(), 5, "{name}: {main}");
            assert_eq!(n[1], d / 16 + keys / 16, "{name}: HGMMA per tile: {main}");
            assert!(n[4] >= keys / 2 && n[4] <= n[2], "{name}: {main}");
            // The hot path (no mask) keeps every HGMMA and MUFU and drops the mask's instructions.
            let hot = text.lines().nth(at + 2).unwrap_or_default();
            let h = numbers(hot.split_once("hot path: ").map(|x| x.1).unwrap_or_else(|| panic!("{name}: {hot}")));
            assert_eq!(h.len(), 3, "{name}: {hot}");
            assert!(h[0] < n[0] && h[1] == n[1] && h[2] == n[2], "{name}: {hot} vs {main}");
        }
    }
    // The peer's loops come from the fixture; FlashAttention-3's unmasked causal loop runs only
    // part of its 64 exponentials beside its P V (ptxas hoists its wait).
    let fa3 =
        text.lines().find(|l| l.contains("causal (128 x 128), unmasked tiles: ")).unwrap_or_else(|| panic!("{text}"));
    let n = numbers(fa3.split_once("unmasked tiles: ").map(|x| x.1).unwrap_or_default());
    assert_eq!(n.len(), 5, "{fa3}");
    assert!(n[1] == 16 && n[4] < 64, "{fa3}");
}

/// The wgmma model against every published FlashAttention-3 figure in the fixture: fitted on the
/// three non-causal 16k figures (one number, the exposed part of the chain, whose recorded value
/// must be the fit's), it predicts those and the ten held out (4k and 8k, causal) within 5%.
#[test]
fn the_wgmma_model_predicts_flash_attention_3_within_5_percent() {
    use llama_kernels_inspect::hopper_report::fit_exposed_chain;
    use llama_kernels_inspect::perf::{h200, wgmma_calibration};
    let rows = wgmma_calibration().expect("wgmma calibration");
    let fitted: Vec<_> = rows.iter().filter(|r| r.fitted).collect();
    assert_eq!(fitted.len(), 3, "one fitted figure per head dim: {rows:?}");
    assert!(rows.len() >= 12, "{} figures", rows.len());
    for r in &rows {
        assert!(r.error.abs() <= 0.05, "{} at {:?}: {:+.1}%", r.peer, r.workload, 100.0 * r.error);
    }
    let (a, worst) = fit_exposed_chain().expect("fit");
    assert!(
        (a - h200::WGMMA_EXPOSED_CHAIN).abs() <= 0.01,
        "the fit gives {a}, h200 records {}",
        h200::WGMMA_EXPOSED_CHAIN
    );
    assert!(worst <= 0.04, "fit error {worst}");
    // Neither limit alone fits: no hiding at all, or all of it hidden, is off by more than 10%.
    let k = &llama_kernels_inspect::perf::fa3_kernels().expect("fixture")[0];
    let (w, published, _) = &k.published[2];
    for a in [0.0, 2.0] {
        let e = (k.model.predict_at(w, a).tflops - published) / published;
        assert!(e.abs() > 0.10, "{}: a = {a} fits within {:+.1}%", k.name, 100.0 * e);
    }
}

/// Our Hopper kernels under the calibrated wgmma model: per tile within 10% of FlashAttention-3's
/// main loop at each head dim, and at hd128 causal (4k to 16k, the FA3 paper's launches) at least
/// 95% of FA3's published figure and 1.5x the mma.sync kernel's prediction (the issue's goal,
/// predicted; no GPU measured it). A softmax that grows, or an overlap that ptxas undoes, fails.
#[test]
fn the_hopper_kernel_is_predicted_at_flash_attention_3s_rate() {
    use llama_kernels_inspect::hopper_report::paper_workload;
    use llama_kernels_inspect::perf::{fa3_kernels, our_hopper_kernels, predict_launch, prefill_attention_model};
    let ours = our_hopper_kernels().expect("our kernels");
    let peers = fa3_kernels().expect("fixture");
    assert_eq!(ours.len(), 6, "bf16 and f16 at three head dims");
    for k in &ours {
        let d = k.model.head_dim;
        let peer = peers.iter().find(|p| !p.causal && p.model.head_dim == d).expect("FA3 non-causal peer");
        let (o, p) = (k.model.loop_tflops(), peer.model.loop_tflops());
        assert!(o >= 0.9 * p, "{}: main loop {o:.0} TFLOP/s, FA3 {p:.0}", k.name);
        let t = k.model.tile(&k.model.unmasked);
        assert!(t.tile_clk > t.issue_clk && t.tile_clk > t.smem_clk, "{}: {t:?}", k.name);
    }
    let k = ours.iter().find(|k| k.name == "attention_sm90_hd128_bf16").expect("hd128 bf16");
    let causal = peers.iter().find(|p| p.causal && p.model.head_dim == 128).expect("FA3 hd128 causal");
    let (mma, blocks) = prefill_attention_model().expect("mma.sync model");
    for (w, published, _) in &causal.published {
        let w = paper_workload(w.seq, 128, true);
        let (o, m) = (k.model.predict(&w).tflops, predict_launch(&mma, &w, blocks).tflops);
        assert!(o >= 0.95 * published, "seq {}: {o:.0} TFLOP/s, FA3 published {published:.0}", w.seq);
        assert!(o >= 1.5 * m, "seq {}: {o:.0} TFLOP/s, mma.sync {m:.0}", w.seq);
    }
}
