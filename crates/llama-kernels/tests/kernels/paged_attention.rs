//! The paged KV cache against the f64 reference (emulated, and CUDA when present): fp8
//! conversions (every code, a sweep), kv_append (every dtype pair, strided views, -1 and bad
//! slots), split-KV decode (scrambled pages, ragged lengths, every page size and head dim, GQA
//! 1/4/8, splits 1..many, q_len 1 and 4, chunked, temperature, fp8 scales, bad pages), prefill
//! over the paged cache, merge_attention_states, schedules bit for bit, planned calls that
//! allocate nothing, and a named error for each bad host-visible input.

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

// ------------------------------------------------------------------------------------ fp8
#[test]
fn fp8_rust_encode_decode_round_trip_every_code_and_ties() {
    for c in 0u8..=255 {
        let x = f8e4m3_decode(c);
        if c & 0x7f == 0x7f {
            assert!(x.is_nan(), "{c:#x}");
            assert_eq!(f8e4m3_encode(x) & 0x7f, 0x7f);
        } else {
            assert_eq!(f8e4m3_encode(x), c, "code {c:#x} = {x}");
        }
    }
    assert_eq!(f8e4m3_decode(0x7e), 448.0);
    assert_eq!(f8e4m3_decode(0x01), 2f64.powi(-9));
    // Saturation, infinities, NaN.
    for (x, c) in
        [(448.0, 0x7e), (463.9, 0x7e), (464.0, 0x7e), (1e9, 0x7e), (f64::INFINITY, 0x7e), (-f64::INFINITY, 0xfe)]
    {
        assert_eq!(f8e4m3_encode(x), c, "{x}");
    }
    assert_eq!(f8e4m3_encode(f64::NAN) & 0x7f, 0x7f);
    // Ties go to the even code: between consecutive codes c, c + 1 (same sign, finite).
    for c in 0u8..0x7e {
        let (a, b) = (f8e4m3_decode(c), f8e4m3_decode(c + 1));
        let even = if c % 2 == 0 { c } else { c + 1 };
        assert_eq!(f8e4m3_encode((a + b) / 2.0), even, "tie between {c:#x} and {:#x}", c + 1);
        assert_eq!(f8e4m3_encode(-(a + b) / 2.0), even | 0x80);
    }
}

#[test]
fn fp8_kernel_conversions_match_rust_on_every_code_and_a_sweep() {
    // Inputs: every code's value, every midpoint, and a sweep over all f32 bit patterns
    // (every 4099th: all exponents, signs, subnormals, infinities and NaNs).
    let mut input: Vec<f32> = Vec::new();
    for c in 0u8..=255 {
        input.push(f8e4m3_decode(c) as f32);
        if c & 0x7f < 0x7e {
            input.push(((f8e4m3_decode(c) + f8e4m3_decode(c + 1)) / 2.0) as f32);
        }
    }
    input.extend([0.0, -0.0, 448.0, 464.0, 479.9, 480.0, f32::MAX, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40]);
    let mut bits = 0u64;
    while bits < 1 << 32 {
        input.push(f32::from_bits(bits as u32));
        bits += 4099;
    }
    for device in common::devices() {
        let (codes, decoded) = fp8_kernel_conversions(&device, &input).unwrap();
        for (i, (&x, &c)) in input.iter().zip(&codes).enumerate() {
            let want = f8e4m3_encode(f64::from(x));
            if x.is_nan() {
                assert_eq!(c & 0x7f, 0x7f, "NaN input {i} ({:#x})", x.to_bits());
            } else {
                assert_eq!(c, want, "input {i}: {x:e} ({:#x}) on {device:?}", x.to_bits());
            }
        }
        for path in 0..5 {
            for c in 0..256usize {
                let (got, want) = (decoded[path * 256 + c], f8e4m3_decode(c as u8));
                let same = if want.is_nan() {
                    got.is_nan()
                } else {
                    f64::from(got) == want && (got.is_sign_negative() == want.is_sign_negative())
                };
                assert!(same, "path {path} code {c:#x}: {got} != {want} on {device:?}");
            }
        }
    }
}

// ------------------------------------------------------------------------------------ append
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

// ------------------------------------------------------------------------------------ decode
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

// ------------------------------------------------------------------------------------ prefill
#[test]
fn prefill_head_dims_32_and_256() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for d in [32, 256] {
                for mask in [AttentionMask::None, AttentionMask::Causal] {
                    let case = AttentionCase::new(dtype, &[(70, 70), (5, 40)], 4, 2, d, mask);
                    let r = attention_case(&device, &case).unwrap();
                    assert!(r.pass, "{}", r.describe());
                }
            }
        }
    }
}

#[test]
fn prefill_over_the_paged_cache() {
    // Chunked prefill after a cached prefix (q_len < k_len), an empty sequence, every page size,
    // host and device offsets, chunked attention.
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for ps in [16, 64, 128] {
                for device_offsets in [false, true] {
                    let mut case = AttentionCase::new(
                        dtype,
                        &[(17, 100), (0, 5), (33, 33), (3, 0)],
                        8,
                        2,
                        64,
                        AttentionMask::Causal,
                    );
                    case.paged = Some(ps);
                    case.device_offsets = device_offsets;
                    let r = attention_case(&device, &case).unwrap();
                    assert!(r.pass, "{}", r.describe());
                }
            }
            for d in [32, 128, 256] {
                let mut case =
                    AttentionCase::new(dtype, &[(40, 90)], 4, 1, d, AttentionMask::ChunkedCausal { chunk_size: 32 });
                case.paged = Some(16);
                let r = attention_case(&device, &case).unwrap();
                assert!(r.pass, "{}", r.describe());
            }
        }
    }
}

