//! Attention parity against the f64 reference (emulated, and CUDA when present): tile-edge
//! lengths, varlen batches with empty sequences, chunked prefill alignment, GQA ratios, both head
//! dims, every mask, temperature, every dtype, LSE; schedule independence; every error.

use crate::common;

use llama_kernels::dev::verify::{AttentionCase, attention_case};
use llama_kernels::ops::attention::{AttentionMask, AttentionOptions, AttentionWorkspace, Llama4Temperature};
use llama_kernels::ops::attention::{AttentionTensors, KvTensors, Offsets};
use llama_kernels::{DType, Device, Error, Tensor};

fn assert_pass(device: &Device, case: &AttentionCase) {
    let r = attention_case(device, case).unwrap_or_else(|e| panic!("{case:?} on {device:?}: {e}"));
    assert!(r.pass, "{} on {device:?}", r.describe());
}

const MASKS: [AttentionMask; 3] =
    [AttentionMask::None, AttentionMask::Causal, AttentionMask::ChunkedCausal { chunk_size: 48 }];

#[test]
fn tile_edge_lengths_every_dtype_mask_and_head_dim() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for head_dim in [64, 96, 128] {
                for len in [1, 17, 63, 64, 65, 129] {
                    for mask in MASKS {
                        assert_pass(&device, &AttentionCase::single(dtype, len, 4, 1, head_dim, mask));
                    }
                }
            }
        }
    }
}

#[test]
fn long_sequence_spans_many_tiles() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for mask in MASKS {
                assert_pass(&device, &AttentionCase::single(dtype, 257, 2, 1, 128, mask));
            }
        }
    }
}

#[test]
fn gqa_ratios_and_packing() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for (q_heads, kv_heads) in [(4, 4), (8, 2), (8, 1), (10, 2)] {
                let group = q_heads / kv_heads;
                for pack in [1, group] {
                    let mut case = AttentionCase::single(dtype, 150, q_heads, kv_heads, 64, AttentionMask::Causal);
                    case.opts.gqa_pack = Some(pack);
                    assert_pass(&device, &case);
                }
            }
        }
    }
}

#[test]
fn varlen_batch_with_empty_sequences_and_prefix_alignment() {
    // (q_len, k_len): unequal lengths, an empty sequence, queries after a cached prefix
    // (q_len < k_len), a sequence with queries but no keys, and more queries than keys.
    let seqs = [(17, 17), (0, 0), (5, 70), (64, 64), (3, 0), (1, 129), (20, 6)];
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for mask in MASKS {
                for head_dim in [64, 128] {
                    assert_pass(&device, &AttentionCase::new(dtype, &seqs, 8, 2, head_dim, mask));
                }
            }
        }
    }
}

#[test]
fn llama4_temperature_chunked_attention_and_custom_scale() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            // A small floor_scale makes the temperature vary inside a short sequence.
            let temp = Some(Llama4Temperature { floor_scale: 16.0, attn_scale: 0.1 });
            for mask in [AttentionMask::Causal, AttentionMask::ChunkedCausal { chunk_size: 32 }] {
                let mut case = AttentionCase::new(dtype, &[(40, 100), (90, 90)], 4, 1, 128, mask);
                case.opts.temperature = temp;
                assert_pass(&device, &case);
            }
            let mut case = AttentionCase::single(dtype, 33, 4, 2, 64, AttentionMask::None);
            case.opts.scale = Some(0.3);
            case.with_lse = false;
            assert_pass(&device, &case);
            // Views into one fused QKV buffer.
            let mut case = AttentionCase::new(dtype, &[(21, 21), (40, 40)], 8, 2, 128, AttentionMask::Causal);
            case.fused_qkv = true;
            assert_pass(&device, &case);
        }
    }
}

#[test]
fn fully_masked_rows_write_zeros_and_negative_infinite_lse() {
    // 6 queries after 2 keys, causal and bottom-right aligned: queries 0..3 sit at negative
    // positions and see no key; a sequence with queries and no keys sees none either.
    for device in common::devices() {
        for dtype in DType::FLOATS {
            let case = AttentionCase::new(dtype, &[(6, 2), (3, 0)], 2, 1, 64, AttentionMask::Causal);
            let r = attention_case(&device, &case).unwrap();
            assert!(r.pass, "{}", r.describe());
            let (out, lse) = (&r.outputs[0], &r.outputs[1]);
            let total_q = 9;
            for head in 0..2 {
                for row in [0usize, 1, 2, 3, 6, 7, 8] {
                    assert_eq!(lse[head * total_q + row], f64::NEG_INFINITY, "{dtype} head {head} row {row}");
                    assert!(out[(row * 2 + head) * 64..(row * 2 + head + 1) * 64].iter().all(|&x| x == 0.0));
                }
                assert!(lse[head * total_q + 4].is_finite());
            }
        }
    }
}

