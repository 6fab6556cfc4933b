//! The models against their peers: FlashAttention-2 and -3, llm.c, copy bandwidth; and the ignored tests that regenerate the peer counts.

use super::*;

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

/// Regenerates the peer counts of tests/fixtures/perf/ from a cubin compiled outside the
/// repository (the fixture's "how"): `LLK_PEER_CUBIN=fa2.cubin LLK_PEER_PTXAS=build.log cargo test
/// -p llama-kernels-inspect --test inspect -- --ignored regenerate_peer_counts --nocapture`.
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
/// LLK_PEER_PTXAS=build.log cargo test -p llama-kernels-inspect --test inspect -- --ignored
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
/// LLK_PEER_PTXAS=ptxas.log LLK_PEER_ELEMENTS=3,24 cargo test -p llama-kernels-inspect --test inspect --
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
