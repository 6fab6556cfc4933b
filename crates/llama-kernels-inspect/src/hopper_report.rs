//! The Hopper prefill kernels in the static report (kernels/attention_sm90.cu): their resources,
//! their wgmma main loops read from the sm_90a SASS (every path, the hot path of an interior tile,
//! and what runs beside the in-flight P V), the same loops of FlashAttention-3 compiled here, the
//! calibration of the wgmma model ([`super::wgmma_model`]) on FA3's published figures, and the
//! model's predictions for ours next to the mma.sync kernel's.

use std::sync::OnceLock;

use super::attention_model::{MatrixModel, OUR_PREFILL, Workload, predict_launch};
use super::h200;
use super::sass::{Mix, WgmmaLoop, cold_addresses, cold_ranges, disassemble, hot_path, wgmma_loops};
use super::wgmma_model::{WgmmaCounts, WgmmaKernel};
use super::{all_resources, kernel_code};
use llama_kernels::dev::geometry::params::{LLK_ATTN_ROWS_MMA, LLK_ATTN_SM90_KEYS, LLK_ATTN_SM90_KEYS_HD256};

/// FlashAttention-3's bf16 forward kernels at head dims 64, 128 and 256: their wgmma main loops
/// read from their sm_90a SASS with this crate's code (`tests/inspect/perf_report/`,
/// `regenerate_wgmma_peer_counts`), their tiles, and the published H100 figures.
pub const FA3_FIXTURE: &str = include_str!("../tests/fixtures/perf/fa3_bf16_fwd_sm90.json");

/// The source whose `perf-model: cold` lines the hot path leaves out.
const SOURCE: &str = include_str!("../../llama-kernels/kernels/attention_sm90.cu");

/// The wgmma main loops of `kernel` in an external sm_90a cubin (a peer compiled here).
pub fn peer_wgmma_loops(cubin: &[u8], kernel: &str) -> Result<Vec<WgmmaLoop>, String> {
    Ok(wgmma_loops(&disassemble(cubin, kernel)?))
}

fn counts(m: &Mix) -> WgmmaCounts {
    WgmmaCounts { total: m.total, hgmma: m.hgmma, mufu: m.mufu }
}

/// One FA3 kernel of the fixture.
#[derive(Clone, Debug)]
pub struct PeerKernel {
    pub name: String,
    pub causal: bool,
    pub model: WgmmaKernel,
    /// (what, every instruction of the loop, beside the P V) per loop.
    pub loops: Vec<(String, WgmmaCounts, WgmmaCounts)>,
    /// (workload, published TFLOP/s, source).
    pub published: Vec<(Workload, f64, String)>,
}

/// FA3's kernels from the fixture.
pub fn fa3_kernels() -> Result<Vec<PeerKernel>, String> {
    let v: serde_json::Value = serde_json::from_str(FA3_FIXTURE).map_err(|e| format!("fixture: {e}"))?;
    let mut out = Vec::new();
    for k in v["kernels"].as_array().ok_or("fixture: no kernels")? {
        let name = k["name"].as_str().ok_or("fixture: a kernel without a name")?.to_string();
        let size = |f: &str| k[f].as_u64().map(|x| x as usize).ok_or(format!("fixture: {name}: no {f}"));
        let causal = k["causal"].as_bool().ok_or(format!("fixture: {name}: no causal"))?;
        let mut loops = Vec::new();
        let (mut unmasked, mut masked) = (None, None);
        for l in k["loops"].as_array().ok_or(format!("fixture: {name}: no loops"))? {
            let n = |part: &str, f: &str| {
                l[part][f].as_u64().map(|x| x as usize).ok_or(format!("fixture: {name}: no loops.{part}.{f}"))
            };
            let body = WgmmaCounts { total: n("body", "total")?, hgmma: n("body", "hgmma")?, mufu: n("body", "mufu")? };
            let beside = WgmmaCounts { total: n("beside", "total")?, mufu: n("beside", "mufu")?, hgmma: 0 };
            if l["masked"].as_bool().ok_or(format!("fixture: {name}: no loops.masked"))? {
                masked = Some(body);
            } else {
                unmasked = Some(body);
            }
            loops.push((l["what"].as_str().unwrap_or("loop").to_string(), body, beside));
        }
        let unmasked = unmasked.ok_or(format!("fixture: {name}: no unmasked loop"))?;
        let model = WgmmaKernel {
            block_rows: size("block_rows")?,
            keys: size("keys")?,
            head_dim: size("head_dim")?,
            unmasked,
            // A kernel with one loop runs its few masked tiles (the sequence end) in it.
            masked: masked.unwrap_or(unmasked),
        };
        let mut published = Vec::new();
        for p in k["published"].as_array().ok_or(format!("fixture: {name}: no published"))? {
            let u = |f: &str| p[f].as_u64().map(|x| x as usize).ok_or(format!("fixture: {name}: no published.{f}"));
            let w = Workload {
                seq: u("seq")?,
                batch: u("batch")?,
                heads: u("heads")?,
                head_dim: model.head_dim,
                causal,
                heaviest_first: false,
            };
            let tflops = p["tflops"].as_f64().ok_or(format!("fixture: {name}: no published.tflops"))?;
            published.push((w, tflops, p["source"].as_str().unwrap_or("?").to_string()));
        }
        out.push(PeerKernel { name, causal, model, loops, published });
    }
    Ok(out)
}

