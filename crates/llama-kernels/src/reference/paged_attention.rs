//! Reference for the paged KV cache (the spec of kernels/paged_attention.cu): append, decode on a
//! materialized contiguous cache, and the merge of attention states. f64, plain loops.
//!
//! Pools are flat `[num_pages, page_size, kv_heads, head_dim]` values (what a kernel reads:
//! fp8 pages as their decoded codes times the scale), the block table `[batch, max_pages]`.
//! Decode gathers each sequence's keys into a contiguous cache first: key j of sequence b comes
//! from page `block_table[b][j / page_size]`, row `j % page_size`; a page id outside
//! `[0, num_pages)` contributes no key (its keys are skipped, as the kernels do). Sequence
//! lengths are clamped to `[0, max_pages * page_size]` (the kernels clamp and flag them).
//! Then, with the same rules as [`super::attention`]: query i of sequence b sits at position
//! `p = len - q_len + i` and attends keys `j <= p` (and `j >= floor(p / C) * C` with chunked
//! local attention), scores `scale * t(p) * <q, k>`; no allowed key gives zeros and `lse = -inf`.

use super::attention::{allowed, temperature};
use super::check_len;
use crate::dtype::{DType, f8e4m3_decode, f8e4m3_encode, round_to};
use crate::error::{Error, Result};
use crate::spec::attention::{AttentionMask, Llama4Temperature};

/// The page pools' geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    /// Pages in each pool.
    pub num_pages: usize,
    /// Tokens (rows) per page.
    pub page_size: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
}

impl PoolShape {
    /// Values in one pool: `num_pages * page_size * kv_heads * head_dim`.
    pub fn len(&self) -> usize {
        self.num_pages * self.page_size * self.kv_heads * self.head_dim
    }
    /// Whether a pool holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Flat index of (slot, head, dim), slot = page * page_size + row.
    pub fn index(&self, slot: usize, head: usize, dim: usize) -> usize {
        (slot * self.kv_heads + head) * self.head_dim + dim
    }
}

/// What the kernel stores for `x` in a page of `dtype` with `scale` (fp8 only): the value of the
/// stored element, unscaled (fp8: the decoded code of `f32(x) / f32(scale)`, the quotient rounded
/// to f32 first, as the kernel computes it).
pub fn stored_value(dtype: DType, x: f64, scale: f64) -> f64 {
    match dtype {
        DType::F8E4M3 => f8e4m3_decode(f8e4m3_encode(f64::from(x as f32 / scale as f32))),
        d => round_to(d, x),
    }
}

/// Appends `k`, `v` (`[tokens, kv_heads, head_dim]`) into `k_pages`, `v_pages` (stored values,
/// see [`stored_value`]) at `slots` (-1 skips; a slot outside the pool is skipped too).
/// `k_scale`, `v_scale`: one per KV head (fp8 pages).
#[allow(clippy::too_many_arguments)]
pub fn kv_append(
    k: &[f64],
    v: &[f64],
    slots: &[i64],
    pool: PoolShape,
    dtype: DType,
    k_scale: &[f64],
    v_scale: &[f64],
    k_pages: &mut [f64],
    v_pages: &mut [f64],
) -> Result<()> {
    let row = pool.kv_heads * pool.head_dim;
    check_len("k", k.len(), slots.len() * row)?;
    check_len("v", v.len(), slots.len() * row)?;
    check_len("k_pages", k_pages.len(), pool.len())?;
    check_len("v_pages", v_pages.len(), pool.len())?;
    check_len("k_scale", k_scale.len(), pool.kv_heads)?;
    check_len("v_scale", v_scale.len(), pool.kv_heads)?;
    for (t, &slot) in slots.iter().enumerate() {
        if slot < 0 || slot as usize >= pool.num_pages * pool.page_size {
            continue;
        }
        for h in 0..pool.kv_heads {
            for d in 0..pool.head_dim {
                let src = (t * pool.kv_heads + h) * pool.head_dim + d;
                let dst = pool.index(slot as usize, h, d);
                k_pages[dst] = stored_value(dtype, k[src], k_scale[h]);
                v_pages[dst] = stored_value(dtype, v[src], v_scale[h]);
            }
        }
    }
    Ok(())
}

/// Shapes and options of a reference decode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeSpec {
    /// Query heads (a multiple of the pool's KV heads).
    pub q_heads: usize,
    /// New tokens per sequence: the queries sit at its last `q_len` positions.
    pub q_len: usize,
    /// Softmax scale on `<q, k>`.
    pub scale: f64,
    /// Chunked local attention's chunk, or `None` for plain causal attention.
    pub chunk_size: Option<usize>,
    /// Llama 4 temperature tuning, or `None`.
    pub temperature: Option<Llama4Temperature>,
}

