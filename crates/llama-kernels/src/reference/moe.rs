//! Reference mixture-of-experts feed-forward (the spec of kernels/moe.cu), in f64, one stage at
//! a time: routing, alignment (the permutation), gather, expert matmuls with SwiGLU, combine, and
//! the whole layer. Plain loops over tokens, experts and columns.
//!
//! Routing ranks experts by a key: a larger key ranks higher, equal keys rank by the lower expert
//! index, and NaN ranks below every number (so a NaN expert is chosen only when fewer than k
//! others exist; a row of all-NaN logits chooses experts 0..k-1 with NaN weights). Modes:
//!
//! * Llama 4: key = logit; weight = sigmoid(logit).
//! * Softmax: key = logit; weight = exp(l - m) / sum over the non-NaN logits of exp(l' - m), m
//!   their maximum (NaN logits count as probability 0; a chosen NaN expert weighs NaN);
//!   renormalized over the k chosen when asked.
//! * Grouped (DeepSeek-V3): s = sigmoid(logit), key = s + bias; a group's score is the sum of its
//!   two best keys; the `topk_group` best groups stay (ties to the lower group); top-k over their
//!   experts; weight = s, divided by (sum of the k + 1e-20) when renormalizing, times the routed
//!   scaling factor.
//!
//! Alignment: expert e's rows are the slots `s = token * k + j` with `ids[s] == e`, in increasing
//! s, placed from `offsets[e]`, where `offsets` is the exclusive prefix sum of the counts rounded up
//! to `block_m`. Block b (rows `b * block_m ..`) below the padded total belongs to the expert whose
//! segment holds its first row.

use super::check_len;
use super::swiglu::silu;
use crate::error::{Error, Result};
pub use crate::spec::moe::MoeFfnConfig;
use crate::spec::moe::{MoeRouting, WeightLayout};

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Whether `(a, ia)` ranks above `(b, ib)` (larger first, NaN last, ties to the lower index).
pub fn ranks_above(a: f64, ia: usize, b: f64, ib: usize) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (false, true) => true,
        (true, false) => false,
        (false, false) if a != b => a > b,
        _ => ia < ib,
    }
}

/// The indices of `keys` (restricted to `allowed`) in rank order, best first.
fn ranked(keys: &[f64], allowed: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..keys.len()).filter(|&i| allowed(i)).collect();
    idx.sort_by(|&a, &b| {
        if ranks_above(keys[a], a, keys[b], b) {
            std::cmp::Ordering::Less
        } else if a == b {
            std::cmp::Ordering::Equal
        } else {
            std::cmp::Ordering::Greater
        }
    });
    idx
}

/// The key each expert of one token's `row` is ranked by: the logit, or (grouped)
/// `sigmoid(logit) + bias`.
pub fn routing_keys(row: &[f64], routing: MoeRouting, bias: Option<&[f64]>) -> Vec<f64> {
    match routing {
        MoeRouting::Grouped { .. } => {
            row.iter().enumerate().map(|(e, &l)| sigmoid(l) + bias.map_or(0.0, |b| b[e])).collect()
        }
        _ => row.to_vec(),
    }
}

/// The weights of the experts `chosen` (in slot order) for one token's `row`.
pub fn route_weights(row: &[f64], chosen: &[usize], routing: MoeRouting) -> Vec<f64> {
    match routing {
        MoeRouting::Llama4 => chosen.iter().map(|&e| sigmoid(row[e])).collect(),
        MoeRouting::Softmax { renormalize } => {
            let m = if row.iter().all(|v| v.is_nan()) {
                f64::NAN
            } else {
                row.iter().filter(|v| !v.is_nan()).fold(f64::NEG_INFINITY, |a, &b| a.max(b))
            };
            let denom: f64 = row.iter().filter(|v| !v.is_nan()).map(|&l| (l - m).exp()).sum();
            let mut w: Vec<f64> = chosen.iter().map(|&e| (row[e] - m).exp() / denom).collect();
            if renormalize {
                let total: f64 = w.iter().sum();
                w.iter_mut().for_each(|x| *x /= total);
            }
            w
        }
        MoeRouting::Grouped { renormalize, routed_scaling_factor, .. } => {
            let mut w: Vec<f64> = chosen.iter().map(|&e| sigmoid(row[e])).collect();
            if renormalize {
                let total: f64 = w.iter().sum::<f64>() + 1e-20;
                w.iter_mut().for_each(|x| *x /= total);
            }
            w.into_iter().map(|x| x * f64::from(routed_scaling_factor)).collect()
        }
    }
}

