//! Reference token sampling (the spec of kernels/sampling.cu), in f64.
//!
//! For one row of logits `x` (already rounded to the storage dtype) and a [`SamplingConfig`]:
//!
//! 1. NaN counts as `-inf` (and `-0` as `+0`). A row with nothing above `-inf` has no candidate.
//! 2. `temperature == 0`: the argmax, ties to the lowest index. Otherwise the scores are
//!    `s = x / temperature` and the relative weights `w = exp(s - max s)` (`w = 1` for the
//!    largest, also when it is `+inf`; then every finite score has weight 0). The sorted order is
//!    `s` descending, ties by lower index first; every filter below keeps a prefix of it.
//! 3. top-k (`0 < k < vocab`, Hugging Face `TopKLogitsWarper`): keep `s >=` the k-th largest
//!    score, so ties at the boundary are kept.
//! 4. top-p (`top_p < 1`, `TopPLogitsWarper`): on the distribution of what top-k kept (mass
//!    `Z_k`), keep the tokens of the sorted order whose preceding mass is `< top_p * Z_k`: the
//!    smallest prefix whose mass reaches `top_p`, at least one token. A tie group at the
//!    boundary is cut in index order (Hugging Face leaves that order to `torch.sort`).
//! 5. min-p (`min_p > 0`, `MinPLogitsWarper`, after the filters above): drop `prob < min_p *
//!    max prob`, that is `w < min_p` (the largest always stays).
//! 6. Draw from the renormalized weights of what is left, by inverse CDF in index order: with
//!    `u = r / 2^64` for the 64-bit word `r` of [`random_word`]`(seed, offset)`, the token is the
//!    first index whose inclusive cumulative probability exceeds `u`.

use crate::spec::sampling::SamplingConfig;

/// What one row's sampling comes to.
#[derive(Clone, Debug, PartialEq)]
pub enum Filtered {
    /// Greedy: this token.
    Argmax(usize),
    /// The probability of every token after the filters (0 for removed ones; the sum is 1).
    Distribution(Vec<f64>),
    /// A parameter outside its domain ([`SamplingConfig::is_valid`]): token -1.
    BadParams,
    /// Every logit is `-inf` or NaN: token -1.
    NoCandidate,
}

/// Philox-4x32-10 (Salmon et al., SC'11; Random123's `philox4x32`, 10 rounds).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(0x9E37_79B9);
            k[1] = k[1].wrapping_add(0xBB67_AE85);
        }
        let p0 = M0 * u64::from(c[0]);
        let p1 = M1 * u64::from(c[2]);
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

/// The 64-bit random word of a draw: `(v1 << 32) | v0` of Philox-4x32-10 at counter
/// `{offset lo, offset hi, 0, 0}` with key `{seed lo, seed hi}`.
pub fn random_word(seed: u64, offset: u64) -> u64 {
    let v = philox4x32_10([offset as u32, (offset >> 32) as u32, 0, 0], [seed as u32, (seed >> 32) as u32]);
    (u64::from(v[1]) << 32) | u64::from(v[0])
}

/// NaN as -inf, -0 as +0.
fn clean(x: f64) -> f64 {
    if x.is_nan() {
        f64::NEG_INFINITY
    } else if x == 0.0 {
        0.0
    } else {
        x
    }
}

/// Indices in the sorted order: value descending, ties by lower index first.
pub fn sorted_order(row: &[f64]) -> Vec<usize> {
    let x: Vec<f64> = row.iter().map(|&v| clean(v)).collect();
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    idx
}

