//! The model of a warp-specialized flash-attention main loop on wgmma (issue 20): the structure
//! of FlashAttention-3 and of `kernels/attention_sm90.cu`. A producer warp loads Q, K and V by
//! TMA; the block's consumer warpgroups (64 query rows each) take the K/V tiles in turn. Per tile,
//! a warpgroup runs two products on the SM's four tensor cores (S = Q K^T and O += P V, wgmma)
//! and a chain on the four SMSPs its warps occupy: the mask, the online softmax with its
//! exponentials on each SMSP's MUFU quad, the O rescale, the conversion of P, the barrier and
//! wgmma waits. Ping-pong runs another warpgroup's products during that chain, and the
//! in-warpgroup overlap runs the warpgroup's own P V during part of it.
//!
//! One warpgroup tile of `n` keys at head dim `d` costs, in SM clocks,
//!
//! ```text
//!   t = max(G + a C,  I,  M)
//!   G = 4 * 64 * n * d / 4096          tensor work (the dense 16-bit wgmma rate per SM)
//!   C = max(slots, 8 * MUFU)           one warp's chain: its non-HGMMA issue slots, or its
//!                                      MUFU time (4 lanes per SMSP), whichever is longer
//!   I = total                          the tile's issue slots: each SMSP issues one warp
//!                                      instruction per clock and holds one warp of every
//!                                      consumer warpgroup
//!   M = 2 d (64 + 2 n) / 128           shared memory: wgmma reads Q and K (S) and V (P V) once
//!                                      per warpgroup, at 128 bytes per clock
//! ```
//!
//! `a` ([`h200::WGMMA_EXPOSED_CHAIN`]) is the part of the chain the overlaps do not hide, net of
//! the chain's latencies that the counts leave out: the one fitted number, at the datasheet clock
//! [`h200::CLOCK_GHZ`] (at which the dense rate is 989 TFLOP/s), on FlashAttention-3's three
//! non-causal 16k figures ([`super::hopper_report::wgmma_calibration`]); its other published figures
//! check it. A launch is its blocks dispatched greedily onto the SMs, one block at a time per SM
//! (the consumer warpgroups of all resident blocks share the same tensor cores), each block its
//! tiles (diagonal and sequence-end tiles at the masked loop's counts) plus one tile of prologue
//! and epilogue, as [`super::attention_model::predict_launch`] does for mma.sync.

use super::attention_model::{LaunchPrediction, Workload, schedule_efficiency};
use super::h200;

/// Query rows per consumer warpgroup: the M of wgmma's m64nNk16.
pub const WARPGROUP_ROWS: usize = 64;

/// What the model reads from one main-loop iteration (one K/V tile) of one consumer thread.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WgmmaCounts {
    /// Every instruction except NOP.
    pub total: usize,
    pub hgmma: usize,
    pub mufu: usize,
}

/// A wgmma attention kernel's geometry and per-tile counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WgmmaKernel {
    /// Query rows per block (consumer warpgroups x 64).
    pub block_rows: usize,
    /// Keys per K/V tile.
    pub keys: usize,
    pub head_dim: usize,
    /// An interior tile (no mask), and a tile that crosses the causal diagonal or the sequence end.
    pub unmasked: WgmmaCounts,
    pub masked: WgmmaCounts,
}

/// One warpgroup tile under the model, in SM clocks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WgmmaTile {
    /// G: tensor clocks.
    pub gemm_clk: f64,
    /// C: the chain, and its two candidates (MUFU clocks, non-HGMMA issue slots).
    pub chain_clk: f64,
    pub mufu_clk: f64,
    pub chain_issue: f64,
    /// I: issue slots of the tile on one SMSP.
    pub issue_clk: f64,
    /// M: shared-memory clocks.
    pub smem_clk: f64,
    /// t: the tile's cost.
    pub tile_clk: f64,
    pub bound: &'static str,
}

impl WgmmaTile {
    /// The tensor pipe's busy fraction.
    pub fn utilization(&self) -> f64 {
        self.gemm_clk / self.tile_clk
    }
}

/// FLOPs of one warpgroup tile: S = Q K^T and O += P V, 2 * 64 * n * d each.
fn tile_flops(keys: usize, head_dim: usize) -> f64 {
    4.0 * (WARPGROUP_ROWS * keys * head_dim) as f64
}

impl WgmmaKernel {
    /// The model of one warpgroup tile with counts `c`.
    pub fn tile(&self, c: &WgmmaCounts) -> WgmmaTile {
        self.tile_at(c, h200::WGMMA_EXPOSED_CHAIN)
    }