/// The experts one token chooses, best first.
pub fn select(row: &[f64], top_k: usize, routing: MoeRouting, bias: Option<&[f64]>) -> Result<Vec<usize>> {
    let experts = row.len();
    let key = routing_keys(row, routing, bias);
    match routing {
        MoeRouting::Grouped { n_group, topk_group, .. } => {
            if n_group == 0 || experts % n_group != 0 || experts / n_group < 2 {
                return Err(Error::Reference { what: "n_group", why: format!("{n_group} for {experts} experts") });
            }
            let size = experts / n_group;
            let group_scores: Vec<f64> = (0..n_group)
                .map(|g| {
                    let members = &key[g * size..(g + 1) * size];
                    let top = ranked(members, |_| true);
                    members[top[0]] + members[top[1]]
                })
                .collect();
            let kept: Vec<usize> = ranked(&group_scores, |_| true).into_iter().take(topk_group).collect();
            Ok(ranked(&key, |e| kept.contains(&(e / size))).into_iter().take(top_k).collect())
        }
        _ => Ok(ranked(&key, |_| true).into_iter().take(top_k).collect()),
    }
}

/// Routes every token: `(ids, weights)`, each `[tokens, top_k]`, best first. `bias` is the
/// grouped mode's selection bias (`[experts]`, or none).
pub fn route(
    logits: &[f64],
    tokens: usize,
    experts: usize,
    top_k: usize,
    routing: MoeRouting,
    bias: Option<&[f64]>,
) -> Result<(Vec<i32>, Vec<f64>)> {
    check_len("logits", logits.len(), tokens * experts)?;
    if let Some(b) = bias {
        check_len("bias", b.len(), experts)?;
    }
    if top_k > experts {
        return Err(Error::Reference { what: "top_k", why: format!("{top_k} > {experts} experts") });
    }
    let mut ids = Vec::with_capacity(tokens * top_k);
    let mut weights = Vec::with_capacity(tokens * top_k);
    for t in 0..tokens {
        let row = &logits[t * experts..(t + 1) * experts];
        let chosen = select(row, top_k, routing, bias)?;
        weights.extend(route_weights(row, &chosen, routing));
        ids.extend(chosen.iter().map(|&e| e as i32));
    }
    Ok((ids, weights))
}

/// The reference routing, except that where two candidates' keys (or two groups' scores) differ
/// by at most `rel_tol` relative, but are not equal, the one `other` (a device's routing) chose
/// is taken: f32 keys can order such pairs either way, while exact ties must still go to the
/// lower index. Comparing `other` with the result then checks it exactly up to such near-ties.
/// Returns `(ids, weights)` like [`route`].
pub fn route_allowing_near_ties(
    logits: &[f64],
    experts: usize,
    top_k: usize,
    routing: MoeRouting,
    bias: Option<&[f64]>,
    other: &[i32],
    rel_tol: f64,
) -> Result<(Vec<i32>, Vec<f64>)> {
    let tokens = logits.len() / experts.max(1);
    check_len("logits", logits.len(), tokens * experts)?;
    check_len("other ids", other.len(), tokens * top_k)?;
    let near = |a: f64, b: f64| a != b && (a - b).abs() <= rel_tol * a.abs().max(b.abs()).max(1.0);
    // Picks `count` of `keys` (restricted to `allowed`) best first, preferring `preferred(j, i)`
    // among near-ties with the best at step j.
    let pick =
        |keys: &[f64], count: usize, allowed: &dyn Fn(usize) -> bool, preferred: &dyn Fn(usize, usize) -> bool| {
            let mut taken: Vec<usize> = Vec::with_capacity(count);
            for j in 0..count {
                let left = ranked(keys, |i| allowed(i) && !taken.contains(&i));
                let Some(&best) = left.first() else { break };
                let choice = if preferred(j, best) {
                    best
                } else {
                    left.iter().copied().find(|&i| preferred(j, i) && near(keys[i], keys[best])).unwrap_or(best)
                };
                taken.push(choice);
            }
            taken
        };
    let mut ids = Vec::with_capacity(tokens * top_k);
    let mut weights = Vec::with_capacity(tokens * top_k);
    for t in 0..tokens {
        let row = &logits[t * experts..(t + 1) * experts];
        let theirs: Vec<i64> = other[t * top_k..(t + 1) * top_k].iter().map(|&e| i64::from(e)).collect();
        let key = routing_keys(row, routing, bias);
        let allowed_groups: Box<dyn Fn(usize) -> bool> = match routing {
            MoeRouting::Grouped { n_group, topk_group, .. } => {
                if n_group == 0 || experts % n_group != 0 || experts / n_group < 2 {
                    return Err(Error::Reference { what: "n_group", why: format!("{n_group} for {experts} experts") });
                }
                let size = experts / n_group;
                let scores: Vec<f64> = (0..n_group)
                    .map(|g| {
                        let members = &key[g * size..(g + 1) * size];
                        let top = ranked(members, |_| true);
                        members[top[0]] + members[top[1]]
                    })
                    .collect();
                let theirs_groups: Vec<i64> = theirs.iter().map(|&e| e.div_euclid(size as i64)).collect();
                let kept = pick(&scores, topk_group, &|_| true, &|_, g| theirs_groups.contains(&(g as i64)));
                Box::new(move |e| kept.contains(&(e / size)))
            }
            _ => Box::new(|_| true),
        };
        let chosen = pick(&key, top_k, &*allowed_groups, &|j, e| theirs[j] == e as i64);
        weights.extend(route_weights(row, &chosen, routing));
        ids.extend(chosen.iter().map(|&e| e as i32));
    }
    Ok((ids, weights))
}

