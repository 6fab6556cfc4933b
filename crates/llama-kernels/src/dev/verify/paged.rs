//! `verify` cases of the paged KV cache: `kv_append` and `paged_decode` (rows with `fp8` in the
//! name for fp8 pages). Each case builds a scrambled page pool, appends through the kernel, runs
//! the op and compares with the f64 reference (decode on the materialized contiguous cache).

use std::time::Instant;

use super::attention::{LSE_TOLERANCE, attention_tolerance};
use super::common::{CaseResult, worst_of};
use crate::backend::Device;
use crate::dev::testing::{Comparison, Rng, Tolerance, compare};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::attention::{
    DecodeArgs, DecodeShape, ErrorFlag, KvAppendArgs, KvScale, KvScales, PagedDecodeOptions, PagedDecodeWorkspace,
    PagedKvView, kv_append_on,
};
use crate::reference::paged_attention::{self as refp, DecodeSpec, PoolShape};
use crate::tensor::{Tensor, TensorViewMut};

/// K and V pools on the device: two tensors, or two views of one `[num_pages, 2, page_size,
/// kv_heads, head_dim]` buffer (FlashInfer's layout: K and V of a page side by side).
struct Pools {
    k: Tensor,
    v: Tensor,
}

fn make_pools(
    device: &Device,
    dtype: DType,
    pool: PoolShape,
    interleaved: bool,
    k: &[f64],
    v: &[f64],
) -> Result<Pools> {
    let shape = [pool.num_pages, pool.page_size, pool.kv_heads, pool.head_dim];
    if !interleaved {
        return Ok(Pools {
            k: Tensor::from_f64(device, dtype, k, &shape)?,
            v: Tensor::from_f64(device, dtype, v, &shape)?,
        });
    }
    let page = pool.page_size * pool.kv_heads * pool.head_dim;
    let buf = Tensor::zeros(device, dtype, &[pool.num_pages.max(1) * 2 * page])?;
    let strides = [2 * page, pool.kv_heads * pool.head_dim, pool.head_dim, 1];
    let (kt, vt) = (buf.as_strided(&shape, &strides, 0)?, buf.as_strided(&shape, &strides, page)?);
    kt.copy_from_f64(k)?;
    vt.copy_from_f64(v)?;
    Ok(Pools { k: kt, v: vt })
}

fn scale_values(s: &KvScale, kv_heads: usize) -> Vec<f64> {
    match s {
        KvScale::None => vec![1.0; kv_heads],
        KvScale::PerTensor(x) => vec![f64::from(*x); kv_heads],
        KvScale::PerHead(v) => v.iter().map(|&x| f64::from(x)).collect(),
    }
}

/// Random values a pool of `dtype` stores (fp8: codes of N(0, 1) values over the head's scale).
fn pool_values(rng: &mut Rng, dtype: DType, pool: PoolShape, scales: &[f64]) -> Vec<f64> {
    (0..pool.len())
        .map(|i| {
            let h = (i / pool.head_dim) % pool.kv_heads;
            refp::stored_value(dtype, rng.normal(), scales[h])
        })
        .collect()
}

/// Scaled values (what attention reads): stored value times the head's scale.
fn scaled(values: &[f64], pool: PoolShape, scales: &[f64]) -> Vec<f64> {
    values.iter().enumerate().map(|(i, &x)| x * scales[(i / pool.head_dim) % pool.kv_heads]).collect()
}

fn shuffle(rng: &mut Rng, v: &mut [i32]) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

fn fp8_suffix(page_dtype: DType) -> &'static str {
    if page_dtype == DType::F8E4M3 { " fp8" } else { "" }
}

fn scales_name(s: &KvScales) -> &'static str {
    match (&s.k, &s.v) {
        (KvScale::PerHead(_), _) | (_, KvScale::PerHead(_)) => " per-head",
        (KvScale::PerTensor(_), _) | (_, KvScale::PerTensor(_)) => " per-tensor",
        _ => "",
    }
}