#[test]
fn prefill_paged_schedules_agree_bit_for_bit() {
    for dtype in DType::FLOATS {
        let mut case = AttentionCase::new(dtype, &[(40, 150), (9, 9)], 4, 2, 64, AttentionMask::Causal);
        case.paged = Some(32);
        common::assert_schedules_agree(&format!("{case:?}"), |d| attention_case(d, &case));
    }
}

#[test]
fn prefill_bad_page_is_skipped_and_flagged() {
    // One sequence of 20 keys on pages [0, 9]; page 9 is outside the 3-page pool. Keys 16..19 are
    // skipped: the 4 causal queries at positions 16..19 then attend keys 0..15, which is full
    // attention over those 16 keys.
    for device in common::devices() {
        for dtype in DType::FLOATS {
            let (d, mut rng) = (64, Rng::new(3));
            let q = rng.normal_vec(4 * 2 * d, 1.0, dtype);
            let pool_k = rng.normal_vec(3 * 16 * d, 1.0, dtype);
            let pool_v = rng.normal_vec(3 * 16 * d, 1.0, dtype);
            let config = PagedKvConfig {
                num_pages: 3,
                page_size: 16,
                kv_heads: 1,
                head_dim: d,
                dtype,
                scales: KvScales::default(),
            };
            let cache = PagedKvCache::new(&device, &config).unwrap();
            cache.k_pages().copy_from_f64(&pool_k).unwrap();
            cache.v_pages().copy_from_f64(&pool_v).unwrap();
            let table = Tensor::from_slice(&device, &[0i32, 9], &[1, 2]).unwrap();
            let qt = Tensor::from_f64(&device, dtype, &q, &[4, 2, d]).unwrap();
            let out = Tensor::poisoned(&device, dtype, &[4, 2, d]).unwrap();
            let mut ws = AttentionWorkspace::new(&device);
            let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
            ws.forward(
                AttentionTensors {
                    q: &qt,
                    kv: KvTensors::Paged { cache: &cache, block_table: &table },
                    cu_seqlens: Offsets::Host { q: &[0, 4], k: &[0, 20] },
                    out: &out,
                    lse: None,
                },
                &opts,
            )
            .unwrap();
            let e = ws.check_errors().unwrap_err();
            assert!(matches!(e, Error::DeviceReported { .. }) && e.to_string().contains("page"), "{e}");
            ws.check_errors().unwrap(); // read and cleared
            let spec = AttentionSpec {
                q_heads: 2,
                kv_heads: 1,
                head_dim: d,
                mask: AttentionMask::None,
                scale: 1.0 / (d as f64).sqrt(),
                temperature: None,
            };
            let (oref, _) =
                reference::attention::attention(&q, &pool_k[..16 * d], &pool_v[..16 * d], &[0, 4], &[0, 16], &spec)
                    .unwrap();
            let c = compare(&out.to_f64_vec().unwrap(), &oref, attention_tolerance(dtype));
            assert!(c.pass, "{dtype}: {}", c.describe(&[4, 2, d]));
        }
    }
}

// ------------------------------------------------------------------------------------ merge
#[test]
fn decode_with_more_kv_heads_than_fp8_scales_16_bit_and_f32_pages() {
    // The per-head fp8 scales end the params struct (MAX_SCALED_KV_HEADS of them): 16-bit and
    // f32 pages never read them, so any KV head count decodes (this read past the struct and gave
    // NaN at 256 heads); fp8 pages decode at the bound.
    use llama_kernels::ops::attention::MAX_SCALED_KV_HEADS;
    for device in common::devices() {
        for (q, page, heads) in [
            (DType::BF16, DType::BF16, 256),
            (DType::F16, DType::F16, 129),
            (DType::F32, DType::F32, 256),
            (DType::BF16, DType::F8E4M3, MAX_SCALED_KV_HEADS),
        ] {
            decode_pass(&device, &PagedDecodeCase::new(q, page, &[20, 3], heads, heads, 32, 16));
        }
    }
}

#[test]
fn fp8_caches_are_bounded_to_the_scales_in_every_op() {
    // An fp8 pool reads a scale per KV head even when none is given: more heads than scales is a
    // named error in the cache, the decode planner and kv_append (default scales included).
    use llama_kernels::ops::attention::MAX_SCALED_KV_HEADS;
    let d = Device::emulated();
    let heads = MAX_SCALED_KV_HEADS + 1;
    let config = PagedKvConfig {
        num_pages: 1,
        page_size: 16,
        kv_heads: heads,
        head_dim: 16,
        dtype: DType::F8E4M3,
        scales: KvScales::default(),
    };
    let e = PagedKvCache::new(&d, &config).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { name: "kv_heads", .. }), "{e}");
    let shape = DecodeShape { page_dtype: DType::F8E4M3, ..bf16_shape(1, heads, heads, 64, 16) };
    named(PagedDecodeWorkspace::plan(&d, &shape).map(drop), "kv_heads");
    use llama_kernels::dtype::F8E4M3;
    let (mut ka, mut va) = (vec![F8E4M3(0); 16 * heads * 16], vec![F8E4M3(0); 16 * heads * 16]);
    let mut kp = TensorViewMut::host(&mut ka, &[1, 16, heads, 16]).unwrap();
    let mut vp = TensorViewMut::host(&mut va, &[1, 16, heads, 16]).unwrap();
    let k = Tensor::zeros(&d, DType::BF16, &[1, heads, 16]).unwrap();
    let slots = Tensor::from_slice(&d, &[0i64], &[1]).unwrap();
    let flag = ErrorFlag::new(&d).unwrap();
    let r = kv_append_on(
        &d,
        KvAppendArgs {
            k: &k.view(),
            v: &k.view(),
            slot_mapping: &slots.view(),
            k_pages: &mut kp,
            v_pages: &mut vp,
            scales: &KvScales::default(),
        },
        &flag,
    );
    named(r, "kv_heads");
    // 16-bit pools of as many heads are fine.
    PagedKvCache::new(&d, &PagedKvConfig { dtype: DType::BF16, ..config }).unwrap();
}

