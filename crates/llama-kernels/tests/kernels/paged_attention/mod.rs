//! The paged KV cache against the f64 reference (emulated, and CUDA when present): fp8
//! conversions (every code, a sweep), kv_append (every dtype pair, strided views, -1 and bad
//! slots), split-KV decode (scrambled pages, ragged lengths, every page size and head dim, GQA
//! 1/4/8, splits 1..many, q_len 1 and 4, chunked, temperature, fp8 scales, bad pages), prefill
//! over the paged cache, merge_attention_states, schedules bit for bit, planned calls that
//! allocate nothing, and a named error for each bad host-visible input.
//!
//! One module per part: fp8 conversions, append, decode, prefill and merge, planning, and
//! the validation errors; the helpers they share are here.

mod append;
mod decode;
mod fp8;
mod plan;
mod prefill;
mod validation;

use crate::common;

use llama_kernels::dev::selftest::fp8_kernel_conversions;
use llama_kernels::dev::testing::{Rng, Tolerance, compare};
use llama_kernels::dev::verify::{
    AttentionCase, KvAppendCase, LSE_TOLERANCE, PagedDecodeCase, attention_case, attention_tolerance, kv_append_case,
    paged_decode_case,
};
use llama_kernels::dtype::{f8e4m3_decode, f8e4m3_encode};
use llama_kernels::ops::attention::{AttentionMask, AttentionOptions, AttentionWorkspace, Llama4Temperature};
use llama_kernels::ops::attention::{AttentionTensors, DecodeArgs, DecodeTensors, KvAppendArgs, KvTensors, Offsets};
use llama_kernels::ops::attention::{
    DecodeShape, ErrorFlag, KvScale, KvScales, PagedDecodeOptions, PagedDecodeWorkspace, PagedKvCache, PagedKvConfig,
    PagedKvView, kv_append_on, merge_attention_states,
};
use llama_kernels::reference;
use llama_kernels::reference::attention::AttentionSpec;
use llama_kernels::{DType, Device, Error, Tensor, TensorViewMut};

fn decode_pass(device: &Device, case: &PagedDecodeCase) {
    let r = paged_decode_case(device, case).unwrap_or_else(|e| panic!("{case:?} on {device:?}: {e}"));
    assert!(r.pass, "{} on {device:?}", r.describe());
}

fn append_pass(device: &Device, case: &KvAppendCase) {
    let r = kv_append_case(device, case).unwrap_or_else(|e| panic!("{case:?} on {device:?}: {e}"));
    assert!(r.pass, "{} on {device:?}", r.describe());
}

fn append_dtypes() -> Vec<(DType, DType)> {
    let mut v = Vec::new();
    for src in DType::FLOATS {
        for page in [DType::F32, DType::F16, DType::BF16, DType::F8E4M3] {
            v.push((src, page));
        }
    }
    v
}

const PER_HEAD: fn(usize) -> KvScales = |kv_heads| KvScales {
    k: KvScale::PerHead((0..kv_heads).map(|h| 0.02 + 0.01 * h as f32).collect()),
    v: KvScale::PerHead((0..kv_heads).map(|h| 0.05 - 0.01 * h as f32).collect()),
};

fn bf16_cache(device: &Device, num_pages: usize, kv_heads: usize, head_dim: usize) -> PagedKvCache {
    let config =
        PagedKvConfig { num_pages, page_size: 16, kv_heads, head_dim, dtype: DType::BF16, scales: KvScales::default() };
    PagedKvCache::new(device, &config).unwrap()
}

fn bf16_shape(batch: usize, q_heads: usize, kv_heads: usize, head_dim: usize, max_seq_len: usize) -> DecodeShape {
    DecodeShape {
        batch,
        q_len: 1,
        q_heads,
        kv_heads,
        head_dim,
        max_seq_len,
        dtype: DType::BF16,
        page_dtype: DType::BF16,
    }
}

fn named(r: llama_kernels::Result<()>, name: &str) {
    let e = r.unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { name: n, .. } if *n == name), "{name}: {e}");
}