/// The permutation: per-expert counts, padded segment starts (`experts + 1` values, the last the
/// padded total), the row of every slot (-1 for an id outside `[0, experts)`), and the expert of
/// every `block_m`-row block below the padded total.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alignment {
    /// Slots per expert, `[experts]`.
    pub counts: Vec<i32>,
    /// Padded segment starts, `experts + 1` values: the last is the padded total.
    pub offsets: Vec<i32>,
    /// Per slot `token * k + j`: its row in the expert-contiguous buffer, or -1.
    pub rows: Vec<i32>,
    /// The expert of each `block_m`-row block below the padded total.
    pub block_expert: Vec<i32>,
    /// Rows per block: every expert's segment is padded to a multiple of it.
    pub block_m: usize,
}

impl Alignment {
    /// The padded total (rows of the expert-contiguous buffer in use).
    pub fn total(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0) as usize
    }
    /// The expert of every row below the padded total: `Some(e)` for a row holding a slot,
    /// `None` for padding.
    pub fn row_experts(&self) -> Vec<Option<usize>> {
        let mut v = vec![None; self.total()];
        for e in 0..self.counts.len() {
            for r in 0..self.counts[e] as usize {
                v[self.offsets[e] as usize + r] = Some(e);
            }
        }
        v
    }
}

/// The permutation of `ids` (one expert id per slot) over `experts`, segments padded to `block_m` rows.
pub fn align(ids: &[i32], experts: usize, block_m: usize) -> Alignment {
    let mut counts = vec![0i32; experts];
    for &id in ids {
        if id >= 0 && (id as usize) < experts {
            counts[id as usize] += 1;
        }
    }
    let mut offsets = vec![0i32; experts + 1];
    for e in 0..experts {
        offsets[e + 1] = offsets[e] + (counts[e] as usize).div_ceil(block_m.max(1)) as i32 * block_m as i32;
    }
    let mut next: Vec<i32> = offsets[..experts].to_vec();
    let rows = ids
        .iter()
        .map(|&id| {
            if id >= 0 && (id as usize) < experts {
                next[id as usize] += 1;
                next[id as usize] - 1
            } else {
                -1
            }
        })
        .collect();
    let total = offsets[experts] as usize;
    let block_expert = (0..total / block_m.max(1))
        .map(|b| {
            let row = (b * block_m) as i32;
            (0..experts).find(|&e| offsets[e] <= row && row < offsets[e + 1]).map_or(-1, |e| e as i32)
        })
        .collect();
    Alignment { counts, offsets, rows, block_expert, block_m }
}

/// The gathered rows `[total, hidden]`: row `rows[s]` is token `s / top_k`'s row of `x`, times
/// `weights[s]` when given. Padding rows are NaN (the kernels leave them unwritten).
pub fn gather(x: &[f64], hidden: usize, top_k: usize, a: &Alignment, weights: Option<&[f64]>) -> Result<Vec<f64>> {
    let slots = a.rows.len();
    check_len("x", x.len(), (slots / top_k.max(1)) * hidden)?;
    let mut out = vec![f64::NAN; a.total() * hidden];
    for s in 0..slots {
        let Ok(r) = usize::try_from(a.rows[s]) else { continue };
        let t = s / top_k;
        let w = weights.map_or(1.0, |w| w[s]);
        for c in 0..hidden {
            out[r * hidden + c] = x[t * hidden + c] * w;
        }
    }
    Ok(out)
}

