//! The attention backward's tensor-core kernels in the static report.

use llama_kernels_inspect::backward_model::{PUBLISHED_HD128, backward_text, predict_attention_backward};

/// Each kernel's main loop issues exactly the HMMA of its products (3 for dQ, 4 for dK/dV per
/// streamed tile, nothing recomputed inside a launch), and the first-order ceiling is finite and
/// printed in the report next to the published figures.
#[test]
fn attention_backward_loops_issue_exactly_their_products() {
    for head_dim in [64, 128] {
        let p = predict_attention_backward(head_dim).unwrap_or_else(|e| panic!("head_dim {head_dim}: {e}"));
        assert_eq!((p.dq.hmma, p.dkdv.hmma), p.expected_hmma, "head_dim {head_dim}: {p:?}");
        assert!(p.dq.blocks_per_sm >= 1 && p.dkdv.blocks_per_sm >= 1, "{p:?}");
        assert!(p.tflops.is_finite() && p.tflops > 0.0, "{p:?}");
        // The convention: 5 products over the time of 7, so below the slower loop's own rate.
        assert!(p.tflops < 5.0 / 7.0 * p.dq.tflops.max(p.dkdv.tflops) * 1.0001, "{p:?}");
    }
    let text = backward_text();
    assert!(text.contains("attention_bwd_dkdv_mma_hd128_bf16") && text.contains(PUBLISHED_HD128[0].0), "{text}");
    println!("{text}");
}