/// A materialized contiguous cache: `k`, `v` `[total_k, kv_heads, head_dim]`, the sequences'
/// offsets, and whether each key was readable (its page inside the pool).
#[derive(Clone, Debug, PartialEq)]
pub struct Gathered {
    /// Keys, `[total_k, kv_heads, head_dim]` (zeros where not readable).
    pub k: Vec<f64>,
    /// Values, like `k`.
    pub v: Vec<f64>,
    /// Offsets of each sequence's keys: `batch + 1` values from 0.
    pub cu_seqlens: Vec<usize>,
    /// Per key: whether its page lies inside the pool.
    pub readable: Vec<bool>,
}

/// Gathers every sequence's keys into a contiguous cache (lengths clamped to the table row).
pub fn gather(
    k_pages: &[f64],
    v_pages: &[f64],
    pool: PoolShape,
    block_table: &[i32],
    max_pages: usize,
    seq_lens: &[i32],
) -> Result<Gathered> {
    check_len("k_pages", k_pages.len(), pool.len())?;
    check_len("v_pages", v_pages.len(), pool.len())?;
    check_len("block_table", block_table.len(), seq_lens.len() * max_pages)?;
    if pool.page_size == 0 {
        return Err(Error::Reference { what: "gather", why: "page_size 0".into() });
    }
    let row = pool.kv_heads * pool.head_dim;
    let mut g = Gathered { k: Vec::new(), v: Vec::new(), cu_seqlens: vec![0], readable: Vec::new() };
    for (b, &len) in seq_lens.iter().enumerate() {
        let len = (len.max(0) as usize).min(max_pages * pool.page_size);
        for j in 0..len {
            let id = block_table[b * max_pages + j / pool.page_size];
            if id >= 0 && (id as usize) < pool.num_pages {
                let slot = id as usize * pool.page_size + j % pool.page_size;
                g.k.extend_from_slice(&k_pages[slot * row..(slot + 1) * row]);
                g.v.extend_from_slice(&v_pages[slot * row..(slot + 1) * row]);
                g.readable.push(true);
            } else {
                g.k.extend(std::iter::repeat_n(0.0, row));
                g.v.extend(std::iter::repeat_n(0.0, row));
                g.readable.push(false);
            }
        }
        g.cu_seqlens.push(g.cu_seqlens[b] + len);
    }
    Ok(g)
}

/// Decode attention: `q` `[batch * q_len, q_heads, head_dim]` against the paged cache. Returns
/// `(out [batch * q_len, q_heads, head_dim], lse [q_heads, batch * q_len])`.
#[allow(clippy::too_many_arguments)]
pub fn paged_decode(
    q: &[f64],
    k_pages: &[f64],
    v_pages: &[f64],
    pool: PoolShape,
    block_table: &[i32],
    max_pages: usize,
    seq_lens: &[i32],
    spec: &DecodeSpec,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let DecodeSpec { q_heads, q_len, scale, chunk_size, temperature: temp } = *spec;
    let (kv_heads, d) = (pool.kv_heads, pool.head_dim);
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        return Err(Error::Reference { what: "paged_decode", why: "inconsistent heads".into() });
    }
    let batch = seq_lens.len();
    let tokens = batch * q_len;
    check_len("q", q.len(), tokens * q_heads * d)?;
    let g = gather(k_pages, v_pages, pool, block_table, max_pages, seq_lens)?;
    let mask = chunk_size.map_or(AttentionMask::Causal, |c| AttentionMask::ChunkedCausal { chunk_size: c });
    let group = q_heads / kv_heads;
    let mut out = vec![0.0; tokens * q_heads * d];
    let mut lse = vec![f64::NEG_INFINITY; q_heads * tokens];
    for b in 0..batch {
        let (k0, len) = (g.cu_seqlens[b], (g.cu_seqlens[b + 1] - g.cu_seqlens[b]) as i64);
        for i in 0..q_len {
            let pos = len - q_len as i64 + i as i64;
            let token = b * q_len + i;
            let t = temp.map_or(1.0, |t| temperature(&t, pos));
            for h in 0..q_heads {
                let kh = h / group;
                let qv = &q[(token * q_heads + h) * d..(token * q_heads + h + 1) * d];
                let scores: Vec<(usize, f64)> = (0..len)
                    .filter(|&j| allowed(mask, pos, j, len) && g.readable[k0 + j as usize])
                    .map(|j| {
                        let kr = k0 + j as usize;
                        let kv = &g.k[(kr * kv_heads + kh) * d..(kr * kv_heads + kh + 1) * d];
                        (kr, scale * t * qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>())
                    })
                    .collect();
                if scores.is_empty() {
                    continue;
                }
                let mx = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let denom: f64 = scores.iter().map(|s| (s.1 - mx).exp()).sum();
                lse[h * tokens + token] = mx + denom.ln();
                let o = &mut out[(token * q_heads + h) * d..(token * q_heads + h + 1) * d];
                for &(kr, sc) in &scores {
                    let w = (sc - mx).exp() / denom;
                    let vv = &g.v[(kr * kv_heads + kh) * d..(kr * kv_heads + kh + 1) * d];
                    o.iter_mut().zip(vv).for_each(|(acc, x)| *acc += w * x);
                }
            }
        }
    }
    Ok((out, lse))
}