// ------------------------------------------------------------------------------------ append
/// A kv_append case: `tokens` new tokens into a pool, every `skip_every`-th slot -1.
#[derive(Clone, Debug, PartialEq)]
pub struct KvAppendCase {
    pub dtype: DType,
    pub page_dtype: DType,
    pub tokens: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
    pub num_pages: usize,
    /// k and v are views into one `[tokens, 2 kv_heads + q_heads, head_dim]` fused QKV buffer
    /// (q_heads = 2 kv_heads), heads strided.
    pub fused_qkv: bool,
    /// Every n-th token gets slot -1 (0: none).
    pub skip_every: usize,
    /// The pools are views of one `[num_pages, 2, ...]` buffer.
    pub interleaved_pools: bool,
    /// One token's slot lies past the pool: nothing is written for it and the flag is raised.
    pub bad_slot: bool,
    pub scales: KvScales,
    pub seed: u64,
}

impl KvAppendCase {
    pub fn new(
        dtype: DType,
        page_dtype: DType,
        tokens: usize,
        kv_heads: usize,
        head_dim: usize,
        page_size: usize,
    ) -> Self {
        let num_pages = (tokens + 2 * page_size).div_ceil(page_size);
        let scales = if page_dtype == DType::F8E4M3 { KvScales::per_tensor(0.03, 0.05) } else { KvScales::default() };
        KvAppendCase {
            dtype,
            page_dtype,
            tokens,
            kv_heads,
            head_dim,
            page_size,
            num_pages,
            fused_qkv: false,
            skip_every: 0,
            interleaved_pools: false,
            bad_slot: false,
            scales,
            seed: 21,
        }
    }
}