/// A published FA3 figure against the wgmma model.
#[derive(Clone, Debug, PartialEq)]
pub struct WgmmaCalibration {
    pub peer: String,
    pub workload: Workload,
    pub source: String,
    pub published_tflops: f64,
    pub predicted_tflops: f64,
    /// (predicted - published) / published.
    pub error: f64,
    /// One of the figures [`h200::WGMMA_EXPOSED_CHAIN`] is fitted on (non-causal, 16k); the
    /// others are held out.
    pub fitted: bool,
}

/// The sequence length of the figures the model is fitted on.
pub const FIT_SEQ: usize = 16384;

/// Every published FA3 figure against the model. The causal row blocks are dispatched in row
/// order, the scheduler of the code the figures were measured with (the calibration chose it:
/// heaviest first over-predicts the causal figures by 8-16%).
pub fn wgmma_calibration() -> Result<Vec<WgmmaCalibration>, String> {
    let mut out = Vec::new();
    for k in fa3_kernels()? {
        for (w, published, source) in &k.published {
            let predicted = k.model.predict(w).tflops;
            out.push(WgmmaCalibration {
                peer: k.name.clone(),
                workload: *w,
                source: source.clone(),
                published_tflops: *published,
                predicted_tflops: predicted,
                error: (predicted - published) / published,
                fitted: !w.causal && w.seq == FIT_SEQ,
            });
        }
    }
    Ok(out)
}

/// The fit behind [`h200::WGMMA_EXPOSED_CHAIN`]: the value in [0, 2] (steps of 0.005) whose
/// largest error over the fitted figures is smallest, and that error.
pub fn fit_exposed_chain() -> Result<(f64, f64), String> {
    let kernels = fa3_kernels()?;
    let fitted: Vec<_> = kernels
        .iter()
        .flat_map(|k| k.published.iter().map(move |p| (k, p)))
        .filter(|(_, (w, _, _))| !w.causal && w.seq == FIT_SEQ)
        .collect();
    if fitted.is_empty() {
        return Err("fixture: no non-causal 16k figure to fit on".into());
    }
    let worst = |a: f64| {
        fitted.iter().map(|(k, (w, p, _))| ((k.model.predict_at(w, a).tflops - p) / p).abs()).fold(0.0, f64::max)
    };
    Ok((0..=400)
        .map(|i| i as f64 * 0.005)
        .map(|a| (a, worst(a)))
        .fold((0.0, f64::INFINITY), |b, x| if x.1 < b.1 { x } else { b }))
}

/// One of our Hopper kernels under the wgmma model.
#[derive(Clone, Debug)]
pub struct OurHopperKernel {
    pub name: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Its wgmma main loops (one): every path, and what runs beside the P V.
    pub loops: Vec<WgmmaLoop>,
    /// Interior tiles at the hot path of the loop, masked tiles at every path.
    pub model: WgmmaKernel,
}

