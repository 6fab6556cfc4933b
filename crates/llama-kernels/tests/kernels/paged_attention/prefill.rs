//! Prefill over the paged cache, and merge_attention_states.

use super::*;

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