pub fn kv_append_case(device: &Device, case: &KvAppendCase) -> Result<CaseResult> {
    let KvAppendCase {
        dtype,
        page_dtype,
        tokens,
        kv_heads,
        head_dim: d,
        page_size,
        num_pages,
        fused_qkv,
        skip_every,
        interleaved_pools,
        bad_slot,
        ref scales,
        seed,
    } = *case;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 20 ^ (d as u64) << 40);
    let pool = PoolShape { num_pages, page_size, kv_heads, head_dim: d };
    let (ks, vs) = (scale_values(&scales.k, kv_heads), scale_values(&scales.v, kv_heads));
    let mut k_pages = pool_values(&mut rng, page_dtype, pool, &ks);
    let mut v_pages = pool_values(&mut rng, page_dtype, pool, &vs);
    let pools = make_pools(device, page_dtype, pool, interleaved_pools, &k_pages, &v_pages)?;
    let k = rng.normal_vec(tokens * kv_heads * d, 1.0, dtype);
    let v = rng.normal_vec(tokens * kv_heads * d, 1.0, dtype);
    // Distinct random slots; some skipped, maybe one outside the pool.
    let mut all: Vec<i32> = (0..(num_pages * page_size) as i32).collect();
    shuffle(&mut rng, &mut all);
    let mut slots: Vec<i64> = all.iter().take(tokens).map(|&s| i64::from(s)).collect();
    if skip_every > 0 {
        slots.iter_mut().step_by(skip_every).for_each(|s| *s = -1);
    }
    if bad_slot && tokens > 0 {
        slots[tokens / 2] = (num_pages * page_size + 3) as i64;
    }
    let (kt, vt, _buf) = if fused_qkv {
        let heads = 4 * kv_heads; // [q (2 kv_heads) | k | v]
        let mut all = rng.normal_vec(tokens * heads * d, 1.0, dtype);
        for t in 0..tokens {
            for h in 0..kv_heads {
                for x in 0..d {
                    all[(t * heads + 2 * kv_heads + h) * d + x] = k[(t * kv_heads + h) * d + x];
                    all[(t * heads + 3 * kv_heads + h) * d + x] = v[(t * kv_heads + h) * d + x];
                }
            }
        }
        let buf = Tensor::from_f64(device, dtype, &all, &[tokens, heads, d])?;
        (buf.narrow(1, 2 * kv_heads, kv_heads)?, buf.narrow(1, 3 * kv_heads, kv_heads)?, Some(buf))
    } else {
        (
            Tensor::from_f64(device, dtype, &k, &[tokens, kv_heads, d])?,
            Tensor::from_f64(device, dtype, &v, &[tokens, kv_heads, d])?,
            None,
        )
    };
    let st = Tensor::from_slice(device, &slots, &[tokens])?;
    let errors = ErrorFlag::new(device)?;
    let start = Instant::now();
    {
        let (mut kp, mut vp) = (TensorViewMut::of_tensor(&pools.k), TensorViewMut::of_tensor(&pools.v));
        let (k, v, slot_mapping) = (kt.view(), vt.view(), st.view());
        let call =
            KvAppendArgs { k: &k, v: &v, slot_mapping: &slot_mapping, k_pages: &mut kp, v_pages: &mut vp, scales };
        kv_append_on(device, call, &errors)?;
    }
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let flagged = errors.check("kv_append").is_err();
    refp::kv_append(&k, &v, &slots, pool, page_dtype, &ks, &vs, &mut k_pages, &mut v_pages)?;
    let (kg, vg) = (pools.k.to_f64_vec()?, pools.v.to_f64_vec()?);
    let exact = Tolerance { atol: 0.0, rtol: 0.0 };
    let shape = vec![num_pages, page_size, kv_heads, d];
    let (comparison, worst_shape) =
        worst_of(vec![(compare(&kg, &k_pages, exact), shape.clone()), (compare(&vg, &v_pages, exact), shape)]);
    let flag_ok = flagged == bad_slot;
    Ok(CaseResult {
        op: format!("kv_append{}", fp8_suffix(page_dtype)),
        dtype,
        shape: format!(
            "t{tokens} {kv_heads}x{d} p{page_size}->{}{}{}{}{}{}",
            page_dtype.name(),
            scales_name(scales),
            if fused_qkv { " qkv" } else { "" },
            if skip_every > 0 { " skip" } else { "" },
            if interleaved_pools { " kv-pages" } else { "" },
            if bad_slot { " bad-slot" } else { "" },
        ),
        pass: comparison.pass && flag_ok,
        comparison,
        worst_shape,
        gaps_untouched: flag_ok,
        millis,
        outputs: vec![kg, vg],
    })
}

// ------------------------------------------------------------------------------------ decode
/// A paged decode case: a batch of sequences (their lengths count the q_len new tokens, which
/// the case appends through kv_append first), a scrambled page pool, optional fp8 pages.
#[derive(Clone, Debug, PartialEq)]
pub struct PagedDecodeCase {
    pub dtype: DType,
    pub page_dtype: DType,
    pub seq_lens: Vec<usize>,
    pub q_len: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
    pub opts: PagedDecodeOptions,
    pub with_lse: bool,
    /// `None`: the planner's choice.
    pub num_splits: Option<usize>,
    pub scales: KvScales,
    /// Pages in random order (else in order).
    pub scramble: bool,
    /// The pools are views of one `[num_pages, 2, ...]` buffer.
    pub interleaved_pools: bool,
    /// A block-table entry of (sequence, page index) set to a page id outside the pool: its keys
    /// are skipped and the flag must be raised.
    pub bad_page: Option<(usize, usize)>,
    pub seed: u64,
}