#[test]
fn merge_attention_states_any_head_dim_writes_only_its_rows() {
    // Each lane takes 4 elements: a head_dim that is not a multiple of 4 has a short last group,
    // which must neither read nor write past the row (this wrote past every row).
    for device in common::devices() {
        for d in [1, 2, 6, 130] {
            let (tokens, heads, pad) = (3, 2, 5);
            let dtype = DType::BF16;
            let mut rng = Rng::new(d as u64);
            let va = rng.normal_vec(tokens * heads * d, 1.0, dtype);
            let vb = rng.normal_vec(tokens * heads * d, 1.0, dtype);
            let la: Vec<f64> = (0..tokens * heads).map(|_| f64::from(rng.normal() as f32)).collect();
            let lb: Vec<f64> = (0..tokens * heads).map(|_| f64::from(rng.normal() as f32)).collect();
            let (vref, _) = reference::paged_attention::merge_states(&va, &la, &vb, &lb, tokens, heads, d).unwrap();
            let vat = Tensor::from_f64(&device, dtype, &va, &[tokens, heads, d]).unwrap();
            let vbt = Tensor::from_f64(&device, dtype, &vb, &[tokens, heads, d]).unwrap();
            let lat = Tensor::from_f64(&device, DType::F32, &la, &[heads, tokens]).unwrap();
            let lbt = Tensor::from_f64(&device, DType::F32, &lb, &[heads, tokens]).unwrap();
            // out: the first d columns of rows d + pad wide, the rest a sentinel that must survive.
            const SENTINEL: f64 = 1024.0; // exact in bf16
            let wide = Tensor::from_f64(
                &device,
                dtype,
                &vec![SENTINEL; tokens * heads * (d + pad)],
                &[tokens, heads, d + pad],
            )
            .unwrap();
            merge_attention_states(&vat, &lat, &vbt, &lbt, &wide.narrow(2, 0, d).unwrap(), None).unwrap();
            let all = wide.to_f64_vec().unwrap();
            let (mut got, mut kept) = (Vec::new(), true);
            for (i, x) in all.iter().enumerate() {
                if i % (d + pad) < d {
                    got.push(*x);
                } else {
                    kept &= *x == SENTINEL;
                }
            }
            assert!(kept, "head_dim {d} on {device:?}: merge wrote past its rows");
            let c = compare(&got, &vref, Tolerance::rounded_output(dtype));
            assert!(c.pass, "head_dim {d}: {}", c.describe(&[tokens, heads, d]));
        }
    }
}

#[test]
fn merge_attention_states_matches_the_reference() {
    let (tokens, heads, d) = (7, 3, 40);
    for device in common::devices() {
        for dtype in DType::FLOATS {
            let mut rng = Rng::new(17);
            let va = rng.normal_vec(tokens * heads * d, 1.0, dtype);
            let vb = rng.normal_vec(tokens * heads * d, 1.0, dtype);
            let mut la: Vec<f64> = (0..tokens * heads).map(|_| f64::from(rng.normal() as f32 * 3.0)).collect();
            let mut lb: Vec<f64> = (0..tokens * heads).map(|_| f64::from(rng.normal() as f32 * 3.0)).collect();
            la[1] = f64::NEG_INFINITY; // a state without keys
            lb[2] = f64::NEG_INFINITY;
            (la[4], lb[4]) = (f64::NEG_INFINITY, f64::NEG_INFINITY); // neither has keys
            let (vref, lref) = reference::paged_attention::merge_states(&va, &la, &vb, &lb, tokens, heads, d).unwrap();
            // v_a strided (a wider buffer), lse_b a transposed view of a [tokens, heads] buffer.
            let wide = Tensor::poisoned(&device, dtype, &[tokens, heads, d + 8]).unwrap();
            let vat = wide.narrow(2, 0, d).unwrap();
            vat.copy_from_f64(&va).unwrap();
            let vbt = Tensor::from_f64(&device, dtype, &vb, &[tokens, heads, d]).unwrap();
            let lat = Tensor::from_f64(&device, DType::F32, &la, &[heads, tokens]).unwrap();
            let lb_t: Vec<f64> = (0..tokens * heads).map(|i| lb[(i % heads) * tokens + i / heads]).collect();
            let lbt = Tensor::from_f64(&device, DType::F32, &lb_t, &[tokens, heads])
                .unwrap()
                .as_strided(&[heads, tokens], &[1, heads], 0)
                .unwrap();
            let out = Tensor::poisoned(&device, dtype, &[tokens, heads, d]).unwrap();
            let lout = Tensor::poisoned(&device, DType::F32, &[heads, tokens]).unwrap();
            merge_attention_states(&vat, &lat, &vbt, &lbt, &out, Some(&lout)).unwrap();
            let c = compare(&out.to_f64_vec().unwrap(), &vref, Tolerance::rounded_output(dtype));
            assert!(c.pass, "{dtype}: {}", c.describe(&[tokens, heads, d]));
            let c = compare(&lout.to_f64_vec().unwrap(), &lref, LSE_TOLERANCE);
            assert!(c.pass, "{dtype} lse: {}", c.describe(&[heads, tokens]));
        }
    }
}

