//! Devices and tensors: the CUDA target is usable or a clean error (never a panic), and tensor
//! views, copies and bounds behave.

use crate::common;

use llama_kernels::{DType, Device, Error, Target, Tensor};

#[test]
fn cuda_is_usable_or_a_clean_error() {
    match Device::cuda_unavailable_reason() {
        Some(reason) => {
            assert!(!reason.is_empty());
            let e = Device::cuda(0).unwrap_err();
            assert!(matches!(e, Error::CudaUnavailable(_)), "{e}");
            assert_eq!(Device::best().target(), Target::Emulated);
        }
        None => {
            let d = Device::cuda(0).unwrap();
            assert_eq!(d.target(), Target::Cuda);
            assert!(matches!(d.ptx_arch(), Some("sm_90") | Some("sm_80")));
            // Interop: an engine's own stream and buffer.
            let stream = d.cuda_stream().unwrap().clone();
            let shared = Device::cuda_on_stream(stream.clone()).unwrap();
            let slice = stream.alloc_zeros::<u8>(64).unwrap();
            let t = Tensor::from_cuda_bytes(&shared, slice, DType::F32, &[4, 4]).unwrap();
            let v: Vec<f32> = (0..16).map(|i| i as f32).collect();
            t.copy_from_slice(&v).unwrap();
            assert_eq!(t.to_vec::<f32>().unwrap(), v);
            {
                let mut guard = t.cuda_buffer().unwrap().expect("a CUDA tensor has a cudarc buffer");
                assert!(guard.view_mut::<f32>().is_none() && guard.bytes_mut().is_some());
                assert_eq!(guard.buffer().num_bytes(), 64);
                // While this thread holds the buffer, ops on it fail instead of deadlocking.
                let e = t.to_vec::<f32>().unwrap_err();
                assert!(matches!(e, Error::StorageBusy { .. }), "{e}");
            }
            let small = stream.alloc_zeros::<u8>(8).unwrap();
            assert!(Tensor::from_cuda_bytes(&shared, small, DType::F32, &[4]).is_err());
        }
    }
    assert!(Device::cuda(1_000_000).is_err(), "a missing ordinal is an error, not a panic");
}

#[test]
fn views_copies_and_bounds() {
    for device in common::devices() {
        let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let t = Tensor::from_slice(&device, &data, &[2, 3, 4]).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), data);
        // narrow keeps the storage and strides.
        let n = t.narrow(2, 1, 2).unwrap();
        assert_eq!(n.shape(), &[2, 3, 2]);
        assert_eq!(n.to_vec::<f32>().unwrap(), vec![1., 2., 5., 6., 9., 10., 13., 14., 17., 18., 21., 22.]);
        assert!(n.shares_storage(&t) && !n.is_contiguous());
        // Writing through a strided view leaves the other elements alone.
        n.copy_from_slice(&[0.5f32; 12]).unwrap();
        let after = t.to_vec::<f32>().unwrap();
        for (i, v) in after.iter().enumerate() {
            let expect = if (1..3).contains(&(i % 4)) { 0.5 } else { i as f32 };
            assert_eq!(*v, expect, "element {i}");
        }
        // Out-of-bounds views, wrong dtypes and wrong lengths are errors.
        assert!(t.narrow(2, 3, 2).is_err());
        assert!(t.narrow(5, 0, 1).is_err());
        assert!(t.as_strided(&[3, 8], &[8, 1], 1).is_err());
        assert!(t.to_vec::<half::bf16>().is_err());
        assert!(t.copy_from_slice(&[1.0f32; 23]).is_err());
        assert!(n.reshape(&[24]).is_err(), "reshape of a strided view");
        assert!(Tensor::from_slice(&device, &[1.0f32; 5], &[2, 3]).is_err());
        // Poison reads back as NaN in every float dtype, -1 in integers.
        for dtype in DType::FLOATS {
            assert!(Tensor::poisoned(&device, dtype, &[3]).unwrap().to_f64_vec().unwrap().iter().all(|v| v.is_nan()));
        }
        assert_eq!(Tensor::poisoned(&device, DType::I32, &[2]).unwrap().to_vec::<i32>().unwrap(), vec![-1, -1]);
        // Device-to-device copy.
        let dst = Tensor::zeros(&device, DType::F32, &[24]).unwrap();
        dst.copy_from(&Tensor::from_slice(&device, &data, &[24]).unwrap()).unwrap();
        assert_eq!(dst.to_vec::<f32>().unwrap(), data);
        assert!(Tensor::zeros(&device, DType::F32, &[23]).unwrap().copy_from(&t).is_err());
    }
}

#[test]
fn views_cannot_wrap_around_or_hide_bad_strides() {
    // Found in review: unchecked arithmetic let these views pass the bounds check in release
    // builds, and a kernel then read far outside the allocation.
    let d = Device::emulated();
    let base = Tensor::zeros(&d, DType::BF16, &[5, 8]).unwrap();
    assert!(base.as_strided(&[5, 8], &[1 << 62, 1], 0).is_err());
    assert!(base.as_strided(&[1], &[1], usize::MAX).is_err());
    assert!(base.as_strided(&[usize::MAX, 2], &[1, 1], 0).is_err());
    assert!(base.narrow(0, 2, 3).unwrap().narrow(1, 7, 1).is_ok());
    // An empty view with absurd strides is a harmless no-op everywhere.
    let empty = base.as_strided(&[2, 0], &[usize::MAX, usize::MAX], usize::MAX).unwrap();
    assert_eq!((empty.numel(), empty.offset()), (0, 0));
    let out = Tensor::zeros(&d, DType::BF16, &[2, 0]).unwrap();
    llama_kernels::ops::swiglu(llama_kernels::ops::GateUp::Separate { gate: &empty, up: &empty }, &out).unwrap();
    llama_kernels::ops::rms_norm(
        &Tensor::zeros(&d, DType::BF16, &[0, 8]).unwrap(),
        &base.narrow(0, 0, 1).unwrap().reshape(&[8]).unwrap(),
        1e-5,
        &Tensor::zeros(&d, DType::BF16, &[0, 8]).unwrap(),
    )
    .unwrap();
}