impl PagedDecodeCase {
    pub fn new(
        dtype: DType,
        page_dtype: DType,
        seq_lens: &[usize],
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        page_size: usize,
    ) -> Self {
        let scales = if page_dtype == DType::F8E4M3 { KvScales::per_tensor(0.03, 0.05) } else { KvScales::default() };
        PagedDecodeCase {
            dtype,
            page_dtype,
            seq_lens: seq_lens.to_vec(),
            q_len: 1,
            q_heads,
            kv_heads,
            head_dim,
            page_size,
            opts: PagedDecodeOptions::default(),
            with_lse: true,
            num_splits: None,
            scales,
            scramble: true,
            interleaved_pools: false,
            bad_page: None,
            seed: 11,
        }
    }
}

/// Tolerance of decode outputs: attention's (P rounded to the storage type for P V), over V
/// values of size ~1.
pub fn paged_decode_tolerance(dtype: DType) -> Tolerance {
    attention_tolerance(dtype)
}

pub fn paged_decode_case(device: &Device, case: &PagedDecodeCase) -> Result<CaseResult> {
    let PagedDecodeCase {
        dtype,
        page_dtype,
        ref seq_lens,
        q_len,
        q_heads,
        kv_heads,
        head_dim: d,
        page_size,
        opts,
        with_lse,
        num_splits,
        ref scales,
        scramble,
        interleaved_pools,
        bad_page,
        seed,
    } = *case;
    let batch = seq_lens.len();
    let mut rng = Rng::new(seed ^ (batch as u64) << 20 ^ (d as u64) << 40 ^ (page_size as u64) << 8);
    let max_len = seq_lens.iter().copied().max().unwrap_or(0);
    let width = max_len.div_ceil(page_size).max(1);
    let pages: Vec<usize> = seq_lens.iter().map(|l| l.div_ceil(page_size)).collect();
    let num_pages = pages.iter().sum::<usize>() + 2;
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    if scramble {
        shuffle(&mut rng, &mut ids);
    }
    let table = block_table(&pages, width, &ids, bad_page, num_pages);
    let pool = PoolShape { num_pages, page_size, kv_heads, head_dim: d };
    let (ks, vs) = (scale_values(&scales.k, kv_heads), scale_values(&scales.v, kv_heads));
    let k_init = pool_values(&mut rng, page_dtype, pool, &ks);
    let v_init = pool_values(&mut rng, page_dtype, pool, &vs);
    let pools = make_pools(device, page_dtype, pool, interleaved_pools, &k_init, &v_init)?;
    // The new tokens' k and v, appended through kv_append (the source dtype is q's).
    let tokens = batch * q_len;
    let k_new = rng.normal_vec(tokens * kv_heads * d, 1.0, dtype);
    let v_new = rng.normal_vec(tokens * kv_heads * d, 1.0, dtype);
    let slots = slot_mapping(seq_lens, q_len, page_size, &table, width, bad_page);
    let errors = ErrorFlag::new(device)?;
    {
        let kt = Tensor::from_f64(device, dtype, &k_new, &[tokens, kv_heads, d])?;
        let vt = Tensor::from_f64(device, dtype, &v_new, &[tokens, kv_heads, d])?;
        let st = Tensor::from_slice(device, &slots, &[tokens])?;
        let (mut kp, mut vp) = (TensorViewMut::of_tensor(&pools.k), TensorViewMut::of_tensor(&pools.v));
        let (k, v, slot_mapping) = (kt.view(), vt.view(), st.view());
        let call =
            KvAppendArgs { k: &k, v: &v, slot_mapping: &slot_mapping, k_pages: &mut kp, v_pages: &mut vp, scales };
        kv_append_on(device, call, &errors)?;
    }
    errors.check("kv_append")?;
    let q = rng.normal_vec(tokens * q_heads * d, 1.0, dtype);
    let qt = Tensor::from_f64(device, dtype, &q, &[tokens, q_heads, d])?;
    let tt = Tensor::from_slice(device, &table, &[batch, width])?;
    let lens: Vec<i32> = seq_lens.iter().map(|&l| l as i32).collect();
    let lt = Tensor::from_slice(device, &lens, &[batch])?;
    let out = Tensor::poisoned(device, dtype, &[tokens, q_heads, d])?;
    let lse = if with_lse { Some(Tensor::poisoned(device, DType::F32, &[q_heads, tokens])?) } else { None };
    let shape = DecodeShape { batch, q_len, q_heads, kv_heads, head_dim: d, max_seq_len: max_len, dtype, page_dtype };
    let mut ws = PagedDecodeWorkspace::plan_with_splits(device, &shape, num_splits)?;
    let start = Instant::now();
    {
        let (kv, vv) = (pools.k.view(), pools.v.view());
        let kv = PagedKvView { k_pages: &kv, v_pages: &vv, scales };
        let (q, block_table, seq_lens) = (qt.view(), tt.view(), lt.view());
        let (mut out, mut lse) = (out.view_mut(), lse.as_ref().map(Tensor::view_mut));
        let args = DecodeArgs {
            q: &q,
            kv: &kv,
            block_table: &block_table,
            seq_lens: &seq_lens,
            out: &mut out,
            lse: lse.as_mut(),
        };
        ws.forward_on(device, args, &opts)?;
    }
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let flagged = ws.check_errors();
    let flag_ok = match (&flagged, bad_page) {
        (Ok(()), None) | (Err(Error::DeviceReported { .. }), Some(_)) => true,
        (Err(e), None) => return Err(Error::invalid("verify", "paged_decode", e, "unexpected device error")),
        _ => false,
    };

    // The reference reads what the kernels read: the pools after the append, scaled.
    let scaled_pools = (scaled(&pools.k.to_f64_vec()?, pool, &ks), scaled(&pools.v.to_f64_vec()?, pool, &vs));
    let (parts, outputs) =
        compare_decode(case, &q, scaled_pools, pool, (&table, width), &lens, (&out, lse.as_ref()), tokens)?;
    let (comparison, worst_shape) = worst_of(parts);
    let lens_name = if batch <= 4 { format!("{seq_lens:?}") } else { format!("{batch} seqs <= {max_len}") };
    Ok(CaseResult {
        op: format!("paged_decode{}", fp8_suffix(page_dtype)),
        dtype,
        shape: format!(
            "{lens_name} q{q_len} {q_heads}/{kv_heads}x{d} p{page_size} s{}{}{}{}{}",
            ws.num_splits(),
            scales_name(scales),
            opts.chunk_size.map_or(String::new(), |c| format!(" chunk {c}")),
            if opts.temperature.is_some() { " +temp" } else { "" },
            if bad_page.is_some() { " bad-page" } else { "" },
        ),
        pass: comparison.pass && flag_ok,
        comparison,
        worst_shape,
        gaps_untouched: flag_ok,
        millis,
        outputs,
    })
}