// ------------------------------------------------------------------------------------ planning
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

#[test]
fn planned_calls_allocate_nothing_and_never_wait() {
    let device = Device::emulated();
    let (q_heads, kv_heads, d) = (8, 2, 64);
    let cache = bf16_cache(&device, 8, kv_heads, d);
    let mut ws =
        PagedDecodeWorkspace::plan_with_splits(&device, &bf16_shape(2, q_heads, kv_heads, d, 64), Some(2)).unwrap();
    let k = Tensor::zeros(&device, DType::BF16, &[2, kv_heads, d]).unwrap();
    let slots = Tensor::from_slice(&device, &[5i64, 40], &[2]).unwrap();
    let table = Tensor::from_slice(&device, &[0i32, 1, 2, 3, 4, 5, 6, 7], &[2, 4]).unwrap();
    let lens = Tensor::from_slice(&device, &[6i32, 41], &[2]).unwrap();
    let q = Tensor::zeros(&device, DType::BF16, &[2, q_heads, d]).unwrap();
    let out = Tensor::zeros(&device, DType::BF16, &[2, q_heads, d]).unwrap();
    let lse = Tensor::zeros(&device, DType::F32, &[q_heads, 2]).unwrap();
    let before = device.counters();
    for _ in 0..3 {
        cache.append(&k, &k, &slots).unwrap();
        ws.forward(
            DecodeTensors { q: &q, cache: &cache, block_table: &table, seq_lens: &lens, out: &out, lse: Some(&lse) },
            &PagedDecodeOptions::default(),
        )
        .unwrap();
    }
    let after = device.counters();
    assert_eq!(after.launches - before.launches, 9, "append + decode + merge per step");
    let quiet = |c: llama_kernels::DeviceCounters| {
        (c.allocations, c.pageable_uploads, c.pinned_uploads, c.downloads, c.synchronizations)
    };
    assert_eq!(quiet(after), quiet(before));
}

#[test]
fn planner_split_counts_are_deterministic_and_sized_by_the_shape() {
    use llama_kernels::ops::attention::plan_splits;
    // Llama 3 8B (8 KV heads) on 132 SMs: a long single request splits, big batches do not.
    assert_eq!(plan_splits(132, 8, 128 * 1024), 33);
    assert_eq!(plan_splits(132, 16 * 8, 8192), 2);
    assert_eq!(plan_splits(132, 64 * 8, 4096), 1);
    assert_eq!(plan_splits(132, 256 * 8, 1024), 1);
    // Short contexts keep at least 256 keys per split.
    assert_eq!(plan_splits(132, 1, 300), 2);
    assert_eq!(plan_splits(132, 1, 0), 1);
    let device = Device::emulated();
    let shape = DecodeShape { max_seq_len: 131072, ..bf16_shape(1, 32, 8, 128, 0) };
    let a = PagedDecodeWorkspace::plan(&device, &shape).unwrap().num_splits();
    assert_eq!(a, PagedDecodeWorkspace::plan(&device, &shape).unwrap().num_splits());
    assert_eq!(a, 33);
}

// ------------------------------------------------------------------------------------ errors
fn named(r: llama_kernels::Result<()>, name: &str) {
    let e = r.unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { name: n, .. } if *n == name), "{name}: {e}");
}