#[test]
fn schedules_agree_bit_for_bit() {
    for dtype in DType::FLOATS {
        for mask in MASKS {
            // 200 keys: 4 K/V tiles, so a stage is refilled while the block still streams.
            let case = AttentionCase::new(dtype, &[(70, 70), (9, 30), (40, 200)], 4, 2, 64, mask);
            common::assert_schedules_agree(&format!("{case:?}"), |d| attention_case(d, &case));
        }
    }
}

#[test]
fn a100_class_gpus_run_32_key_tiles_at_head_dim_96_and_128() {
    // The configuration (ops::attention::mma_keys): where two 64-key blocks (98,432 B) do not fit
    // on an SM and two 32-key ones (65,600 B) do -- an A100's 164 KiB -- head_dim 96 and 128 take
    // 32-key tiles; Hopper (two of either) and 8.6/8.9 (one of either) keep 64, as do the head
    // dims without a 32-key kernel.
    use llama_kernels::EmuArch;
    use llama_kernels::ops::attention::mma_keys;
    for dtype in [DType::BF16, DType::F16] {
        for (head_dim, a100) in [(32, 64), (64, 64), (96, 32), (128, 32), (256, 64)] {
            assert_eq!(mma_keys(EmuArch::Sm80.max_shared_memory_per_sm(), dtype, head_dim), a100, "{dtype} {head_dim}");
            assert_eq!(mma_keys(EmuArch::Sm90.max_shared_memory_per_sm(), dtype, head_dim), 64);
            assert_eq!(mma_keys(EmuArch::Sm86.max_shared_memory_per_sm(), dtype, head_dim), 64);
        }
    }
    // The 32-key kernels against the reference on an emulated A100: tile edges of 32 keys, every
    // mask, a varlen batch after cached prefixes with GQA packing, temperature tuning, paged K/V
    // and fused QKV views; each under every schedule, bit for bit.
    let mut cases = Vec::new();
    for (i, dtype) in [DType::BF16, DType::F16].into_iter().enumerate() {
        for head_dim in [96, 128] {
            for (j, len) in [31, 32, 33, 97].into_iter().enumerate() {
                cases.push(AttentionCase::single(dtype, len, 4, 1, head_dim, MASKS[(i + j) % 3]));
            }
            let seqs = [(17, 17), (0, 0), (5, 70), (3, 0), (1, 129), (40, 100)];
            let mut case = AttentionCase::new(dtype, &seqs, 8, 2, head_dim, MASKS[1 + i]);
            case.opts.gqa_pack = Some(4);
            case.opts.temperature = Some(Llama4Temperature { floor_scale: 16.0, attn_scale: 0.1 });
            cases.push(case.clone());
            case.paged = Some(16);
            cases.push(case);
            let mut fused = AttentionCase::new(dtype, &[(21, 21), (40, 40)], 8, 2, head_dim, AttentionMask::Causal);
            fused.fused_qkv = true;
            cases.push(fused);
        }
    }
    for case in &cases {
        common::assert_schedules_agree_on(EmuArch::Sm80, &format!("{case:?}"), |d| attention_case(d, case));
    }
}

#[test]
fn the_hopper_kernel_serves_bf16_and_f16_at_head_dim_64_128_and_256_on_sm_90_only() {
    use llama_kernels::ops::attention::{PrefillKernel, prefill_kernel};
    use llama_kernels::{EmuArch, EmuOptions};
    let on = |arch| Device::emulated_with(EmuOptions { arch, ..EmuOptions::default() });
    let (hopper, a100, ada) = (on(EmuArch::Sm90), on(EmuArch::Sm80), on(EmuArch::Sm89));
    for dtype in [DType::BF16, DType::F16] {
        for d in [64, 128, 256] {
            assert_eq!(prefill_kernel(&hopper, dtype, d, false), PrefillKernel::Hopper, "{dtype} {d}");
            assert!(matches!(prefill_kernel(&hopper, dtype, d, true), PrefillKernel::MmaSync { keys: 64 }), "paged");
            assert!(matches!(prefill_kernel(&a100, dtype, d, false), PrefillKernel::MmaSync { .. }), "sm_80");
            assert!(matches!(prefill_kernel(&ada, dtype, d, false), PrefillKernel::MmaSync { keys: 64 }), "sm_89");
        }
        for d in [32, 96] {
            assert!(matches!(prefill_kernel(&hopper, dtype, d, false), PrefillKernel::MmaSync { keys: 64 }), "{d}");
        }
    }
    assert_eq!(prefill_kernel(&hopper, DType::F32, 128, false), PrefillKernel::Simt);
}