    /// [`Self::tile`] with `exposed` in place of the fitted [`h200::WGMMA_EXPOSED_CHAIN`] (the fit).
    pub fn tile_at(&self, c: &WgmmaCounts, exposed: f64) -> WgmmaTile {
        let gemm = tile_flops(self.keys, self.head_dim) / h200::WGMMA_FLOPS_PER_CLK;
        let mufu_clk = c.mufu as f64 * h200::SMSPS * 32.0 / h200::MUFU_PER_CLK;
        let chain_issue = c.total.saturating_sub(c.hgmma) as f64;
        let chain = mufu_clk.max(chain_issue);
        let issue = c.total as f64;
        let smem = (2 * self.head_dim * (WARPGROUP_ROWS + 2 * self.keys)) as f64 / h200::SMEM_BYTES_PER_CLK;
        let overlapped = gemm + exposed * chain;
        let tile = overlapped.max(issue).max(smem);
        let bound = if tile == smem {
            "shared memory"
        } else if tile == issue {
            "issue"
        } else if mufu_clk >= chain_issue {
            "tensor, plus the exposed exponentials"
        } else {
            "tensor, plus the exposed softmax issue"
        };
        WgmmaTile {
            gemm_clk: gemm,
            chain_clk: chain,
            mufu_clk,
            chain_issue,
            issue_clk: issue,
            smem_clk: smem,
            tile_clk: tile,
            bound,
        }
    }

    /// Main-loop TFLOP/s over interior tiles, every SM busy, at the datasheet clock.
    pub fn loop_tflops(&self) -> f64 {
        let t = self.tile(&self.unmasked).tile_clk;
        tile_flops(self.keys, self.head_dim) / t * h200::SMS * h200::CLOCK_GHZ * 1e9 / 1e12
    }

    /// The launch prediction of `w`: TFLOP/s as benchmarks count them (4 s^2 d h b, halved when
    /// causal), with the causal row blocks dispatched in `w.heaviest_first` order.
    pub fn predict(&self, w: &Workload) -> LaunchPrediction {
        self.predict_at(w, h200::WGMMA_EXPOSED_CHAIN)
    }

    /// [`Self::predict`] with `exposed` in place of the fitted [`h200::WGMMA_EXPOSED_CHAIN`].
    pub fn predict_at(&self, w: &Workload, exposed: f64) -> LaunchPrediction {
        let (bm, bn) = (self.block_rows.max(1), self.keys.max(1));
        let per_tile = (bm as f64 / WARPGROUP_ROWS as f64).max(1.0);
        let unmasked = self.tile_at(&self.unmasked, exposed).tile_clk * per_tile;
        let masked = self.tile_at(&self.masked, exposed).tile_clk * per_tile;
        let row_blocks = w.seq.div_ceil(bm);
        let ragged = usize::from(w.seq % bn != 0);
        // Tiles of row block m, and how many of them need no mask: keys below the block's first
        // row (causal, bottom-right aligned with equal lengths) and inside the sequence.
        let tiles = |m: usize| {
            if w.causal {
                let end = ((m + 1) * bm).min(w.seq);
                let tiles = end.div_ceil(bn);
                let clear = ((m * bm + 1) / bn).min(tiles - usize::from(end % bn != 0));
                (tiles, clear)
            } else {
                let tiles = w.seq.div_ceil(bn);
                (tiles, tiles - ragged)
            }
        };
        let mut jobs = Vec::with_capacity(row_blocks * w.heads * w.batch);
        let mut computed_pairs = 0.0;
        for _ in 0..w.heads * w.batch {
            for k in 0..row_blocks {
                let m = if w.causal && w.heaviest_first { row_blocks - 1 - k } else { k };
                let (n, clear) = tiles(m);
                jobs.push(
                    clear as f64 * unmasked + (n - clear) as f64 * masked + h200::BLOCK_OVERHEAD_TILES * unmasked,
                );
                computed_pairs += (n * bn * bm) as f64;
            }
        }
        let slots = h200::SMS as usize;
        let schedule = schedule_efficiency(&jobs, slots);
        let busiest = jobs.iter().sum::<f64>() / (slots as f64 * schedule);
        let seconds = busiest / (h200::CLOCK_GHZ * 1e9) + h200::LAUNCH_US * 1e-6;
        let full = (w.seq * w.seq) as f64 * (w.heads * w.batch) as f64;
        let credited_pairs = if w.causal { full / 2.0 } else { full };
        let flops = 4.0 * credited_pairs * w.head_dim as f64;
        LaunchPrediction { tflops: flops / seconds / 1e12, schedule, credited: credited_pairs / computed_pairs }
    }
}