#[test]
fn every_append_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let cfg = |dtype, scales| PagedKvConfig { num_pages: 4, page_size: 16, kv_heads: 2, head_dim: 64, dtype, scales };
    let cache = PagedKvCache::new(&d, &cfg(DType::BF16, KvScales::default())).unwrap();
    let (k, v) = (t(DType::BF16, &[3, 2, 64]), t(DType::BF16, &[3, 2, 64]));
    let slots = Tensor::from_slice(&d, &[0i64, 17, -1], &[3]).unwrap();
    cache.append(&k, &v, &slots).unwrap();
    // Configurations.
    let e =
        PagedKvCache::new(&d, &PagedKvConfig { page_size: 24, ..cfg(DType::BF16, KvScales::default()) }).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { name: "page_size", .. }), "{e}");
    let e = PagedKvCache::new(&d, &cfg(DType::I32, KvScales::default())).unwrap_err();
    assert!(matches!(&e, Error::UnsupportedDType { .. }), "{e}");
    let e = PagedKvCache::new(&d, &PagedKvConfig { kv_heads: 0, ..cfg(DType::BF16, KvScales::default()) }).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { name: "kv_heads", .. }), "{e}");
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let e = PagedKvCache::new(&d, &cfg(DType::F8E4M3, KvScales::per_tensor(bad, 1.0))).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { name: "k_scale", .. }), "{bad}: {e}");
    }
    let one_head = KvScales { k: KvScale::None, v: KvScale::PerHead(vec![1.0]) };
    let e = PagedKvCache::new(&d, &cfg(DType::F8E4M3, one_head)).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { name: "v_scale", .. }), "{e}");
    let e = PagedKvCache::new(&d, &cfg(DType::BF16, KvScales::per_tensor(0.5, 0.5))).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { name: "k_scale", .. }), "scale on bf16 pages: {e}");
    let many = PagedKvConfig { kv_heads: 130, head_dim: 32, ..cfg(DType::F8E4M3, KvScales::per_tensor(0.1, 0.1)) };
    named(PagedKvCache::new(&d, &many).map(|_| ()), "kv_heads");
    // Calls.
    let e = cache.append(&k, &v, &Tensor::from_slice(&d, &[0i32, 1, 2], &[3]).unwrap()).unwrap_err();
    assert!(matches!(&e, Error::DTypeMismatch { what: "slot_mapping", .. }), "{e}");
    let e = cache.append(&k, &v, &Tensor::from_slice(&d, &[0i64, 1], &[2]).unwrap()).unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch { what: "slot_mapping", .. }), "{e}");
    let e = cache.append(&t(DType::BF16, &[3, 1, 64]), &v, &slots).unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch { what: "k", .. }), "{e}");
    let e = cache.append(&k, &t(DType::F16, &[3, 2, 64]), &slots).unwrap_err();
    assert!(matches!(&e, Error::DTypeMismatch { what: "v", .. }), "{e}");
    let e = cache.append(&t(DType::I32, &[3, 2, 64]), &v, &slots).unwrap_err();
    assert!(matches!(&e, Error::UnsupportedDType { .. }), "{e}");
    let odd = PagedKvCache::new(&d, &PagedKvConfig { head_dim: 40, ..cfg(DType::BF16, KvScales::default()) }).unwrap();
    named(odd.append(&t(DType::BF16, &[3, 2, 40]), &t(DType::BF16, &[3, 2, 40]), &slots), "head_dim");
    let wide = t(DType::BF16, &[3, 2, 65]);
    let e = cache.append(&wide.narrow(2, 1, 64).unwrap(), &v, &slots).unwrap_err();
    assert!(matches!(&e, Error::BadLayout { what: "k", .. }), "{e}");
    // k inside the pool being written.
    let inside = cache.k_pages().reshape(&[64, 2, 64]).unwrap().narrow(0, 0, 3).unwrap();
    let e = cache.append(&inside, &v, &slots).unwrap_err();
    assert!(matches!(&e, Error::Overlap { .. }), "{e}");
    // View level: pools that are not [pages, page_size, heads, dim], pools of two dtypes, a flag
    // of another device.
    let flag = ErrorFlag::new(&d).unwrap();
    let s = KvScales::default();
    let (mut a, mut b) = (vec![half::bf16::ZERO; 4 * 16 * 128], vec![half::f16::ZERO; 4 * 16 * 128]);
    {
        let mut flat = TensorViewMut::host(&mut a, &[4 * 16 * 128]).unwrap();
        let mut vb = TensorViewMut::host(&mut b, &[4, 16, 2, 64]).unwrap();
        let e = kv_append_on(
            &d,
            KvAppendArgs {
                k: &k.view(),
                v: &v.view(),
                slot_mapping: &slots.view(),
                k_pages: &mut flat,
                v_pages: &mut vb,
                scales: &s,
            },
            &flag,
        )
        .unwrap_err();
        assert!(matches!(&e, Error::ShapeMismatch { what: "k_pages", .. }), "{e}");
    }
    {
        let mut ka = TensorViewMut::host(&mut a, &[4, 16, 2, 64]).unwrap();
        let mut vb = TensorViewMut::host(&mut b, &[4, 16, 2, 64]).unwrap();
        let e = kv_append_on(
            &d,
            KvAppendArgs {
                k: &k.view(),
                v: &v.view(),
                slot_mapping: &slots.view(),
                k_pages: &mut ka,
                v_pages: &mut vb,
                scales: &s,
            },
            &flag,
        )
        .unwrap_err();
        assert!(matches!(&e, Error::DTypeMismatch { what: "v_pages", .. }), "{e}");
    }
    let mut b2 = vec![half::bf16::ZERO; 4 * 16 * 128];
    let mut ka = TensorViewMut::host(&mut a, &[4, 16, 2, 64]).unwrap();
    let mut vb = TensorViewMut::host(&mut b2, &[4, 16, 2, 64]).unwrap();
    let other = ErrorFlag::new(&Device::emulated()).unwrap();
    let e = kv_append_on(
        &d,
        KvAppendArgs {
            k: &k.view(),
            v: &v.view(),
            slot_mapping: &slots.view(),
            k_pages: &mut ka,
            v_pages: &mut vb,
            scales: &s,
        },
        &other,
    )
    .unwrap_err();
    assert!(matches!(&e, Error::DeviceMismatch { .. }), "{e}");
    kv_append_on(
        &d,
        KvAppendArgs {
            k: &k.view(),
            v: &v.view(),
            slot_mapping: &slots.view(),
            k_pages: &mut ka,
            v_pages: &mut vb,
            scales: &s,
        },
        &flag,
    )
    .unwrap();
}