/// Stacked expert weights, contiguous: `[experts, k, n]` ([`WeightLayout::InOut`]: `y = x W[e]`)
/// or `[experts, n, k]` ([`WeightLayout::OutIn`], `nn.Linear`: `y = x W[e]^T`).
#[derive(Clone, Copy, Debug)]
pub struct ExpertMatrix<'a> {
    /// The values, contiguous, in `layout`.
    pub data: &'a [f64],
    /// Whether each expert's matrix is `[k, n]` or `[n, k]`.
    pub layout: WeightLayout,
    /// Experts stacked.
    pub experts: usize,
    /// Inputs per expert (the contracted dimension).
    pub k: usize,
    /// Outputs per expert.
    pub n: usize,
}

impl ExpertMatrix<'_> {
    /// `W[e]` at (input `k`, output column `n`).
    pub fn at(&self, e: usize, k: usize, n: usize) -> f64 {
        match self.layout {
            WeightLayout::InOut => self.data[(e * self.k + k) * self.n + n],
            WeightLayout::OutIn => self.data[(e * self.n + n) * self.k + k],
        }
    }
    fn check(&self) -> Result<()> {
        check_len("expert weights", self.data.len(), self.experts * self.k * self.n)
    }
}

/// `y[r][c] = sum_k x[r][k] W[e(r)][k][cols.start + c]` for rows with an expert; rows without one
/// (padding) are NaN.
pub fn expert_matmul(
    x: &[f64],
    row_experts: &[Option<usize>],
    w: &ExpertMatrix<'_>,
    cols: std::ops::Range<usize>,
) -> Result<Vec<f64>> {
    w.check()?;
    check_len("x", x.len(), row_experts.len() * w.k)?;
    let width = cols.len();
    let mut y = vec![f64::NAN; row_experts.len() * width];
    for (r, e) in row_experts.iter().enumerate() {
        let Some(e) = *e else { continue };
        if e >= w.experts {
            return Err(Error::Reference { what: "expert", why: format!("{e} >= {}", w.experts) });
        }
        for c in 0..width {
            y[r * width + c] = (0..w.k).map(|k| x[r * w.k + k] * w.at(e, k, cols.start + c)).sum();
        }
    }
    Ok(y)
}

