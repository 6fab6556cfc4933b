//! A named error for each bad host-visible input.

use super::*;

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