#[test]
fn every_decode_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let (q_heads, kv_heads, hd) = (8, 2, 64);
    let shape = bf16_shape(2, q_heads, kv_heads, hd, 40);
    let cache = bf16_cache(&d, 8, kv_heads, hd);
    let mut ws = PagedDecodeWorkspace::plan(&d, &shape).unwrap();
    let q = t(DType::BF16, &[2, q_heads, hd]);
    let out = t(DType::BF16, &[2, q_heads, hd]);
    let table = Tensor::from_slice(&d, &[0i32, 1, 2, 3, 4, 5], &[2, 3]).unwrap();
    let lens = Tensor::from_slice(&d, &[40i32, 3], &[2]).unwrap();
    let opts = PagedDecodeOptions::default();
    // A valid call; each check below changes one thing.
    let call = DecodeTensors { q: &q, cache: &cache, block_table: &table, seq_lens: &lens, out: &out, lse: None };
    ws.forward(call, &opts).unwrap();
    // Plans.
    let plan = |s: DecodeShape| PagedDecodeWorkspace::plan(&d, &s).map(|_| ());
    let e = plan(DecodeShape { head_dim: 80, ..shape }).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { name: "head_dim", .. }), "{e}");
    assert!(e.to_string().contains("= 80") && e.to_string().contains("[32, 64, 96, 128, 256]"), "{e}");
    named(plan(DecodeShape { q_len: 0, ..shape }), "q_len");
    named(plan(DecodeShape { q_len: 9, ..shape }), "q_len");
    named(plan(DecodeShape { q_heads: 6, kv_heads: 4, ..shape }), "q_heads");
    named(plan(DecodeShape { kv_heads: 0, ..shape }), "kv_heads");
    let e = plan(DecodeShape { page_dtype: DType::F16, ..shape }).unwrap_err();
    assert!(matches!(&e, Error::UnsupportedDType { what: "pages", .. }), "{e}");
    let e = plan(DecodeShape { dtype: DType::F32, page_dtype: DType::F8E4M3, ..shape }).unwrap_err();
    assert!(matches!(&e, Error::UnsupportedDType { what: "pages", .. }), "{e}");
    named(PagedDecodeWorkspace::plan_with_splits(&d, &shape, Some(0)).map(|_| ()), "num_splits");
    named(PagedDecodeWorkspace::plan_with_splits(&d, &shape, Some(1000)).map(|_| ()), "num_splits");
    // Calls.
    let lens3 = Tensor::from_slice(&d, &[4i32, 3, 2], &[3]).unwrap();
    let (q3, o3) = (t(DType::BF16, &[3, q_heads, hd]), t(DType::BF16, &[3, q_heads, hd]));
    named(
        ws.forward(
            DecodeTensors { q: &q3, block_table: &t(DType::I32, &[3, 3]), seq_lens: &lens3, out: &o3, ..call },
            &opts,
        ),
        "batch",
    );
    let e = ws.forward(DecodeTensors { q: &q3, ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch { what: "q", .. }), "{e}");
    let e = ws.forward(DecodeTensors { q: &t(DType::F16, &[2, q_heads, hd]), ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::DTypeMismatch { what: "q", .. }), "{e}");
    // 2 pages of 16 cannot hold the planned 40 keys.
    named(ws.forward(DecodeTensors { block_table: &table.narrow(1, 0, 2).unwrap(), ..call }, &opts), "block_table");
    let e = ws.forward(DecodeTensors { block_table: &t(DType::I64, &[2, 3]), ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::DTypeMismatch { what: "block_table", .. }), "{e}");
    let e = ws.forward(DecodeTensors { block_table: &t(DType::I32, &[3, 3]), ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch { what: "block_table", .. }), "{e}");
    let e = ws.forward(DecodeTensors { seq_lens: &t(DType::I64, &[2]), ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::DTypeMismatch { what: "seq_lens", .. }), "{e}");
    let e = ws.forward(DecodeTensors { lse: Some(&t(DType::F32, &[2, q_heads])), ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch { what: "lse", .. }), "{e}");
    for s in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        named(ws.forward(call, &PagedDecodeOptions { scale: Some(s), ..opts }), "scale");
    }
    named(ws.forward(call, &PagedDecodeOptions { chunk_size: Some(0), ..opts }), "chunk_size");
    let temperature = Some(Llama4Temperature { floor_scale: 0.0, attn_scale: 0.1 });
    named(ws.forward(call, &PagedDecodeOptions { temperature, ..opts }), "temperature floor_scale");
    let e = ws.forward(DecodeTensors { out: &q, ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::Overlap { .. }), "{e}");
    let in_pool = cache.k_pages().reshape(&[32, 8, 64]).unwrap().narrow(0, 0, 2).unwrap();
    let e = ws.forward(DecodeTensors { out: &in_pool, ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::Overlap { .. }), "{e}");
    let other = bf16_cache(&d, 8, 1, hd);
    let e = ws.forward(DecodeTensors { cache: &other, ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch { what: "k_pages", .. }), "{e}");
    // View level: a page size that is not a power of two, scales that are not finite or > 0.
    let (odd_k, odd_v) = (t(DType::BF16, &[4, 24, kv_heads, hd]), t(DType::BF16, &[4, 24, kv_heads, hd]));
    let (okv, ovv) = (odd_k.view(), odd_v.view());
    let none = KvScales::default();
    let odd = PagedKvView { k_pages: &okv, v_pages: &ovv, scales: &none };
    let mut o1_buf = vec![half::bf16::ZERO; 2 * q_heads * hd];
    let mut o1 = TensorViewMut::host(&mut o1_buf, &[2, q_heads, hd]).unwrap();
    let (qv, tv, lv) = (q.view(), table.view(), lens.view());
    let args = DecodeArgs { q: &qv, kv: &odd, block_table: &tv, seq_lens: &lv, out: &mut o1, lse: None };
    named(ws.forward_on(&d, args, &opts), "page_size");
    let fp8_shape = DecodeShape { page_dtype: DType::F8E4M3, ..shape };
    let mut ws8 = PagedDecodeWorkspace::plan(&d, &fp8_shape).unwrap();
    let (k8, v8) = (t(DType::F8E4M3, &[8, 16, kv_heads, hd]), t(DType::F8E4M3, &[8, 16, kv_heads, hd]));
    let (k8v, v8v) = (k8.view(), v8.view());
    for bad in [0.0, -2.0, f32::NAN, f32::NEG_INFINITY] {
        let sc = KvScales::per_tensor(1.0, bad);
        let kv = PagedKvView { k_pages: &k8v, v_pages: &v8v, scales: &sc };
        let args = DecodeArgs { q: &qv, kv: &kv, block_table: &tv, seq_lens: &lv, out: &mut o1, lse: None };
        named(ws8.forward_on(&d, args, &opts), "v_scale");
    }
    let mut elsewhere = PagedDecodeWorkspace::plan(&Device::emulated(), &shape).unwrap();
    let e = elsewhere.forward(call, &opts).unwrap_err();
    assert!(matches!(&e, Error::DeviceMismatch { .. }), "{e}");
}