/// `silu(x W_gate) * (x W_up)` per row, where gate and up are column ranges of expert matrices.
pub fn expert_swiglu(
    x: &[f64],
    row_experts: &[Option<usize>],
    gate: (&ExpertMatrix<'_>, std::ops::Range<usize>),
    up: (&ExpertMatrix<'_>, std::ops::Range<usize>),
) -> Result<Vec<f64>> {
    let g = expert_matmul(x, row_experts, gate.0, gate.1)?;
    let u = expert_matmul(x, row_experts, up.0, up.1)?;
    Ok(g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect())
}

/// `out[t] = sum_j w_tj y[rows[t k + j]] (+ shared[t]) (+ residual[t])`; `weights` None sums
/// the rows unweighted (Llama 4, whose weights scaled the expert input). Slots with row -1 add
/// nothing.
pub fn combine(
    y: &[f64],
    hidden: usize,
    rows: &[i32],
    top_k: usize,
    weights: Option<&[f64]>,
    shared: Option<&[f64]>,
    residual: Option<&[f64]>,
) -> Result<Vec<f64>> {
    let tokens = rows.len() / top_k.max(1);
    for v in [shared, residual].into_iter().flatten() {
        check_len("shared/residual", v.len(), tokens * hidden)?;
    }
    let mut out = vec![0.0; tokens * hidden];
    for t in 0..tokens {
        for c in 0..hidden {
            let mut acc = 0.0;
            for j in 0..top_k {
                let Ok(r) = usize::try_from(rows[t * top_k + j]) else { continue };
                acc += weights.map_or(1.0, |w| w[t * top_k + j]) * y[r * hidden + c];
            }
            acc += shared.map_or(0.0, |s| s[t * hidden + c]);
            acc += residual.map_or(0.0, |s| s[t * hidden + c]);
            out[t * hidden + c] = acc;
        }
    }
    Ok(out)
}

/// The weights of a reference MoE layer (all contiguous f64).
#[derive(Clone, Copy, Debug)]
pub struct FfnWeights<'a> {
    /// `[experts, hidden]` (`nn.Linear`).
    pub router: &'a [f64],
    /// `[experts]` selection bias (grouped routing), or none.
    pub router_bias: Option<&'a [f64]>,
    /// Gate and up: one matrix with `2 intermediate` outputs (gate first), or two with
    /// `intermediate` each.
    pub gate: ExpertMatrix<'a>,
    /// The up projection when it is separate (`None`: `gate` holds gate and up).
    pub up: Option<ExpertMatrix<'a>>,
    /// The down projection: `intermediate` inputs, `hidden` outputs.
    pub down: ExpertMatrix<'a>,
    /// Shared expert `(gate [i, hidden], up [i, hidden], down [hidden, i])`, `nn.Linear` layout.
    pub shared: Option<(&'a [f64], &'a [f64], &'a [f64])>,
}

/// What a reference layer computes: every stage.
#[derive(Clone, Debug)]
pub struct FfnStages {
    /// Router logits, `[tokens, experts]`.
    pub logits: Vec<f64>,
    /// Chosen experts, `[tokens, top_k]`, best first.
    pub ids: Vec<i32>,
    /// Their routing weights, `[tokens, top_k]`.
    pub weights: Vec<f64>,
    /// The shared expert's output, `[tokens, hidden]`, when there is one.
    pub shared: Option<Vec<f64>>,
    /// The layer's output, `[tokens, hidden]` (the residual added when given).
    pub out: Vec<f64>,
}

/// Dense `x W^T` for an `nn.Linear` weight `[n, k]`.
fn linear(x: &[f64], rows: usize, w: &[f64], n: usize, k: usize) -> Vec<f64> {
    let mut y = vec![0.0; rows * n];
    for r in 0..rows {
        for c in 0..n {
            y[r * n + c] = (0..k).map(|i| x[r * k + i] * w[c * k + i]).sum();
        }
    }
    y
}

/// The whole layer. `logits` overrides the router (the stages after it then route those logits:
/// a device's router output, rounded to its storage type, makes the comparison of the later
/// stages independent of near-ties the rounding may flip); `ids` is another routing of those
/// logits to follow where it differs from this one only by near-ties.
pub fn moe_ffn(
    x: &[f64],
    tokens: usize,
    spec: &MoeFfnConfig,
    w: &FfnWeights<'_>,
    residual: Option<&[f64]>,
    logits: Option<&[f64]>,
    ids: Option<&[i32]>,
) -> Result<FfnStages> {
    let MoeFfnConfig { hidden, intermediate, experts, top_k, routing, weights_on_input } = *spec;
    check_len("x", x.len(), tokens * hidden)?;
    check_len("router", w.router.len(), experts * hidden)?;
    let logits = match logits {
        Some(l) => l.to_vec(),
        None => linear(x, tokens, w.router, experts, hidden),
    };
    let (ids, weights) = match ids {
        // Another routing, near-ties allowed (see route_allowing_near_ties).
        Some(other) => route_allowing_near_ties(&logits, experts, top_k, routing, w.router_bias, other, 1e-6)?,
        None => route(&logits, tokens, experts, top_k, routing, w.router_bias)?,
    };
    let a = align(&ids, experts, 1);
    let xp = gather(x, hidden, top_k, &a, weights_on_input.then_some(&weights[..]))?;
    let row_experts = a.row_experts();
    let i = intermediate;
    let h = match &w.up {
        None => expert_swiglu(&xp, &row_experts, (&w.gate, 0..i), (&w.gate, i..2 * i))?,
        Some(up) => expert_swiglu(&xp, &row_experts, (&w.gate, 0..i), (up, 0..i))?,
    };
    let y = expert_matmul(&h, &row_experts, &w.down, 0..hidden)?;
    let shared = match w.shared {
        Some((g, u, d)) => {
            let si = g.len() / hidden;
            let gv = linear(x, tokens, g, si, hidden);
            let uv = linear(x, tokens, u, si, hidden);
            let hv: Vec<f64> = gv.iter().zip(&uv).map(|(&g, &u)| silu(g) * u).collect();
            Some(linear(&hv, tokens, d, hidden, si))
        }
        None => None,
    };
    let out =
        combine(&y, hidden, &a.rows, top_k, (!weights_on_input).then_some(&weights[..]), shared.as_deref(), residual)?;
    Ok(FfnStages { logits, ids, weights, shared, out })
}
