//! Split-KV decode against the reference: head dims, page sizes, GQA, splits, bad pages, schedules.

use super::*;

#[test]
fn decode_every_head_dim_and_dtype() {
    for device in common::devices() {
        for d in [32, 64, 96, 128, 256] {
            for (q, page) in [
                (DType::BF16, DType::BF16),
                (DType::F16, DType::F16),
                (DType::F32, DType::F32),
                (DType::BF16, DType::F8E4M3),
                (DType::F16, DType::F8E4M3),
            ] {
                decode_pass(&device, &PagedDecodeCase::new(q, page, &[70, 5, 0, 33], 4, 1, d, 16));
            }
        }
    }
}

#[test]
fn decode_every_page_size_and_ragged_lengths() {
    for device in common::devices() {
        for ps in [16, 32, 64, 128] {
            for (q, page) in [(DType::BF16, DType::BF16), (DType::F16, DType::F8E4M3), (DType::F32, DType::F32)] {
                // Lengths off the page size, 0, 1, one page exactly, across the 64-key tiles.
                decode_pass(&device, &PagedDecodeCase::new(q, page, &[1, 0, ps, 130, ps + 3], 8, 2, 64, ps));
            }
        }
    }
}

#[test]
fn decode_gqa_ratios_and_row_blocks() {
    for device in common::devices() {
        for (qh, kvh) in [(2, 2), (8, 2), (8, 1), (32, 2)] {
            for q_len in [1, 4] {
                for (q, page) in [(DType::BF16, DType::BF16), (DType::BF16, DType::F8E4M3), (DType::F32, DType::F32)] {
                    // 32/2 x q_len 4: 64 rows a group (one full block); (8, 1) x 4: 32 rows (2 m-tiles).
                    decode_pass(
                        &device,
                        &PagedDecodeCase { q_len, ..PagedDecodeCase::new(q, page, &[45, 3, 100], qh, kvh, 64, 16) },
                    );
                }
            }
        }
        // More rows than a block: 80 q heads over 1 KV head at q_len 1 (two row blocks), and
        // 10 q heads x 8 tokens (Llama 4 Scout's 40/8... at 5 heads a group: 40 rows).
        decode_pass(&device, &PagedDecodeCase::new(DType::F16, DType::F16, &[50, 7], 80, 1, 32, 16));
        decode_pass(
            &device,
            &PagedDecodeCase { q_len: 8, ..PagedDecodeCase::new(DType::BF16, DType::BF16, &[50, 7, 2], 10, 2, 64, 16) },
        );
        decode_pass(
            &device,
            &PagedDecodeCase { q_len: 8, ..PagedDecodeCase::new(DType::F32, DType::F32, &[50, 7, 2], 10, 2, 64, 16) },
        );
    }
}

#[test]
fn decode_split_counts_from_one_to_many() {
    for device in common::devices() {
        for splits in [1, 2, 3, 7, 16, 40] {
            for (q, page) in [(DType::BF16, DType::BF16), (DType::F16, DType::F8E4M3), (DType::F32, DType::F32)] {
                let mut case = PagedDecodeCase::new(q, page, &[300, 1, 0, 129], 8, 2, 64, 16);
                case.num_splits = Some(splits);
                case.q_len = if splits % 2 == 0 { 4 } else { 1 };
                decode_pass(&device, &case);
                case.with_lse = false;
                decode_pass(&device, &case);
            }
        }
    }
}

#[test]
fn decode_long_and_empty_sequences_in_one_batch() {
    // The one long case: a few thousand keys next to 0 and 1, planner's split count.
    for device in common::devices() {
        decode_pass(&device, &PagedDecodeCase::new(DType::BF16, DType::BF16, &[3000, 0, 1, 517], 4, 1, 64, 16));
        decode_pass(&device, &PagedDecodeCase::new(DType::BF16, DType::F8E4M3, &[3000, 0, 1, 517], 4, 1, 64, 16));
    }
}

#[test]
fn decode_chunked_temperature_scale_and_fp8_scales() {
    let temp = Some(Llama4Temperature { floor_scale: 16.0, attn_scale: 0.1 });
    for device in common::devices() {
        for (q, page) in [(DType::BF16, DType::BF16), (DType::F16, DType::F8E4M3), (DType::F32, DType::F32)] {
            for q_len in [1, 4] {
                let mut case = PagedDecodeCase::new(q, page, &[130, 40, 3], 8, 2, 64, 16);
                case.q_len = q_len;
                case.num_splits = Some(3);
                case.opts.chunk_size = Some(48);
                decode_pass(&device, &case);
                case.opts.temperature = temp;
                case.opts.scale = Some(0.2);
                decode_pass(&device, &case);
                case.opts.chunk_size = None;
                decode_pass(&device, &case);
            }
        }
        for q in [DType::BF16, DType::F16] {
            let mut case = PagedDecodeCase::new(q, DType::F8E4M3, &[90, 17], 8, 4, 128, 32);
            case.scales = PER_HEAD(4);
            decode_pass(&device, &case);
            case.scales = KvScales { k: KvScale::PerTensor(0.1), v: KvScale::PerHead(vec![0.01, 0.02, 0.03, 0.04]) };
            case.interleaved_pools = true;
            decode_pass(&device, &case);
        }
    }
}

#[test]
fn decode_bad_page_is_skipped_flagged_and_never_read() {
    // The bad entry's keys take no part (the reference skips them too); nothing outside the
    // pool is read (the emulator's guard pages would fault), and the flag is raised.
    for device in common::devices() {
        for (q, page) in [(DType::BF16, DType::BF16), (DType::F16, DType::F8E4M3), (DType::F32, DType::F32)] {
            for splits in [1, 3] {
                let mut case = PagedDecodeCase::new(q, page, &[100, 20], 8, 2, 64, 16);
                case.bad_page = Some((0, 2));
                case.num_splits = Some(splits);
                decode_pass(&device, &case);
            }
        }
    }
}

#[test]
fn decode_schedules_agree_bit_for_bit() {
    for (q, page) in [(DType::BF16, DType::BF16), (DType::F16, DType::F8E4M3), (DType::F32, DType::F32)] {
        for splits in [1, 3] {
            // 200 keys over 2 kv heads, q_len 4 (32 rows: 2 m-tiles, 2 warps per m-tile).
            let mut case = PagedDecodeCase::new(q, page, &[200, 9, 0], 8, 2, 64, 16);
            case.q_len = 4;
            case.num_splits = Some(splits);
            common::assert_schedules_agree(&format!("{case:?}"), |d| paged_decode_case(d, &case));
            let append = KvAppendCase { fused_qkv: true, skip_every: 4, ..KvAppendCase::new(q, page, 21, 2, 64, 16) };
            common::assert_schedules_agree(&format!("{append:?}"), |d| kv_append_case(d, &append));
        }
    }
}