#[test]
fn every_prefill_paged_and_merge_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let cache = bf16_cache(&d, 4, 2, 64);
    let q = t(DType::BF16, &[5, 8, 64]);
    let out = t(DType::BF16, &[5, 8, 64]);
    let table = Tensor::from_slice(&d, &[0i32, 1], &[1, 2]).unwrap();
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
    let mut ws = AttentionWorkspace::new(&d);
    // A valid call; each check below changes one thing.
    let call = AttentionTensors {
        q: &q,
        kv: KvTensors::Paged { cache: &cache, block_table: &table },
        cu_seqlens: Offsets::Host { q: &[0, 5], k: &[0, 32] },
        out: &out,
        lse: None,
    };
    ws.forward(call, &opts).unwrap();
    named(
        ws.forward(AttentionTensors { cu_seqlens: Offsets::Host { q: &[0, 5], k: &[0, 33] }, ..call }, &opts),
        "block_table",
    );
    named(
        ws.forward(AttentionTensors { cu_seqlens: Offsets::Host { q: &[0, 5], k: &[3, 32] }, ..call }, &opts),
        "cu_seqlens_k",
    );
    let fp8 = PagedKvCache::new(
        &d,
        &PagedKvConfig {
            num_pages: 4,
            page_size: 16,
            kv_heads: 2,
            head_dim: 64,
            dtype: DType::F8E4M3,
            scales: KvScales::default(),
        },
    )
    .unwrap();
    let e = ws
        .forward(AttentionTensors { kv: KvTensors::Paged { cache: &fp8, block_table: &table }, ..call }, &opts)
        .unwrap_err();
    assert!(matches!(&e, Error::UnsupportedDType { what: "k_pages", .. }), "{e}");
    let e = ws.forward(AttentionTensors { out: &q, ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::Overlap { .. }), "{e}");
    let e = ws
        .forward(
            AttentionTensors { kv: KvTensors::Paged { cache: &cache, block_table: &t(DType::I32, &[2, 2]) }, ..call },
            &opts,
        )
        .unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch { what: "block_table", .. }), "{e}");
    // Merge.
    let (v, l) = (t(DType::BF16, &[5, 8, 64]), t(DType::F32, &[8, 5]));
    let o = t(DType::BF16, &[5, 8, 64]);
    merge_attention_states(&v, &l, &v, &l, &o, None).unwrap();
    let e = merge_attention_states(&v, &l, &t(DType::BF16, &[5, 8, 32]), &l, &o, None).unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch { what: "v_b", .. }), "{e}");
    let e = merge_attention_states(&v, &t(DType::F32, &[5, 8]), &v, &l, &o, None).unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch { what: "lse_a", .. }), "{e}");
    let e = merge_attention_states(&v, &t(DType::BF16, &[8, 5]), &v, &l, &o, None).unwrap_err();
    assert!(matches!(&e, Error::DTypeMismatch { what: "lse_a", .. }), "{e}");
    let e = merge_attention_states(&v, &l, &t(DType::F16, &[5, 8, 64]), &l, &o, None).unwrap_err();
    assert!(matches!(&e, Error::DTypeMismatch { what: "v_b", .. }), "{e}");
    let e = merge_attention_states(&v, &l, &v, &l, &v, None).unwrap_err();
    assert!(matches!(&e, Error::Overlap { .. }), "{e}");
    let e = merge_attention_states(&v, &l, &v, &l, &o, Some(&l)).unwrap_err();
    assert!(matches!(&e, Error::Overlap { .. }), "{e}");
}

#[test]
fn planning_an_absurd_batch_is_a_named_error_or_allocates_nothing() {
    // batch usize::MAX overflowed the planner's block count (a panic in debug builds). Now the
    // split heuristic saturates and every size is checked: a plan either fails by name or holds
    // no buffer it could not have allocated.
    let d = Device::emulated();
    for (batch, splits) in [(usize::MAX, None), (usize::MAX, Some(2)), (usize::MAX / 2, Some(40)), (1 << 40, None)] {
        let shape = DecodeShape { max_seq_len: 1 << 20, ..bf16_shape(batch, 8, 2, 64, 0) };
        match PagedDecodeWorkspace::plan_with_splits(&d, &shape, splits) {
            Ok(ws) => assert_eq!(ws.num_splits(), 1, "batch {batch}: a split plan needs partial buffers"),
            Err(e) => {
                assert!(matches!(e, Error::TooLarge { .. } | Error::InvalidArgument { .. }), "batch {batch}: {e}")
            }
        }
    }
}