/// The block table: each sequence's pages (`ids` in order), entries past a sequence invalid (to
/// prove they are never read), and the planted bad page.
fn block_table(
    pages: &[usize],
    width: usize,
    ids: &[i32],
    bad_page: Option<(usize, usize)>,
    num_pages: usize,
) -> Vec<i32> {
    let batch = pages.len();
    let mut table = vec![0i32; batch * width];
    let mut next = 0;
    for b in 0..batch {
        for j in 0..width {
            // Entries past the sequence are never read: make them invalid to prove it.
            table[b * width + j] = if j < pages[b] {
                next += 1;
                ids[next - 1]
            } else {
                i32::MAX - j as i32
            };
        }
    }
    if let Some((b, j)) = bad_page {
        table[b * width + j] = num_pages as i32 + 7;
    }
    table
}

/// Where the new tokens' k and v go: the slot of key `seq_len - q_len + i`, or -1 (skipped) for a
/// key before the sequence or on the planted bad page.
fn slot_mapping(
    seq_lens: &[usize],
    q_len: usize,
    page_size: usize,
    table: &[i32],
    width: usize,
    bad_page: Option<(usize, usize)>,
) -> Vec<i64> {
    let tokens = seq_lens.len() * q_len;
    (0..tokens)
        .map(|t| {
            let (b, i) = (t / q_len, t % q_len);
            let key = seq_lens[b] as i64 - q_len as i64 + i as i64;
            if key < 0 || Some((b, key as usize / page_size)) == bad_page {
                -1
            } else {
                let id = i64::from(table[b * width + key as usize / page_size]);
                id * page_size as i64 + key % page_size as i64
            }
        })
        .collect()
}

