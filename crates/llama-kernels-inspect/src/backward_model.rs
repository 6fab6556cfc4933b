//! The attention backward on tensor cores, first order: what the sm_90 SASS of its two mma.sync
//! kernels (kernels/attention_backward.cu) predicts on an H200, next to the published H100
//! figures of FlashAttention-2, cuDNN and FlashAttention-3 at head_dim 128, bf16.
//!
//! Each kernel's main loop (the loop with the most HMMA: one streamed tile of
//! `LLK_ATTN_BWD_MMA_TILE` keys or queries per iteration, 16 rows per warp) is read by
//! [`predict_mma_loop`]: the slowest of the tensor pipe, shared memory and issue slots, at the
//! tensor-loaded clock. Per iteration a dQ warp runs 3 products (S, dP, dQ += dS K) and a dK/dV
//! warp 4 (S^T, dP^T, dV += P^T dO, dK += dS^T Q): 7 in all, where FlashAttention-2's single
//! kernel runs 5 (S and dP are recomputed in both launches, the price of computing dQ without
//! atomics). The TFLOP/s reported follow FlashAttention's convention, 5 products (2.5 times
//! the forward's FLOPs) over the time of our 7, so the recomputation costs its 7/5.
//!
//! A ceiling, not a forecast: the model has no latency term, and these kernels stage each tile
//! with plain 16-byte loads and a barrier (no cp.async pipeline), while their registers (about
//! 200 and 250 at head_dim 128) leave two blocks of 4 warps per SM, two warps per scheduler, to
//! hide a load or an HMMA chain. Waves, the causal tail, the prologue (staging the block's own
//! rows) and the launch are left out too. At head_dim 128 both loops are bound by shared memory
//! (each warp reads the whole streamed tile through ldmatrix for each of its products): the
//! lever is larger per-warp tiles or operands kept in registers, as FlashAttention-2 does.

use super::qlinear_model::{MmaLoopPrediction, predict_mma_loop};
use llama_kernels::dev::geometry::params::{LLK_ATTN_BWD_MMA_TILE, LLK_ATTN_BWD_THREADS};

/// The published backward figures at head_dim 128, bf16, on an H100 SXM (TFLOP/s at 512 and
/// 16k tokens; FlashAttention-3 paper, backward benchmark): FlashAttention-2, cuDNN,
/// FlashAttention-3.
pub const PUBLISHED_HD128: [(&str, f64, f64); 3] =
    [("FlashAttention-2", 214.0, 322.0), ("cuDNN", 305.0, 516.0), ("FlashAttention-3", 316.0, 561.0)];

/// The backward's prediction at one head dim (bf16).
#[derive(Clone, Debug)]
pub struct BackwardPrediction {
    pub head_dim: u32,
    pub dq: MmaLoopPrediction,
    pub dkdv: MmaLoopPrediction,
    /// The HMMA one iteration of each loop must issue for its products: (dQ, dK/dV).
    pub expected_hmma: (usize, usize),
    /// FlashAttention's convention (5 products) over our time (7 products).
    pub tflops: f64,
}

/// HMMA (m16n8k16) one warp issues for `products` products of its 16 rows with a streamed tile
/// at `head_dim`: each is 16 x tile x head_dim multiply-adds.
pub fn hmma_per_iteration(products: usize, head_dim: u32) -> usize {
    products * 16 * LLK_ATTN_BWD_MMA_TILE as usize * head_dim as usize / (16 * 8 * 16)
}

/// The first-order prediction of the bf16 backward at `head_dim` (64 or 128).
pub fn predict_attention_backward(head_dim: u32) -> Result<BackwardPrediction, String> {
    let loop_of = |kernel: &str| -> Result<MmaLoopPrediction, String> {
        let name = format!("attention_bwd_{kernel}_mma_hd{head_dim}_bf16");
        predict_mma_loop("attention_backward", &name, LLK_ATTN_BWD_THREADS, super::declared_smem(&name)?)
    };
    let (dq, dkdv) = (loop_of("dq")?, loop_of("dkdv")?);
    let tflops = 5.0 / (3.0 / dq.tflops + 4.0 / dkdv.tflops);
    let expected_hmma = (hmma_per_iteration(3, head_dim), hmma_per_iteration(4, head_dim));
    Ok(BackwardPrediction { head_dim, dq, dkdv, expected_hmma, tflops })
}

/// The report's section.
pub fn backward_text() -> String {
    let mut s = String::from(
        "Attention backward (bf16, mma.sync; first order at the tensor-loaded clock) -- a MODEL, not a measurement.\n\
         A ceiling: no latency term, while the kernels stage tiles without a cp.async pipeline with two\n\
         warps per scheduler at head_dim 128; 7 products where FlashAttention-2 runs 5 (no atomic dQ).\n",
    );
    for head_dim in [64, 128] {
        match predict_attention_backward(head_dim) {
            Ok(p) => {
                for l in [&p.dq, &p.dkdv] {
                    s += &format!(
                        "  {:<34} {:>3} regs {} blocks/SM, {:>3} HMMA/loop, {:>5.2} slots and {:>4.0} B smem per HMMA; {} bound, {:>4.0} TFLOP/s of its products\n",
                        l.kernel,
                        l.registers,
                        l.blocks_per_sm,
                        l.hmma,
                        l.slots_per_hmma,
                        l.smem_bytes_per_hmma,
                        l.bound,
                        l.tflops
                    );
                }
                s += &format!(
                    "  head_dim {head_dim}: {:.0} TFLOP/s in FlashAttention's convention (5 products over the time of 7)\n",
                    p.tflops
                );
            }
            Err(e) => s += &format!("  head_dim {head_dim}: cannot analyze: {e}\n"),
        }
    }
    s += "  Published, H100 SXM, head_dim 128 (512 / 16k tokens):";
    for (name, short, long) in PUBLISHED_HD128 {
        s += &format!(" {name} {short:.0} / {long:.0};");
    }
    s += "\n\n";
    s
}