#[test]
fn decode_takes_two_stages_where_that_holds_more_blocks_per_sm() {
    // ops::attention::decode_config: 16-bit pages at head_dim 96 and 128 take 2 K/V stages on an
    // A100 (two 82,048 B blocks per SM instead of one of 114,880) and on 8.6/8.9 (where 3 stages
    // exceed the 99 KiB per block); Hopper, with two blocks of either, keeps 3; fp8 pages and the
    // other head dims keep their first configuration. The bytes are the kernels' declarations.
    use llama_kernels::EmuArch;
    use llama_kernels::ops::attention::{decode_config, decode_kernel, decode_stages_of};
    let stages = |arch: EmuArch, page, hd| {
        let (sm, block) = (arch.max_shared_memory_per_sm(), arch.max_shared_memory_per_block());
        decode_stages_of(decode_config(sm, block, DType::BF16, page, hd), page, hd)
    };
    let bytes =
        |page, hd, config| decode_kernel(DType::BF16, page, hd, config).unwrap().shared_memory().unwrap().bytes();
    use llama_kernels::ops::attention::DecodeConfig::{Default as First, FewStages};
    assert_eq!((bytes(DType::BF16, 128, First), bytes(DType::BF16, 128, FewStages)), (114_880, 82_048));
    for hd in [96, 128] {
        assert_eq!(stages(EmuArch::Sm90, DType::BF16, hd), 3);
        assert_eq!(stages(EmuArch::Sm80, DType::BF16, hd), 2);
        assert_eq!(stages(EmuArch::Sm86, DType::BF16, hd), 2);
        assert_eq!(stages(EmuArch::Sm80, DType::F8E4M3, hd), 3);
    }
    assert_eq!(stages(EmuArch::Sm80, DType::BF16, 64), 3);
    assert_eq!(stages(EmuArch::Sm80, DType::BF16, 256), 2);
    // The 2-stage kernels against the reference on an emulated A100 and on 8.6 (where only they
    // fit), with splits, GQA, q_len > 1 and ragged lengths, under every schedule bit for bit.
    for arch in [EmuArch::Sm80, EmuArch::Sm86] {
        for (dtype, hd) in [(DType::BF16, 128), (DType::F16, 96)] {
            let mut case = PagedDecodeCase::new(dtype, dtype, &[200, 3, 64, 129], 8, 2, hd, 16);
            (case.q_len, case.num_splits) = if hd == 96 { (3, Some(3)) } else { (1, None) };
            common::assert_schedules_agree_on(arch, &format!("{arch:?} {case:?}"), |d| paged_decode_case(d, &case));
        }
    }
}

#[test]
fn what_does_not_fit_an_architecture_is_refused_by_name() {
    // 8.6/8.9 have 99 KiB of shared memory per block: decode with 16-bit pages at head_dim 256
    // and prefill at head_dim 256 do not fit (the README's table), fp8 pages do; at head_dim 96
    // and 128 decode runs there with 2 K/V stages (82,048 B; 3 stages need 114,880).
    use llama_kernels::{EmuArch, EmuOptions};
    let on = |arch| Device::emulated_with(EmuOptions { arch, ..EmuOptions::default() });
    let (d86, d80) = (on(EmuArch::Sm86), on(EmuArch::Sm80));
    named(PagedDecodeWorkspace::plan(&d86, &bf16_shape(1, 8, 2, 256, 64)).map(drop), "head_dim");
    decode_pass(&d86, &PagedDecodeCase::new(DType::BF16, DType::F8E4M3, &[20, 3], 8, 2, 128, 16));
    decode_pass(&d86, &PagedDecodeCase::new(DType::F16, DType::F16, &[20, 3], 8, 2, 64, 16));
    decode_pass(&d80, &PagedDecodeCase::new(DType::BF16, DType::BF16, &[20, 3], 8, 2, 128, 16));
    let t = |d: &Device| Tensor::zeros(d, DType::BF16, &[16, 2, 256]).unwrap();
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
    let mut ws = AttentionWorkspace::plan(&d86, 1).unwrap();
    let (q, out) = (t(&d86), t(&d86));
    named(
        ws.forward(
            AttentionTensors {
                q: &q,
                kv: KvTensors::Contiguous { k: &q, v: &q },
                cu_seqlens: Offsets::Host { q: &[0, 16], k: &[0, 16] },
                out: &out,
                lse: None,
            },
            &opts,
        ),
        "shared memory",
    );
    let mut ws80 = AttentionWorkspace::plan(&d80, 1).unwrap();
    let (q, out) = (t(&d80), t(&d80));
    ws80.forward(
        AttentionTensors {
            q: &q,
            kv: KvTensors::Contiguous { k: &q, v: &q },
            cu_seqlens: Offsets::Host { q: &[0, 16], k: &[0, 16] },
            out: &out,
            lse: None,
        },
        &opts,
    )
    .unwrap();
}

#[test]
fn each_decode_kernel_declares_its_q_rows_and_stages() {
    // The stage counts the performance model reads (decode_stages_of) against the kernels' own
    // declarations: the Q rows, then per stage a K tile, a V tile and a byte per key. A kernel
    // whose layout changes without the model fails here.
    use llama_kernels::ops::attention::decode_tiles_of;
    use llama_kernels::ops::attention::{DecodeConfig, decode_kernel, decode_stages_of};
    let mut checked = 0;
    for dtype in [DType::BF16, DType::F16] {
        for page in [dtype, DType::F8E4M3] {
            for hd in llama_kernels::ops::attention::SUPPORTED_HEAD_DIMS {
                for config in [DecodeConfig::Default, DecodeConfig::FewStages] {
                    let Ok(kernel) = decode_kernel(dtype, page, hd, config) else { continue };
                    if config == DecodeConfig::FewStages && page != dtype {
                        continue; // the second configuration has 16-bit pages only
                    }
                    let (q, tile) = decode_tiles_of(hd, page.size());
                    let stages = decode_stages_of(config, page, hd);
                    let declared = kernel.shared_memory().unwrap().bytes() as usize;
                    let keys = llama_kernels::dev::geometry::params::LLK_DECODE_KEYS as usize;
                    assert_eq!(declared, q + stages * (2 * tile + keys), "{} ({config:?})", kernel.symbol);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 24, "{checked} decode kernels checked");
}