/// Our Hopper prefill kernels (bf16 and f16 at every head dim), read once per process.
pub fn our_hopper_kernels() -> Result<Vec<OurHopperKernel>, String> {
    static KERNELS: OnceLock<Result<Vec<OurHopperKernel>, String>> = OnceLock::new();
    KERNELS
        .get_or_init(|| {
            let modules = all_resources("sm_90").map_err(|e| format!("cannot read the ptxas reports: {e}"))?;
            let mut out = Vec::new();
            for r in modules.iter().filter(|(m, _)| m.name == "attention_sm90").flat_map(|(_, ks)| ks) {
                let code = kernel_code("attention_sm90", &r.name)?;
                let loops = wgmma_loops(&code.code);
                let [l] = loops.as_slice() else {
                    return Err(format!("{}: {} wgmma main loops, the model reads one", r.name, loops.len()));
                };
                let head_dim = [64usize, 128, 256]
                    .into_iter()
                    .find(|d| r.name.contains(&format!("_hd{d}_")))
                    .ok_or(format!("{}: no head dim in the name", r.name))?;
                let region: Vec<_> = code.code.iter().filter(|i| (l.span.0..=l.span.1).contains(&i.addr)).collect();
                let cold = cold_addresses(code.cubin, &r.name, "attention_sm90.cu", &cold_ranges(SOURCE))?;
                let hot = Mix::of(hot_path(&region, &cold));
                out.push(OurHopperKernel {
                    name: r.name.clone(),
                    registers: r.registers,
                    spill_stores: r.spill_stores,
                    spill_loads: r.spill_loads,
                    loops: loops.clone(),
                    model: WgmmaKernel {
                        block_rows: LLK_ATTN_ROWS_MMA as usize,
                        keys: if head_dim <= 128 { LLK_ATTN_SM90_KEYS } else { LLK_ATTN_SM90_KEYS_HD256 } as usize,
                        head_dim,
                        unmasked: counts(&hot),
                        masked: counts(&l.body),
                    },
                });
            }
            Ok(out)
        })
        .clone()
}

fn loop_text(body: &WgmmaCounts, beside: &WgmmaCounts) -> String {
    format!(
        "{} instructions ({} HGMMA, {} MUFU); beside the in-flight P V: {} instructions, {} MUFU",
        body.total, body.hgmma, body.mufu, beside.total, beside.mufu
    )
}

/// A tile's terms, one line.
fn tile_text(k: &WgmmaKernel) -> String {
    let t = k.tile(&k.unmasked);
    format!(
        "G {:.0} + a C {:.0} (C: {:.0} MUFU, {:.0} issue) = {:.0} clk, issue {:.0}, shared memory {:.0}: {}; \
         tensor {:.0}% busy, main loop {:.0} TFLOP/s",
        t.gemm_clk,
        h200::WGMMA_EXPOSED_CHAIN * t.chain_clk,
        t.mufu_clk,
        t.chain_issue,
        t.gemm_clk + h200::WGMMA_EXPOSED_CHAIN * t.chain_clk,
        t.issue_clk,
        t.smem_clk,
        t.bound,
        100.0 * t.utilization(),
        k.loop_tflops()
    )
}

/// The sequence lengths of the FA3 paper's launches (16k tokens in all).
pub const PAPER_SEQS: [usize; 3] = [4096, 8192, 16384];

/// FA3's published figure for `head_dim`, `causal` and `seq`, if the fixture has one.
pub fn fa3_published(peers: &[PeerKernel], head_dim: usize, causal: bool, seq: usize) -> Option<f64> {
    peers
        .iter()
        .filter(|p| p.model.head_dim == head_dim && p.causal == causal)
        .flat_map(|p| p.published.iter())
        .find(|(w, _, _)| w.seq == seq)
        .map(|(_, tflops, _)| *tflops)
}

/// The launches the report predicts for our Hopper kernels: the FA3 paper's (16k tokens, hidden
/// 2048) at `seq`, dispatched heaviest first as ours are.
pub fn paper_workload(seq: usize, head_dim: usize, causal: bool) -> Workload {
    Workload { seq, batch: 16384 / seq.max(1), heads: 2048 / head_dim.max(1), head_dim, causal, heaviest_first: true }
}

