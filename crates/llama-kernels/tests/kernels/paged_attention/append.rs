//! kv_append: every dtype pair, strided views, fp8 scales, skipped and bad slots.

use super::*;

#[test]
fn append_every_dtype_pair_with_strided_views_and_skipped_slots() {
    for device in common::devices() {
        for (src, page) in append_dtypes() {
            append_pass(
                &device,
                &KvAppendCase { fused_qkv: true, skip_every: 3, ..KvAppendCase::new(src, page, 13, 2, 32, 16) },
            );
        }
    }
}

#[test]
fn append_fp8_scales_head_dims_page_sizes_and_pool_layouts() {
    for device in common::devices() {
        for d in [32, 64, 96, 128, 256] {
            append_pass(
                &device,
                &KvAppendCase { scales: PER_HEAD(2), ..KvAppendCase::new(DType::BF16, DType::F8E4M3, 9, 2, d, 16) },
            );
        }
        for ps in [16, 32, 64, 128] {
            append_pass(
                &device,
                &KvAppendCase {
                    interleaved_pools: true,
                    ..KvAppendCase::new(DType::F16, DType::F8E4M3, 11, 3, 64, ps)
                },
            );
            append_pass(
                &device,
                &KvAppendCase { interleaved_pools: true, ..KvAppendCase::new(DType::BF16, DType::BF16, 11, 3, 64, ps) },
            );
        }
        // Scales that push values past 448 saturate.
        append_pass(
            &device,
            &KvAppendCase {
                scales: KvScales::per_tensor(0.001, 0.002),
                ..KvAppendCase::new(DType::F32, DType::F8E4M3, 7, 1, 64, 16)
            },
        );
    }
}

#[test]
fn append_slot_outside_the_pool_is_skipped_and_flagged() {
    for device in common::devices() {
        for page in [DType::BF16, DType::F8E4M3] {
            append_pass(
                &device,
                &KvAppendCase { bad_slot: true, ..KvAppendCase::new(DType::BF16, page, 9, 2, 64, 16) },
            );
        }
    }
}
