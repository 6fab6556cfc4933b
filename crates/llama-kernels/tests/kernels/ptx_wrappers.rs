//! The warp-level PTX wrappers (kernels/common/ptx.cuh): each emulated branch against a scalar
//! computation of the PTX ISA's documented semantics, and, when a GPU is present, the hardware
//! instruction against the emulated branch on the same random fragments.

use crate::common;

use half::bf16;
use llama_kernels::dev::selftest::{self, Kernel, Variant};
use llama_kernels::dev::testing::Rng;
use llama_kernels::{DType, Device, Tensor};

fn run(device: &Device, kernel: Kernel, input: &[f32], out_dtype: DType, out_len: usize) -> Vec<f64> {
    let x = Tensor::from_slice(device, input, &[input.len()]).unwrap();
    let y = Tensor::poisoned(device, out_dtype, &[out_len]).unwrap();
    selftest::launch(kernel, Variant::Correct, Some(&x), &y, input.len(), 32, 32).unwrap();
    y.to_f64_vec().unwrap()
}

/// A, B^T, C for one m16n8k16, exactly representable in `dtype`.
fn mma_inputs(dtype: DType, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut v: Vec<f32> = rng.normal_vec(256 + 128, 1.0, dtype).into_iter().map(|x| x as f32).collect();
    v.extend(rng.normal_vec(128, 4.0, DType::F32).into_iter().map(|x| x as f32));
    v
}

fn mma_reference(input: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (a, bt, c) = (&input[..256], &input[256..384], &input[384..512]);
    let mut d = vec![0.0; 128];
    let mut mag = vec![0.0; 128];
    for row in 0..16 {
        for col in 0..8 {
            let mut acc = f64::from(c[row * 8 + col]);
            let mut m = acc.abs();
            for k in 0..16 {
                let p = f64::from(a[row * 16 + k]) * f64::from(bt[col * 16 + k]);
                acc += p;
                m += p.abs();
            }
            d[row * 8 + col] = acc;
            mag[row * 8 + col] = m;
        }
    }
    (d, mag)
}

#[test]
fn mma_matches_a_scalar_gemm_and_the_hardware() {
    for (kernel, dtype) in [(Kernel::MmaBf16, DType::BF16), (Kernel::MmaF16, DType::F16)] {
        for seed in 0..4 {
            let input = mma_inputs(dtype, seed);
            let (expected, mag) = mma_reference(&input);
            let mut outputs = Vec::new();
            for device in common::devices() {
                let got = run(&device, kernel, &input, DType::F32, 128);
                for i in 0..128 {
                    let tol = 2e-6 * mag[i] + 1e-6;
                    assert!(
                        (got[i] - expected[i]).abs() <= tol,
                        "{kernel:?} on {device:?}: D[{}][{}] = {} vs {}",
                        i / 8,
                        i % 8,
                        got[i],
                        expected[i]
                    );
                }
                outputs.push((device.target(), got));
            }
            // Hardware vs emulation on the same fragments (only where a GPU ran).
            if let [(_, emu), (_, gpu)] = outputs.as_slice() {
                for i in 0..128 {
                    assert!(
                        (emu[i] - gpu[i]).abs() <= 2e-6 * mag[i] + 1e-6,
                        "{kernel:?}: emulated {} vs GPU {} at {i}",
                        emu[i],
                        gpu[i]
                    );
                }
            }
        }
    }
}

#[test]
fn ldmatrix_delivers_the_documented_fragments() {
    let mut rng = Rng::new(77);
    let input: Vec<f32> = rng.normal_vec(256, 1.0, DType::BF16).into_iter().map(|x| x as f32).collect();
    let bits = |m: usize, r: usize, c: usize| u32::from(bf16::from_f32(input[(m * 8 + r) * 8 + c]).to_bits());
    let mut expected = vec![0i32; 6 * 32 * 4];
    for (variant, (n, trans)) in
        [(1, false), (2, false), (4, false), (1, true), (2, true), (4, true)].into_iter().enumerate()
    {
        for lane in 0..32 {
            for j in 0..n {
                let (lo, hi) = if trans {
                    (bits(j, 2 * (lane % 4), lane / 4), bits(j, 2 * (lane % 4) + 1, lane / 4))
                } else {
                    (bits(j, lane / 4, 2 * (lane % 4)), bits(j, lane / 4, 2 * (lane % 4) + 1))
                };
                expected[(variant * 32 + lane) * 4 + j] = (lo | (hi << 16)) as i32;
            }
        }
    }
    let mut outputs = Vec::new();
    for device in common::devices() {
        let got: Vec<i32> =
            run(&device, Kernel::Ldmatrix, &input, DType::I32, 6 * 32 * 4).iter().map(|&x| x as i32).collect();
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, e, "{device:?}: variant {} lane {} register {}", i / 128, i / 4 % 32, i % 4);
        }
        outputs.push(got);
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]), "emulated and GPU ldmatrix differ");
}

#[test]
fn cp_async_copies_and_zero_fills() {
    let input: Vec<f32> = (0..128).map(|i| i as f32 + 0.5).collect();
    for device in common::devices() {
        let got = run(&device, Kernel::CpAsync, &input, DType::F32, 128);
        for lane in 0..32 {
            let src_bytes = (4 * lane) % 17;
            for j in 0..4 {
                // Whole floats are copied when src_bytes covers them; a partial float mixes the
                // copied low bytes with zeros.
                let copied = (src_bytes as i64 - 4 * j as i64).clamp(0, 4) as usize;
                let src = input[lane * 4 + j].to_le_bytes();
                let mut b = [0u8; 4];
                b[..copied].copy_from_slice(&src[..copied]);
                let expected = f32::from_le_bytes(b);
                assert_eq!(
                    got[lane * 4 + j].to_bits(),
                    f64::from(expected).to_bits(),
                    "{device:?}: lane {lane} float {j} (src_bytes {src_bytes})"
                );
            }
        }
    }
}