/// Steps 1-5: what the row samples from.
pub fn filter(row: &[f64], cfg: &SamplingConfig) -> Filtered {
    if !cfg.is_valid() {
        return Filtered::BadParams;
    }
    let x: Vec<f64> = row.iter().map(|&v| clean(v)).collect();
    let order = sorted_order(&x);
    let Some(&first) = order.first() else { return Filtered::NoCandidate };
    let m = x[first];
    if m == f64::NEG_INFINITY {
        return Filtered::NoCandidate;
    }
    if cfg.temperature == 0.0 {
        return Filtered::Argmax(first);
    }
    let t = f64::from(cfg.temperature);
    let w: Vec<f64> = x.iter().map(|&v| if v >= m { 1.0 } else { ((v - m) / t).exp() }).collect();
    let n = x.len();
    let mut keep = vec![true; n];
    // top-k: ties at the k-th score kept.
    let k = cfg.top_k as usize;
    if k > 0 && k < n {
        let kth = x[order[k - 1]];
        for i in 0..n {
            keep[i] = x[i] >= kth;
        }
    }
    // top-p on what top-k kept: the preceding mass must be < top_p * Z_k.
    if cfg.top_p < 1.0 {
        let zk: f64 = (0..n).filter(|&i| keep[i]).map(|i| w[i]).sum();
        let bound = f64::from(cfg.top_p) * zk;
        let mut before = 0.0;
        for (rank, &i) in order.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            if rank > 0 && before >= bound {
                keep[i] = false;
            }
            before += w[i];
        }
    }
    // min-p, relative to the largest weight (1).
    if cfg.min_p > 0.0 {
        for i in 0..n {
            keep[i] &= w[i] >= f64::from(cfg.min_p);
        }
    }
    let z: f64 = (0..n).filter(|&i| keep[i]).map(|i| w[i]).sum();
    Filtered::Distribution((0..n).map(|i| if keep[i] { w[i] / z } else { 0.0 }).collect())
}

/// Step 6: the first index whose inclusive cumulative probability exceeds `u` (in `[0, 1)`); the
/// last token of positive probability if rounding leaves `u` above the total.
pub fn draw(probs: &[f64], u: f64) -> usize {
    let mut cum = 0.0;
    let mut last = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            cum += p;
            last = i;
            if cum > u {
                return i;
            }
        }
    }
    last
}

/// The whole op for one row: the token id, or -1 (bad parameters, no candidate).
pub fn sample(row: &[f64], cfg: &SamplingConfig, seed: u64, offset: u64) -> i32 {
    match filter(row, cfg) {
        Filtered::Argmax(i) => i as i32,
        Filtered::Distribution(p) => draw(&p, random_word(seed, offset) as f64 / 2f64.powi(64)) as i32,
        Filtered::BadParams | Filtered::NoCandidate => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known-answer vectors (kat_vectors, `philox4x32 10`).
    #[test]
    fn philox_known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn filters_follow_hugging_face() {
        let cfg = |temperature, top_k, top_p, min_p| SamplingConfig { temperature, top_k, top_p, min_p };
        let row = [1.0, 3.0, 3.0, 2.0, f64::NAN, -1.0];
        assert_eq!(filter(&row, &SamplingConfig::GREEDY), Filtered::Argmax(1));
        assert_eq!(sorted_order(&row), vec![1, 2, 3, 0, 5, 4]);
        // top-k 2 keeps both 3.0s; top-k 3 also the 2.0.
        let Filtered::Distribution(p) = filter(&row, &cfg(1.0, 2, 1.0, 0.0)) else { panic!() };
        assert_eq!(p.iter().map(|&v| v > 0.0).collect::<Vec<_>>(), [false, true, true, false, false, false]);
        // top-p 0 keeps only the first of the sorted order (the tie cut in index order).
        let Filtered::Distribution(p) = filter(&row, &cfg(1.0, 0, 0.0, 0.0)) else { panic!() };
        assert_eq!(p, [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        // min-p 0.5: w = exp(-1) < 0.5 for the 2.0.
        let Filtered::Distribution(p) = filter(&row, &cfg(1.0, 0, 1.0, 0.5)) else { panic!() };
        assert_eq!(p, [0.0, 0.5, 0.5, 0.0, 0.0, 0.0]);
        assert_eq!(filter(&[f64::NAN, f64::NEG_INFINITY], &cfg(1.0, 0, 1.0, 0.0)), Filtered::NoCandidate);
        assert_eq!(filter(&row, &cfg(-1.0, 0, 1.0, 0.0)), Filtered::BadParams);
        // +inf logits share the mass.
        let Filtered::Distribution(p) = filter(&[f64::INFINITY, 0.0, f64::INFINITY], &cfg(1.0, 0, 1.0, 0.0)) else {
            panic!()
        };
        assert_eq!(p, [0.5, 0.0, 0.5]);
    }
}