/// The Hopper section of the report. `mma` is the mma.sync prefill kernel's calibrated model and
/// blocks per SM (`perf::prefill_attention_model`), printed beside ours where it is known.
pub fn hopper_text(mma: Option<(MatrixModel, u32)>) -> String {
    let mut s = String::from(
        "Hopper prefill attention (attention_sm90, sm_90a: TMA, wgmma, a producer and two consumer warpgroups).\n\
         Per K/V tile and consumer thread; \"every path\" includes the mask that interior tiles branch over,\n\
         the hot path leaves out the lines marked cold (FA3 runs its masked tiles in a loop of their own):\n",
    );
    let ours = our_hopper_kernels();
    match &ours {
        Ok(kernels) => {
            for k in kernels {
                s += &format!(
                    "  {}: {} registers at launch (setmaxnreg: 24 producer, 240 consumer), {}/{} spill st/ld\n",
                    k.name, k.registers, k.spill_stores, k.spill_loads
                );
                for l in &k.loops {
                    s += &format!("    main loop: {}\n", loop_text(&counts(&l.body), &counts(&l.beside)));
                }
                let h = &k.model.unmasked;
                s += &format!("    hot path: {} instructions ({} HGMMA, {} MUFU)\n", h.total, h.hgmma, h.mufu);
            }
        }
        Err(e) => s += &format!("  {e}\n"),
    }
    let peers = fa3_kernels();
    s += "  FlashAttention-3 bf16 forward, the same nvcc (tests/fixtures/perf/fa3_bf16_fwd_sm90.json):\n";
    match &peers {
        Ok(peers) => {
            for p in peers {
                for (what, body, beside) in &p.loops {
                    s += &format!("    {}, {what}: {}\n", p.name, loop_text(body, beside));
                }
            }
        }
        Err(e) => s += &format!("    {e}\n"),
    }
    s += &format!(
        "wgmma model (src/dev/inspect/wgmma_model.rs), per warpgroup tile of n keys at head dim d, at {:.2} GHz:\n\
         \x20 t = max(G + a C, I, M): G tensor clocks (4 64 n d FLOPs at 4096/clk/SM), C the chain (the longer of\n\
         \x20 a warp's non-HGMMA issue slots and its MUFU clocks), a = {:.2} the part no overlap hides (fitted on\n\
         \x20 FA3's three non-causal 16k figures, table below), I the tile's issue slots, M its shared-memory\n\
         \x20 clocks (Q, K and V read once per warpgroup at 128 B/clk).\n",
        h200::CLOCK_GHZ,
        h200::WGMMA_EXPOSED_CHAIN
    );
    if let Ok(kernels) = &ours {
        for k in kernels.iter().filter(|k| k.name.ends_with("_bf16")) {
            s += &format!("  {}: {}\n", k.name, tile_text(&k.model));
        }
    }
    if let Ok(peers) = &peers {
        for p in peers.iter().filter(|p| !p.causal) {
            s += &format!("  {}: {}\n", p.name, tile_text(&p.model));
        }
    }
    s += &prediction_text(mma);
    s += &wgmma_calibration_text();
    s
}