#[test]
fn the_hopper_kernel_wraps_its_ring_packs_any_group_and_agrees_across_schedules() {
    // Tiles of 128 keys (64 at head_dim 256) through 2 stages: 600 keys wrap the ring. GQA packs that do not
    // divide the block's 128 rows (SmolLM2's 9 q / 3 kv heads: pack 3, 42 tokens; 5 of 10/2),
    // prefix alignment, every mask, temperature, and sequences shorter than a tile.
    let mut cases = Vec::new();
    for (i, dtype) in [DType::BF16, DType::F16].into_iter().enumerate() {
        for head_dim in [64, 128, 256] {
            let mask = MASKS[(i + head_dim / 64) % 3];
            cases.push(AttentionCase::new(dtype, &[(70, 600), (9, 30), (130, 130)], 4, 2, head_dim, mask));
            let mut smol = AttentionCase::new(dtype, &[(50, 50), (3, 200)], 9, 3, head_dim, AttentionMask::Causal);
            smol.opts.gqa_pack = Some(3);
            cases.push(smol);
            let mut five =
                AttentionCase::single(dtype, 47, 10, 2, head_dim, AttentionMask::ChunkedCausal { chunk_size: 32 });
            five.opts.temperature = Some(Llama4Temperature { floor_scale: 16.0, attn_scale: 0.1 });
            cases.push(five);
        }
    }
    for case in &cases {
        common::assert_schedules_agree(&format!("{case:?}"), |d| attention_case(d, case));
    }
}