/// Compares the decode output (and LSE) with the reference over the scaled pools.
#[allow(clippy::too_many_arguments)]
fn compare_decode(
    case: &PagedDecodeCase,
    q: &[f64],
    (kg, vg): (Vec<f64>, Vec<f64>),
    pool: PoolShape,
    (table, width): (&[i32], usize),
    lens: &[i32],
    (out, lse): (&Tensor, Option<&Tensor>),
    tokens: usize,
) -> Result<(Vec<(Comparison, Vec<usize>)>, Vec<Vec<f64>>)> {
    let PagedDecodeCase { dtype, q_len, q_heads, head_dim: d, opts, .. } = *case;
    let spec = DecodeSpec {
        q_heads,
        q_len,
        scale: f64::from(opts.scale.unwrap_or(1.0 / (d as f32).sqrt())),
        chunk_size: opts.chunk_size,
        temperature: opts.temperature,
    };
    let (oref, lref) = refp::paged_decode(q, &kg, &vg, pool, table, width, lens, &spec)?;
    let og = out.to_f64_vec()?;
    let mut parts = vec![(compare(&og, &oref, paged_decode_tolerance(dtype)), vec![tokens, q_heads, d])];
    let mut outputs = vec![og];
    if let Some(l) = lse {
        let lg = l.to_f64_vec()?;
        parts.push((compare(&lg, &lref, LSE_TOLERANCE), vec![q_heads, tokens]));
        outputs.push(lg);
    }
    Ok((parts, outputs))
}

/// The paged-cache cases `verify` runs: append (bf16, f16 to fp8 with both scale kinds, fused
/// QKV views) and decode (GQA 4, bf16/f16/f32 pages and fp8, splits, q_len 4).
pub fn paged_cases(quick: bool) -> (Vec<KvAppendCase>, Vec<PagedDecodeCase>) {
    let mut append = Vec::new();
    for dtype in DType::FLOATS {
        append.push(KvAppendCase { fused_qkv: true, skip_every: 5, ..KvAppendCase::new(dtype, dtype, 37, 2, 128, 16) });
    }
    append.push(KvAppendCase::new(DType::BF16, DType::F8E4M3, 37, 2, 128, 16));
    append.push(KvAppendCase {
        scales: KvScales { k: KvScale::PerHead(vec![0.02, 0.04]), v: KvScale::PerHead(vec![0.05, 0.03]) },
        ..KvAppendCase::new(DType::F16, DType::F8E4M3, 37, 2, 64, 32)
    });
    let long = if quick { 300 } else { 4000 };
    let lens = [long, 1, 0, 77];
    let mut decode = Vec::new();
    for dtype in DType::FLOATS {
        decode.push(PagedDecodeCase::new(dtype, dtype, &lens, 8, 2, 128, 16));
    }
    for dtype in [DType::BF16, DType::F16] {
        decode.push(PagedDecodeCase::new(dtype, DType::F8E4M3, &lens, 8, 2, 128, 16));
    }
    decode.push(PagedDecodeCase {
        q_len: 4,
        num_splits: Some(3),
        scales: KvScales { k: KvScale::PerHead(vec![0.02, 0.04]), v: KvScale::PerHead(vec![0.05, 0.03]) },
        ..PagedDecodeCase::new(DType::BF16, DType::F8E4M3, &[long, 40], 8, 2, 64, 32)
    });
    (append, decode)
}