/// Merges two attention states: `v` `[tokens, heads, head_dim]`, `lse` `[heads, tokens]`.
/// Returns `(v, lse)`; a state with `lse = -inf` contributes nothing.
pub fn merge_states(
    v_a: &[f64],
    lse_a: &[f64],
    v_b: &[f64],
    lse_b: &[f64],
    tokens: usize,
    heads: usize,
    head_dim: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    check_len("v_a", v_a.len(), tokens * heads * head_dim)?;
    check_len("v_b", v_b.len(), tokens * heads * head_dim)?;
    check_len("lse_a", lse_a.len(), tokens * heads)?;
    check_len("lse_b", lse_b.len(), tokens * heads)?;
    let mut v = vec![0.0; v_a.len()];
    let mut lse = vec![f64::NEG_INFINITY; tokens * heads];
    for t in 0..tokens {
        for h in 0..heads {
            let (la, lb) = (lse_a[h * tokens + t], lse_b[h * tokens + t]);
            let mx = la.max(lb);
            if mx == f64::NEG_INFINITY {
                continue;
            }
            let (wa, wb) = ((la - mx).exp(), (lb - mx).exp());
            let sum = wa + wb;
            lse[h * tokens + t] = mx + sum.ln();
            for x in 0..head_dim {
                let i = (t * heads + h) * head_dim + x;
                let a = if wa == 0.0 { 0.0 } else { wa * v_a[i] };
                let b = if wb == 0.0 { 0.0 } else { wb * v_b[i] };
                v[i] = (a + b) / sum;
            }
        }
    }
    Ok((v, lse))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::attention::{AttentionSpec, attention};

    /// Decode over pages is attention over the materialized contiguous cache (every page valid):
    /// the two references, written independently, agree.
    #[test]
    fn paged_decode_is_attention_on_the_gathered_cache() {
        let pool = PoolShape { num_pages: 7, page_size: 4, kv_heads: 2, head_dim: 3 };
        let val = |i: usize, salt: f64| (i as f64 * 0.37 + salt).sin() * 1.5;
        let k: Vec<f64> = (0..pool.len()).map(|i| val(i, 0.1)).collect();
        let v: Vec<f64> = (0..pool.len()).map(|i| val(i, 0.7)).collect();
        let (q_heads, q_len) = (4, 2);
        let lens = [9i32, 1, 0, 5];
        // 3 pages per row; pages shared between rows are fine for the reference.
        let max_pages = 3;
        let t = [3, 0, 6, 1, 2, 5, 4, 0, 1, 5, 2, 0];
        let q: Vec<f64> = (0..lens.len() * q_len * q_heads * 3).map(|i| val(i, 1.3)).collect();
        let spec = DecodeSpec { q_heads, q_len, scale: 0.6, chunk_size: Some(3), temperature: None };
        let (out, lse) = paged_decode(&q, &k, &v, pool, &t, max_pages, &lens, &spec).unwrap();
        let g = gather(&k, &v, pool, &t, max_pages, &lens).unwrap();
        let cu_k: Vec<i32> = g.cu_seqlens.iter().map(|&x| x as i32).collect();
        let cu_q: Vec<i32> = (0..=lens.len()).map(|b| (b * q_len) as i32).collect();
        let aspec = AttentionSpec {
            q_heads,
            kv_heads: 2,
            head_dim: 3,
            mask: AttentionMask::ChunkedCausal { chunk_size: 3 },
            scale: 0.6,
            temperature: None,
        };
        let (out2, lse2) = attention(&q, &g.k, &g.v, &cu_q, &cu_k, &aspec).unwrap();
        for (a, b) in out.iter().zip(&out2).chain(lse.iter().zip(&lse2)) {
            assert!(a == b || (a - b).abs() < 1e-12, "{a} vs {b}");
        }
        assert!(g.readable.iter().all(|&r| r));
    }
}