#[test]
fn the_mma_sync_kernel_keeps_passing_where_hopper_is_not() {
    // sm_86 (99 KiB per block): the 64-key mma.sync kernels at head_dim 64 and 128, each case
    // under every schedule, bit for bit, against the reference.
    use llama_kernels::EmuArch;
    let mut cases = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for head_dim in [64, 128] {
            for (j, len) in [17, 64, 129].into_iter().enumerate() {
                cases.push(AttentionCase::single(dtype, len, 4, 1, head_dim, MASKS[j]));
            }
            let mut case =
                AttentionCase::new(dtype, &[(17, 17), (0, 0), (5, 70), (3, 0), (40, 200)], 8, 2, head_dim, MASKS[1]);
            case.opts.gqa_pack = Some(4);
            cases.push(case);
        }
    }
    for case in &cases {
        common::assert_schedules_agree_on(EmuArch::Sm86, &format!("{case:?}"), |d| attention_case(d, case));
    }
    // head_dim 256 (one 16-row m-tile per warp, Q re-read from shared memory) needs an A100's
    // shared memory.
    for (dtype, mask) in [(DType::BF16, MASKS[1]), (DType::F16, MASKS[2])] {
        let case = AttentionCase::new(dtype, &[(70, 70), (9, 100)], 4, 2, 256, mask);
        common::assert_schedules_agree_on(EmuArch::Sm80, &format!("{case:?}"), |d| attention_case(d, &case));
    }
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let q = t(DType::BF16, &[10, 8, 64]);
    let k = t(DType::BF16, &[12, 2, 64]);
    let v = t(DType::BF16, &[12, 2, 64]);
    let out = t(DType::BF16, &[10, 8, 64]);
    let (cq, ck) = ([0, 4, 10], [0, 5, 12]);
    let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
    // A valid call; each check below changes one thing.
    let call = AttentionTensors {
        q: &q,
        kv: KvTensors::Contiguous { k: &k, v: &v },
        cu_seqlens: Offsets::Host { q: &cq, k: &ck },
        out: &out,
        lse: None,
    };
    let mut ws = AttentionWorkspace::new(&d);
    let mut run = |call, opts: &AttentionOptions| ws.forward(call, opts);
    run(call, &opts).unwrap();
    let named = |r: llama_kernels::Result<()>, name: &str| {
        let e = r.unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { name: n, .. } if *n == name), "{name}: {e}");
    };
    let contiguous = |k, v| KvTensors::Contiguous { k, v };
    // q heads not divisible by kv heads.
    let (q7, out7) = (t(DType::BF16, &[10, 7, 64]), t(DType::BF16, &[10, 7, 64]));
    named(run(AttentionTensors { q: &q7, out: &out7, ..call }, &opts), "q_heads");
    // head_dim mismatch between q, k and v.
    let wide = t(DType::BF16, &[12, 2, 128]);
    let e = run(AttentionTensors { kv: contiguous(&wide, &v), ..call }, &opts).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "k", .. }), "{e}");
    let e = run(AttentionTensors { kv: contiguous(&k, &wide), ..call }, &opts).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "v", .. }), "{e}");
    // Unsupported head_dim, named with the supported ones.
    let (q80, k80, out80) = (t(DType::BF16, &[10, 8, 80]), t(DType::BF16, &[12, 2, 80]), t(DType::BF16, &[10, 8, 80]));
    let e = run(AttentionTensors { q: &q80, kv: contiguous(&k80, &k80), out: &out80, ..call }, &opts).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { name: "head_dim", .. }), "{e}");
    assert!(e.to_string().contains("= 80") && e.to_string().contains("[32, 64, 96, 128, 256]"), "{e}");
    // cu_seqlens not non-decreasing, not starting at 0, or disagreeing with the tensors.
    for (q, k, name) in [
        (&[0, 6, 4, 10][..], &[0, 5, 6, 12][..], "cu_seqlens_q"),
        (&[1, 4, 10], &ck, "cu_seqlens_q"),
        (&[0, 4, 9], &ck, "cu_seqlens_q"),
        (&cq, &[0, 5, 13], "cu_seqlens_k"),
        (&cq, &[0, 12], "cu_seqlens_k"),
    ] {
        named(run(AttentionTensors { cu_seqlens: Offsets::Host { q, k }, ..call }, &opts), name);
    }
    // An output overlapping an input (out is q itself, or a view into k's storage).
    let e = run(AttentionTensors { out: &q, ..call }, &opts).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    let qkv = t(DType::BF16, &[10, 12, 64]);
    let (qv, kv, vv) = (qkv.narrow(1, 0, 8).unwrap(), qkv.narrow(1, 8, 2).unwrap(), qkv.narrow(1, 10, 2).unwrap());
    let fused = AttentionTensors {
        q: &qv,
        kv: contiguous(&kv, &vv),
        cu_seqlens: Offsets::Host { q: &[0, 10], k: &[0, 10] },
        ..call
    };
    run(fused, &opts).unwrap();
    let inside = qkv.narrow(1, 4, 8).unwrap();
    let e = run(AttentionTensors { out: &inside, ..fused }, &opts).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    // Chunk size 0.
    named(run(call, &AttentionOptions { mask: AttentionMask::ChunkedCausal { chunk_size: 0 }, ..opts }), "chunk_size");
    // Scale not finite (or not positive).
    for s in [f32::NAN, f32::INFINITY, 0.0, -0.5] {
        named(run(call, &AttentionOptions { scale: Some(s), ..opts }), "scale");
    }
    // GQA pack that does not divide the group.
    named(run(call, &AttentionOptions { gqa_pack: Some(3), ..opts }), "gqa_pack");
    // Dtype mismatch, and a bad LSE.
    let k16 = t(DType::F16, &[12, 2, 64]);
    let e = run(AttentionTensors { kv: contiguous(&k16, &v), ..call }, &opts).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "k", .. }), "{e}");
    let lse = t(DType::F32, &[10, 8]);
    let e = run(AttentionTensors { lse: Some(&lse), ..call }, &opts).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "lse", .. }), "{e}");
    let lse = t(DType::BF16, &[8, 10]);
    let e = run(AttentionTensors { lse: Some(&lse), ..call }, &opts).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "lse", .. }), "{e}");
    // Misaligned rows for the tensor-core path.
    let misaligned = t(DType::BF16, &[10, 8, 65]).narrow(2, 1, 64).unwrap();
    let e = run(AttentionTensors { q: &misaligned, ..call }, &opts).unwrap_err();
    assert!(matches!(e, Error::BadLayout { what: "q", .. }), "{e}");
    // A workspace from another device.
    let e = AttentionWorkspace::new(&Device::emulated()).forward(call, &opts).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
}

