//! The static performance report's thresholds: the levers each kernel was tuned with, asserted
//! from its sm_90 SASS, so that a change that loses one fails CI without a GPU. The numbers are a
//! model of an H200 (src/inspect/perf.rs), not a measurement.

use llama_kernels::dev::inspect::perf::{SPECS, analyze, report};

fn kernel(name: &str) -> llama_kernels::dev::inspect::perf::KernelPerf {
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
