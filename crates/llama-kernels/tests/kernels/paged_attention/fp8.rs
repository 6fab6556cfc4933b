//! fp8 conversions (every code, a sweep) and fp8 caches bounded to their scales.

use super::*;

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