/// Our bf16 Hopper kernels at the paper's launches, next to FA3's published figure and the
/// mma.sync kernel's prediction (hd128, the kernel the mma.sync model covers).
fn prediction_text(mma: Option<(MatrixModel, u32)>) -> String {
    let mut s = String::from(
        "  Predicted TFLOP/s for ours at the FA3 paper's launches (16k tokens in all, hidden 2048), heaviest row\n\
         \x20 block first; FA3's published H100 figure and, at hd128, the mma.sync kernel's model beside:\n",
    );
    let (Ok(kernels), Ok(peers)) = (our_hopper_kernels(), fa3_kernels()) else {
        return s + "    cannot read the kernels or the fixture\n";
    };
    for k in kernels.iter().filter(|k| k.name.ends_with("_bf16")) {
        let d = k.model.head_dim;
        for causal in [false, true] {
            let mut row = format!("    hd{d:<3} {:<10}", if causal { "causal" } else { "non-causal" });
            for seq in PAPER_SEQS {
                let w = paper_workload(seq, d, causal);
                row += &format!(" {}k: {:.0}", seq / 1024, k.model.predict(&w).tflops);
                if let Some(fa3) = fa3_published(&peers, d, causal, seq) {
                    row += &format!(" (FA3 {fa3:.0}");
                } else {
                    row += " (FA3 -";
                }
                match (&mma, d) {
                    (Some((m, blocks)), 128) => {
                        row += &format!(", mma.sync {:.0})", predict_launch(m, &w, *blocks).tflops)
                    }
                    _ => row += ")",
                }
            }
            s += &row;
            s += "\n";
        }
    }
    // Like for like: FA3's causal kernels at the same launches and dispatch (its current code
    // schedules causal row blocks longest first too).
    for p in peers.iter().filter(|p| p.causal) {
        let d = p.model.head_dim;
        let at: Vec<String> = PAPER_SEQS
            .iter()
            .map(|&seq| format!("{}k: {:.0}", seq / 1024, p.model.predict(&paper_workload(seq, d, true)).tflops))
            .collect();
        s += &format!("    {}, its counts at the same launches and dispatch: {}\n", p.name, at.join(" "));
    }
    if let (Some((m, blocks)), Some(k)) = (&mma, kernels.iter().find(|k| k.name == "attention_sm90_hd128_bf16")) {
        let ours = k.model.predict(&OUR_PREFILL).tflops;
        let mma = predict_launch(m, &OUR_PREFILL, *blocks).tflops;
        s += &format!(
            "    the 16k causal Llama 3 8B prefill (32 q heads): {ours:.0} TFLOP/s, the mma.sync kernel {mma:.0} ({:.2}x)\n",
            ours / mma
        );
    }
    s
}

/// The range of errors on FA3's causal figures with its row blocks dispatched heaviest first.
fn heaviest_first_errors() -> String {
    let errors: Vec<f64> = fa3_kernels()
        .unwrap_or_default()
        .iter()
        .flat_map(|k| {
            k.published.iter().filter(|(w, _, _)| w.causal).map(|(w, p, _)| {
                let w = Workload { heaviest_first: true, ..*w };
                (k.model.predict(&w).tflops - p) / p
            })
        })
        .collect();
    let (lo, hi) = errors.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &e| (a.min(e), b.max(e)));
    if errors.is_empty() { "?".into() } else { format!("{:+.0}% to {:+.0}%", 100.0 * lo, 100.0 * hi) }
}

/// The wgmma calibration table and what the evidence cannot separate.
pub fn wgmma_calibration_text() -> String {
    let mut s = String::from(
        "  Calibration: FA3's counts (compiled here) against its published H100 SXM figures; * the figures a is\n\
         \x20 fitted on, the rest held out:\n",
    );
    match wgmma_calibration() {
        Ok(rows) => {
            s += &format!(
                "    {:<44} {:>6} {:>5} {:>5} {:>9} {:>9} {:>7}\n",
                "peer", "seq", "batch", "heads", "published", "predicted", "error"
            );
            for r in &rows {
                s += &format!(
                    "    {:<44} {:>6} {:>5} {:>5} {:>9.0} {:>9.0} {:>+6.1}%{}\n",
                    r.peer,
                    r.workload.seq,
                    r.workload.batch,
                    r.workload.heads,
                    r.published_tflops,
                    r.predicted_tflops,
                    100.0 * r.error,
                    if r.fitted { " *" } else { "" }
                );
            }
        }
        Err(e) => s += &format!("    cannot calibrate: {e}\n"),
    }
    s + "  What the evidence cannot separate: a is the net of the overlaps and of the chain's latencies (wgmma\n\
         \x20 drain, row reductions, barrier hand-offs) the counts leave out, and one figure per launch fixes only\n\
         \x20 the product of the clock and the loop's efficiency (a lower clock fits with a smaller a). The figures\n\
         \x20 were measured with the paper's FA3 code (2024), the counts are of FA3 at a later commit (other tiles\n\
         \x20 at hd128, an LPT scheduler for causal launches): the model assumes the same per-tile costs, and\n\
         \x20 dispatches FA3's causal row blocks in row order, which the calibration chose: heaviest first\n\
         \x20 would be off by "
        + &heaviest_first_errors()
        + " on the causal figures.\n\
         \x20 Left out: TMA and L2 traffic (K/V reread per row block, hidden at these shapes), the producer warp's\n\
         \x20 issue slots, clock variation within a run.\n\n"
}
