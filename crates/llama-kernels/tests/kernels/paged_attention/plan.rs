//! Planning: allocation-free calls, split counts, stages, what an architecture refuses.

use super::*;

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