#[test]
fn a_sampled_check_passes_the_kernels_output_and_fails_a_corrupted_one() {
    // What the benches run before they time a shape: the kernel's output on random inputs
    // against the f64 reference on sampled rows. It must pass the real output and catch one
    // wrong row.
    use llama_kernels::dev::testing::Rng;
    use llama_kernels::dev::verify::SampledAttention;
    let d = Device::emulated();
    let (batch, seq, q_heads, kv_heads, head_dim) = (2, 70, 4, 2, 64);
    let mut rng = Rng::new(11);
    let mut values = |heads: usize| -> Vec<f32> {
        rng.normal_vec(batch * seq * heads * head_dim, 1.0, DType::BF16).into_iter().map(|x| x as f32).collect()
    };
    let (q, k, v) = (values(q_heads), values(kv_heads), values(kv_heads));
    let up = |x: &[f32], heads: usize| {
        let b: Vec<half::bf16> = x.iter().map(|&f| half::bf16::from_f32(f)).collect();
        Tensor::from_slice(&d, &b, &[batch * seq, heads, head_dim]).unwrap()
    };
    let (tq, tk, tv) = (up(&q, q_heads), up(&k, kv_heads), up(&v, kv_heads));
    let out = Tensor::poisoned(&d, DType::BF16, &[batch * seq, q_heads, head_dim]).unwrap();
    let cu: Vec<i32> = (0..=batch).map(|b| (b * seq) as i32).collect();
    for mask in MASKS {
        let opts = AttentionOptions { mask, ..Default::default() };
        let mut ws = AttentionWorkspace::plan(&d, 4).unwrap();
        let call = AttentionTensors {
            q: &tq,
            kv: KvTensors::Contiguous { k: &tk, v: &tv },
            cu_seqlens: Offsets::Host { q: &cu, k: &cu },
            out: &out,
            lse: None,
        };
        ws.forward(call, &opts).unwrap();
        let mut got: Vec<f32> = out.to_vec::<half::bf16>().unwrap().into_iter().map(f32::from).collect();
        let sample = |out: &[f32]| {
            SampledAttention { q: &q, k: &k, v: &v, out, batch, seq, q_heads, kv_heads, head_dim, mask }.check(
                24,
                DType::BF16,
                5,
            )
        };
        let ok = sample(&got);
        assert!(ok.pass && ok.count == 24 * head_dim, "{mask:?}: {}", ok.describe(&[24, head_dim]));
        // Every token's first head, off by 0.1 in one element: the sample (first and last
        // tokens of each sequence among its rows) must see it.
        for t in 0..batch * seq {
            for h in 0..q_heads {
                got[(t * q_heads + h) * head_dim] += 0.1;
            }
        }
        assert!(!sample(&got).pass, "{mask:?}: a corrupted output passed");
    }
}

#[test]
fn hopper_rings_wrap_at_head_dim_256_and_128_on_every_device() {
    // The cases the prepared GPU run needs: the K/V ring's later rounds (mbarrier parity 1 and
    // back to 0) and head_dim 256 on hardware. head_dim 256 with 330 keys (64-key tiles: 6 tiles
    // through 2 stages) and head_dim 128 with 650 keys (128-key tiles: 6 tiles); causal, full and
    // chunked; varlen with a short sequence; GQA with packing. Each runs on the emulator (sm_90:
    // the Hopper kernel) and on CUDA when present (the Hopper kernel with LLK_ATTENTION_SM90=1,
    // the mma.sync kernel without), against the f64 reference: hardware and emulator agree to
    // within twice the tolerance.
    use llama_kernels::ops::attention::{PrefillKernel, prefill_kernel};
    let mut cases = Vec::new();
    for (i, mask) in MASKS.into_iter().enumerate() {
        let dtype = if i % 2 == 0 { DType::BF16 } else { DType::F16 };
        cases.push(AttentionCase::new(dtype, &[(33, 330), (70, 70)], 4, 2, 256, mask));
        let mut gqa = AttentionCase::new(dtype, &[(20, 650), (5, 5)], 8, 2, 128, mask);
        gqa.opts.gqa_pack = Some(4);
        cases.push(gqa);
    }
    let emulated = Device::emulated();
    for case in &cases {
        assert_eq!(prefill_kernel(&emulated, case.dtype, case.head_dim, false), PrefillKernel::Hopper);
    }
    for device in common::devices() {
        for case in &cases {
            assert_pass(&device, case);
        }
    }
}
