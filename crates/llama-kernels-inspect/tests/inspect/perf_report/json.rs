//! The report as JSON and as text: every kernel, calibration row, layer and Hopper loop.

use super::*;

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

/// The JSON report carries the packed kernels' predictions as numbers.
#[test]
fn the_json_report_has_the_packed_kernels() {
    let v: serde_json::Value = serde_json::from_str(&report_json_text()).expect("the JSON report parses");
    let p = &v["packed"];
    let gemv = p["gemv"].as_array().expect("gemv");
    let formats = llama_kernels::spec::quant::QuantFormat::ALL.len();
    assert_eq!(gemv.len(), formats * 4 * 2);
    for g in gemv {
        assert!(g.get("error").is_none(), "{g}");
        let f = g["steady_fraction_of_copy"].as_f64().expect("steady fraction");
        assert!(f.is_finite() && f > 0.0 && f <= 1.0, "{g}");
    }
    let gemm = p["gemm"].as_array().expect("gemm");
    assert_eq!(gemm.len(), formats + 1, "the dense peer and every format");
    for g in gemm {
        assert!(g["tflops"].as_f64().is_some_and(|t| t.is_finite() && t > 0.0), "{g}");
    }
    assert_eq!(p["gemm_crossover_rows"].as_array().map(Vec::len), Some(formats));
    let mma = p["mma_gemv"].as_array().expect("mma_gemv");
    assert_eq!(mma.len(), 5 * (4 + 1));
    for g in mma.iter().filter(|g| g.get("kernel").is_some()) {
        assert!(g.get("error").is_none(), "{g}");
        let f = g["steady_fraction_of_copy"].as_f64().expect("steady fraction");
        assert!(f.is_finite() && f > 0.0 && f <= 1.0 + 1e-9, "{g}");
    }
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
