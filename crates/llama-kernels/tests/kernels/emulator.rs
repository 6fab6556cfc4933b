//! Tests of the emulation runtime itself, through the self-test kernels.

use crate::common;

use llama_kernels::dev::selftest::{self, Kernel, Variant};
use llama_kernels::{DType, Device, Error, Tensor};

fn stencil(device: &Device, variant: Variant, input: &[f32]) -> Vec<f32> {
    let n = input.len();
    let x = Tensor::from_slice(device, input, &[n]).unwrap();
    let y = Tensor::poisoned(device, DType::F32, &[n]).unwrap();
    selftest::launch(Kernel::Stencil, variant, Some(&x), &y, n, n, 256).unwrap();
    y.to_vec().unwrap()
}

#[test]
fn missing_barrier_is_caught_by_comparing_schedules() {
    let n = 1024;
    let input: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + 0.25 * i as f32).collect();
    let expected: Vec<f32> = (0..n)
        .map(|i| {
            let at = |j: isize| if j < 0 || j >= n as isize { 0.0 } else { input[j as usize] };
            at(i as isize - 1) + at(i as isize) + at(i as isize + 1)
        })
        .collect();
    let devices = common::schedule_devices();
    let correct: Vec<Vec<f32>> = devices.iter().map(|d| stencil(d, Variant::Correct, &input)).collect();
    for c in &correct {
        assert_eq!(c, &expected, "the correct stencil is wrong under some schedule");
    }
    let buggy: Vec<Vec<f32>> = devices.iter().map(|d| stencil(d, Variant::PlantedBug, &input)).collect();
    let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(
        buggy.iter().any(|b| bits(b) != bits(&buggy[0])),
        "three schedules agreed on a kernel with a missing __syncthreads"
    );
}

#[test]
fn planted_deadlock_is_reported_not_hung() {
    let d = Device::emulated();
    let out = Tensor::zeros(&d, DType::F32, &[64]).unwrap();
    selftest::launch(Kernel::Deadlock, Variant::Correct, None, &out, 64, 64, 64).unwrap();
    let got: Vec<f32> = out.to_vec().unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == (i ^ 1) as f32), "{got:?}");
    let e = selftest::launch(Kernel::Deadlock, Variant::PlantedBug, None, &out, 64, 64, 64).unwrap_err();
    match e {
        Error::Emulation { status, message, .. } => {
            assert_eq!(status, "deadlock");
            assert!(message.contains("wait at __syncthreads") && message.contains("at warp operations"), "{message}");
        }
        other => panic!("expected a deadlock report, got {other}"),
    }
    // The device is still usable afterwards.
    selftest::launch(Kernel::Deadlock, Variant::Correct, None, &out, 64, 64, 64).unwrap();
}

#[test]
fn divergent_barriers_are_reported() {
    let d = Device::emulated();
    let out = Tensor::zeros(&d, DType::F32, &[128]).unwrap();
    selftest::launch(Kernel::DivergentBarrier, Variant::Correct, None, &out, 128, 128, 128).unwrap();
    let e = selftest::launch(Kernel::DivergentBarrier, Variant::PlantedBug, None, &out, 128, 128, 128).unwrap_err();
    assert!(matches!(e, Error::Emulation { status: "divergent barrier", .. }), "{e}");
    assert!(e.to_string().contains("selftest.cu"), "the report names the source lines: {e}");
}

#[test]
fn shuffles_and_votes_match_their_definitions() {
    for device in common::devices() {
        let threads = 96;
        let out = Tensor::poisoned(&device, DType::I32, &[8 * threads]).unwrap();
        selftest::launch(Kernel::WarpOps, Variant::Correct, None, &out, 0, threads, 96).unwrap();
        let got: Vec<i32> = out.to_vec().unwrap();
        for t in 0..threads as i32 {
            let (lane, base) = (t & 31, t - (t & 31));
            let v = |l: i32| (base + l) * 10;
            let expect = [
                v(3),
                v(lane ^ 5),
                if lane >= 2 { v(lane - 2) } else { v(lane) },
                if lane + 7 < 32 { v(lane + 7) } else { v(lane) },
                v((lane & !7) | 1),
                0xaaaa_aaaau32 as i32,
                1,
                1,
            ];
            assert_eq!(&got[8 * t as usize..8 * t as usize + 8], &expect, "thread {t}");
        }
    }
}

#[test]
fn dynamic_shared_memory_and_atomics_work() {
    for device in common::devices() {
        let (n, block) = (1000, 128);
        let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let x = Tensor::from_slice(&device, &input, &[n]).unwrap();
        let y = Tensor::poisoned(&device, DType::F32, &[n]).unwrap();
        selftest::launch(Kernel::DynSmem, Variant::Correct, Some(&x), &y, n, n, block).unwrap();
        let got: Vec<f32> = y.to_vec().unwrap();
        for (i, &g) in got.iter().enumerate() {
            let (b, t) = (i / block, i % block);
            let src = b * block + block - 1 - t;
            if src < n {
                assert_eq!(g, input[src], "element {i}");
            } else {
                assert!(g.is_nan(), "element {i} has no source and must keep its poison, got {g}");
            }
        }
        let counts = Tensor::zeros(&device, DType::I32, &[2]).unwrap();
        selftest::launch(Kernel::Atomics, Variant::Correct, None, &counts, 5000, 5000, 256).unwrap();
        let c: Vec<i32> = counts.to_vec().unwrap();
        assert_eq!(c, vec![(0..5000).sum::<i32>(), 5000]);
    }
}

#[test]
fn bad_launches_are_errors() {
    let d = Device::emulated();
    let out = Tensor::zeros(&d, DType::F32, &[16]).unwrap();
    // An output too small for the kernel is refused before launch.
    let e = selftest::launch(Kernel::Deadlock, Variant::Correct, None, &out, 64, 64, 64).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let e = selftest::launch(Kernel::Deadlock, Variant::Correct, None, &out, 16, 2048, 2048).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "block", .. }), "{e}");
}

#[test]
fn shuffle_edges_follow_the_ptx_definition() {
    // Expected values from the PTX ISA's shfl.sync pseudocode (segment mask 32 - width, b mod 32,
    // a butterfly may reach an earlier segment); on a GPU this compares the hardware too.
    fn src(mode: &str, lane: i32, b: i32, width: i32) -> i32 {
        let seg = 32 - width;
        let (min_lane, max_lane) = (lane & seg, (lane & seg) | (31 & !seg));
        let b = b & 31;
        let (j, ok) = match mode {
            "idx" => (min_lane | (b & !seg), (min_lane | (b & !seg)) <= max_lane),
            "up" => (lane - b, lane - b >= min_lane),
            "down" => (lane + b, lane + b <= max_lane),
            _ => (lane ^ b, (lane ^ b) <= max_lane),
        };
        if ok { j } else { lane }
    }
    for device in common::devices() {
        let threads = 64;
        let out = Tensor::poisoned(&device, DType::I32, &[6 * threads]).unwrap();
        selftest::launch(Kernel::ShflEdges, Variant::Correct, None, &out, 0, threads, 64).unwrap();
        let got: Vec<i32> = out.to_vec().unwrap();
        for t in 0..threads as i32 {
            let (lane, base) = (t & 31, t - (t & 31));
            let cases =
                [("bfly", 8, 8), ("down", 33, 32), ("up", 2, 16), ("idx", 35, 8), ("bfly", 16, 8), ("down", 3, 4)];
            for (i, (mode, b, width)) in cases.into_iter().enumerate() {
                let expected = 100 + base + src(mode, lane, b, width);
                assert_eq!(got[6 * t as usize + i], expected, "{device:?}: thread {t}, {mode}({b}, width {width})");
            }
        }
    }
}

#[test]
fn guards_report_stack_overflow_shared_memory_overrun_and_mixed_warp_ops() {
    let d = Device::emulated();
    let out = Tensor::zeros(&d, DType::F32, &[64]).unwrap();
    let e = selftest::launch(Kernel::StackHog, Variant::PlantedBug, None, &out, 0, 64, 64).unwrap_err();
    assert!(e.to_string().contains("stack overflow"), "{e}");
    for guard in [1, 2] {
        selftest::launch(Kernel::Guards, Variant::Correct, None, &out, guard, 64, 64).unwrap();
        let e = selftest::launch(Kernel::Guards, Variant::PlantedBug, None, &out, guard, 64, 64).unwrap_err();
        let expected = if guard == 1 { "past the" } else { "different warp operations" };
        assert!(e.to_string().contains(expected), "guard {guard}: {e}");
    }
    // After every failure the device still runs correct kernels.
    selftest::launch(Kernel::Guards, Variant::Correct, None, &out, 2, 64, 64).unwrap();
}

#[test]
fn out_of_bounds_kernel_accesses_are_reported_with_the_kernel_name() {
    // Every emulated allocation has a guard page on each side and canary bytes in the alignment
    // slack: a write past the end (into the slack or the page), or before the start, must come
    // back as an error naming the kernel, not as silent corruption or a dead process.
    let device = Device::emulated();
    for (n, offset, what) in [
        (100usize, 0.0f32, "one element past the end, in the slack after a 400-byte buffer"),
        (100, 30.0, "into the guard page after the buffer"),
        (64, 0.0, "one element past a 256-byte buffer: straight into the guard page"),
        (64, 5000.0, "far past the end"),
        (100, -101.0, "one element before the start"),
        (100, -3000.0, "far before the start"),
    ] {
        let input = Tensor::from_slice(&device, &[offset], &[1]).unwrap();
        let out = Tensor::zeros(&device, DType::F32, &[n]).unwrap();
        // The correct variant writes exactly the buffer.
        selftest::launch(Kernel::OutOfBounds, Variant::Correct, Some(&input), &out, n, n, 128).unwrap();
        assert!(out.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.0));
        let e = selftest::launch(Kernel::OutOfBounds, Variant::PlantedBug, Some(&input), &out, n, n, 128).unwrap_err();
        match &e {
            llama_kernels::Error::Emulation { kernel, status, message } => {
                assert_eq!(*kernel, "selftest_out_of_bounds", "{what}: {e}");
                assert_eq!(*status, "memory fault", "{what}: {e}");
                assert!(message.contains("out") || message.contains("fault address"), "{what}: {e}");
            }
            other => panic!("{what}: expected a memory fault, got {other}"),
        }
        // The process and the device survive: the next launch works.
        selftest::launch(Kernel::OutOfBounds, Variant::Correct, Some(&input), &out, n, n, 128).unwrap();
    }
}

// ------------------------------------------------------------------ guards with planted bugs

/// The status and message of an emulation error (panics on anything else).
fn emulation_error(what: &str, e: Error) -> (&'static str, &'static str, String) {
    match e {
        Error::Emulation { kernel, status, message } => (kernel, status, message),
        other => panic!("{what}: expected an emulation error, got {other}"),
    }
}

#[test]
fn planted_guard_bugs_are_reported_by_name() {
    // (guard, status, words the message must hold); see Kernel::Guards.
    let cases: [(usize, &str, &[&str]); 8] = [
        (3, "index out of bounds", &["index 64 out of bounds", "float [64]", "selftest.cu:", "thread (0,0,0)"]),
        // SelftestParams: 4 words of 8 bytes, then its 128-byte aligned tensor map at byte 128.
        (4, "params overrun", &["256-byte params struct", "byte 256", "thread (0,0,0)"]),
        (5, "misaligned access", &["16-byte vector load", "not 16-byte aligned", "thread (0,0,0)"]),
        (6, "misaligned access", &["16-byte vector store", "thread (0,0,0)"]),
        (7, "misaligned access", &["cp.async destination (shared)", "thread (0,0,0)"]),
        (8, "misaligned access", &["cp.async source (global)", "thread (0,0,0)"]),
        (9, "misaligned access", &["ldmatrix row address", "thread (3,0,0)"]),
        (10, "index out of bounds", &["index 4 out of bounds", "float [4]", "selftest.cu:"]),
    ];
    let devices = common::schedule_devices();
    for (guard, status, words) in cases {
        // The correct variant runs under every schedule, with the same result.
        let mut results: Vec<Vec<u32>> = Vec::new();
        for d in &devices {
            let out = Tensor::zeros(d, DType::F32, &[64]).unwrap();
            selftest::launch(Kernel::Guards, Variant::Correct, None, &out, guard, 64, 64)
                .unwrap_or_else(|e| panic!("guard {guard}, correct variant: {e}"));
            results.push(out.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect());
        }
        assert!(results.iter().all(|r| r == &results[0]), "guard {guard}: schedules disagree");
        // The planted bug is caught, under every schedule, with its own status.
        for d in &devices {
            let out = Tensor::zeros(d, DType::F32, &[64]).unwrap();
            let e = selftest::launch(Kernel::Guards, Variant::PlantedBug, None, &out, guard, 64, 64).unwrap_err();
            let (kernel, got, message) = emulation_error(&format!("guard {guard}"), e);
            assert_eq!(kernel, "selftest_guards");
            assert_eq!(got, status, "guard {guard}: {message}");
            for w in words {
                assert!(message.contains(w), "guard {guard}: {w:?} missing from {message:?}");
            }
        }
    }
    // The device still runs correct kernels after every failure.
    let d = Device::emulated();
    let out = Tensor::zeros(&d, DType::F32, &[64]).unwrap();
    selftest::launch(Kernel::Guards, Variant::Correct, None, &out, 4, 64, 64).unwrap();
}

#[test]
fn launch_bounds_are_enforced() {
    let d = Device::emulated();
    let out = Tensor::zeros(&d, DType::F32, &[512]).unwrap();
    // The host registry records each kernel's bound (static_checks compares it with .maxntid).
    let info = llama_kernels::backend::emulated_kernel_info("selftest_bounded_fill").unwrap();
    assert_eq!(info.max_threads, 128);
    selftest::launch(Kernel::BoundedFill, Variant::Correct, None, &out, 512, 512, 128).unwrap();
    assert!(out.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.0));
    let e = selftest::launch(Kernel::BoundedFill, Variant::Correct, None, &out, 512, 512, 256).unwrap_err();
    let (kernel, status, message) = emulation_error("256 threads", e);
    assert_eq!((kernel, status), ("selftest_bounded_fill", "launch bounds exceeded"), "{message}");
    assert!(message.contains("256 threads") && message.contains("__launch_bounds__ of 128"), "{message}");
    selftest::launch(Kernel::BoundedFill, Variant::Correct, None, &out, 512, 512, 96).unwrap();
}

#[test]
fn shared_memory_limits_follow_the_emulated_architecture() {
    use llama_kernels::{EmuArch, EmuOptions};
    const KIB: u32 = 1024;
    let stencil_static = llama_kernels::backend::emulated_kernel_info("selftest_stencil").unwrap();
    // The stencil's 1032-byte tile, padded by ptxas to the 128-byte alignment of dynamic shared
    // memory: what the GPU reserves.
    assert_eq!((stencil_static.static_smem_sm90, stencil_static.static_smem_sm80), (1152, 1152));
    assert_eq!(llama_kernels::backend::emulated_kernel_info("selftest_dyn_smem").unwrap().static_smem_sm90, 0);
    assert_eq!(EmuOptions::default().arch, EmuArch::Sm90);
    for (arch, limit) in
        [(EmuArch::Sm90, 227 * KIB), (EmuArch::Sm80, 163 * KIB), (EmuArch::Sm86, 99 * KIB), (EmuArch::Sm89, 99 * KIB)]
    {
        let d = Device::emulated_with(EmuOptions { arch, ..EmuOptions::default() });
        let n = 256;
        let x = Tensor::from_slice(&d, &vec![1.0f32; n], &[n]).unwrap();
        let y = Tensor::zeros(&d, DType::F32, &[n]).unwrap();
        assert_eq!(d.max_shared_memory_per_block(), limit as usize);
        // Dynamic only: up to the limit runs, one byte more is refused before the launch.
        let run = |kernel, dyn_smem| {
            selftest::launch_with_dyn_smem(kernel, Variant::Correct, Some(&x), &y, n, n, 256, Some(dyn_smem))
        };
        run(Kernel::DynSmem, limit).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
        let e = run(Kernel::DynSmem, limit + 1).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { name: "shared memory", .. }), "{arch:?}: {e}");
        // Static shared memory counts too: the stencil's 1152 bytes plus the rest of the limit.
        run(Kernel::Stencil, limit - 1152).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
        // The emulator refuses what the dynamic-only check lets through.
        let (_, status, message) = emulation_error("static", run(Kernel::Stencil, limit - 1151).unwrap_err());
        assert_eq!(status, "shared memory limit", "{arch:?}: {message}");
        let sm = format!("sm_{}", arch.compute_capability());
        assert!(message.contains("1152 static"), "{message}");
        assert!(message.contains(&format!("{limit} bytes per block of {sm}")), "{message}");
    }
}

#[test]
fn ftz_approximations_flush_subnormals_like_the_hardware() {
    // The special cases the PTX ISA defines for ex2.approx.ftz and rcp.approx.ftz, exactly (a
    // GPU gives the same bits), and __fadd_rn(__fmul_rn(x, x), c) rounding twice where one fma
    // would not (the host build never contracts).
    let sub = f32::from_bits(0x0000_0400); // a subnormal
    let xs = [
        0.0f32,
        -0.0,
        sub,
        -sub,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -127.5,               // 2^-127.5 is subnormal: flushed to +0
        -150.0,               // underflows
        2f32.powi(127),       // 1/x = 2^-127 is subnormal: flushed to +0
        -(2f32.powi(127)),    // ... to -0
        1.0 + 2f32.powi(-12), // x * x rounds, then + c: fma would keep 2^-24
        f32::NAN,
    ];
    let cs: Vec<f32> = xs.iter().map(|&x| -(x * x)).collect();
    let exp2 = [1.0f32, 1.0, 1.0, 1.0, f32::INFINITY, 0.0, 0.0, 0.0];
    let rcp = [f32::INFINITY, f32::NEG_INFINITY, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
    for device in common::devices() {
        let n = xs.len();
        let input: Vec<f32> = xs.iter().chain(&cs).copied().collect();
        let x = Tensor::from_slice(&device, &input, &[2 * n]).unwrap();
        let out = Tensor::poisoned(&device, DType::F32, &[3 * n]).unwrap();
        selftest::launch(Kernel::FastMath, Variant::Correct, Some(&x), &out, n, n, 64).unwrap();
        let got: Vec<f32> = out.to_vec().unwrap();
        let bits = |v: f32| v.to_bits();
        for (i, e) in exp2.iter().enumerate() {
            assert_eq!(bits(got[i]), bits(*e), "{device:?}: fast_exp2({:e}) = {:e}", xs[i], got[i]);
        }
        for (i, e) in rcp.iter().enumerate() {
            assert_eq!(bits(got[n + i]), bits(*e), "{device:?}: fast_rcp({:e}) = {:e}", xs[i], got[n + i]);
        }
        for i in [8, 9] {
            let e = if xs[i] > 0.0 { 0.0f32 } else { -0.0 };
            assert_eq!(bits(got[n + i]), bits(e), "{device:?}: fast_rcp({:e}) = {:e}", xs[i], got[n + i]);
        }
        assert!(got[n - 1].is_nan() && got[2 * n - 1].is_nan(), "{device:?}: NaN in, NaN out");
        for i in 0..n - 1 {
            let want = xs[i] * xs[i] + cs[i]; // two roundings (Rust never contracts)
            if want.is_nan() {
                assert!(got[2 * n + i].is_nan(), "{device:?}: x = {:e}", xs[i]);
            } else {
                assert_eq!(bits(got[2 * n + i]), bits(want), "{device:?}: x = {:e}", xs[i]);
            }
        }
        let fused = xs[10].mul_add(xs[10], cs[10]);
        assert_ne!(fused, 0.0, "the case must tell one rounding from two");
        assert_eq!(got[2 * n + 10], 0.0, "{device:?}: __fadd_rn(__fmul_rn(x, x), -(x * x)) must be 0");
    }
}

/// The emulator's __byte_perm, llk::prmt (prmt.b32's default mode, sign replication included) and
/// bf16 pair sum against scalar definitions, on
/// random words and selectors and on the selectors the packed GEMVs use; on a GPU the same test
/// compares the hardware instructions with the definitions.
#[test]
fn byte_perm_and_bf16_pair_sums_match_their_definitions() {
    use llama_kernels::dev::testing::Rng;
    // prmt.b32 (PTX ISA): byte n is byte (s_n & 7) of {y:x}, or its sign replicated when s_n & 8.
    let perm = |x: u32, y: u32, s: u32| {
        let v = (u64::from(y) << 32) | u64::from(x);
        let byte = |n: u32| {
            let sn = (s >> (4 * n)) & 15;
            let b = ((v >> (8 * (sn & 7))) & 0xff) as u32;
            if sn & 8 == 0 {
                b
            } else if b & 0x80 != 0 {
                0xff
            } else {
                0
            }
        };
        (0..4).map(|n| byte(n) << (8 * n)).fold(0, |a, b| a | b)
    };
    let bf16_sum = |a: u16, b: u16| {
        let f = |h: u16| f32::from_bits(u32::from(h) << 16);
        llama_kernels::dtype::round_to(DType::BF16, f64::from(f(a) + f(b)))
    };
    let mut rng = Rng::new(77);
    let mut words: Vec<[u32; 3]> =
        (0..200).map(|_| [rng.next_u64() as u32, rng.next_u64() as u32, rng.next_u64() as u32]).collect();
    for sel in [0x0504u32, 0x0706, 0x4440, 0x4441, 0x4442, 0x4443, 0x3210, 0x7654, 0x6240, 0x7351, 0xfc8b, 0x32107654] {
        words.push([0x0f3c_5a96, 0x4343_4343, sel]);
        words.push([0x1234_5678, 0x6464_6464, sel]);
    }
    // bf16 pairs whose sums round (128 + v minus 136, and halfway cases) or are exact.
    words.push([0x4300_4307, 0xc308_c308, 0]);
    words.push([0x3f80_3f81, 0x3b80_3b80, 0]);
    for device in common::devices() {
        let n = words.len();
        let input: Vec<f32> = words.iter().flatten().map(|&w| f32::from_bits(w)).collect();
        let x = Tensor::from_slice(&device, &input, &[3 * n]).unwrap();
        let out = Tensor::poisoned(&device, DType::I32, &[3 * n]).unwrap();
        selftest::launch(Kernel::BytePerm, Variant::Correct, Some(&x), &out, n, n, 64).unwrap();
        let got: Vec<i32> = out.to_vec().unwrap();
        for (i, &[x, y, s]) in words.iter().enumerate() {
            assert_eq!(got[3 * i] as u32, perm(x, y, s & 0x7777), "{device:?}: __byte_perm({x:#x}, {y:#x}, {s:#x})");
            assert_eq!(got[3 * i + 2] as u32, perm(x, y, s), "{device:?}: prmt({x:#x}, {y:#x}, {s:#x})");
            for h in 0..2 {
                let (a, b) = ((x >> (16 * h)) as u16, (y >> (16 * h)) as u16);
                let want = bf16_sum(a, b);
                let g = f32::from_bits(((got[3 * i + 1] as u32 >> (16 * h)) & 0xffff) << 16);
                if want.is_nan() {
                    assert!(g.is_nan(), "{device:?}: bf16 {a:#x} + {b:#x}");
                } else {
                    assert_eq!(f64::from(g), want, "{device:?}: bf16 {a:#x} + {b:#x}");
                }
            }
        }
    }
}

#[test]
fn a_kernel_runs_with_its_declared_shared_memory_and_no_more() {
    // selftest_declared_smem declares LLK_DECLARED_SMEM_TEST_BYTES (LLK_SMEM_FIXED): the launch
    // layer reads the declaration from the registry and requests exactly that, on every device.
    use llama_kernels::backend::{KernelRef, SharedMemory};
    use llama_kernels::dev::geometry::params::{LLK_DECLARED_SMEM_TEST_BLOCK, LLK_DECLARED_SMEM_TEST_BYTES};
    let kernel = KernelRef { module: "selftest", symbol: "selftest_declared_smem" };
    assert_eq!(kernel.shared_memory().unwrap(), SharedMemory::Fixed(LLK_DECLARED_SMEM_TEST_BYTES));
    let n = LLK_DECLARED_SMEM_TEST_BLOCK as usize;
    let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
    for device in common::devices() {
        let x = Tensor::from_slice(&device, &input, &[n]).unwrap();
        let y = Tensor::poisoned(&device, DType::F32, &[n]).unwrap();
        selftest::launch(Kernel::DeclaredSmem, Variant::Correct, Some(&x), &y, n, n, n).unwrap();
        let want: Vec<f32> = input.iter().rev().copied().collect();
        assert_eq!(y.to_vec::<f32>().unwrap(), want, "{device:?}");
        // A size of the launch's own for a kernel that declares one is refused by name, before
        // anything runs.
        let e =
            selftest::launch_with_dyn_smem(Kernel::DeclaredSmem, Variant::Correct, Some(&x), &y, n, n, n, Some(2048))
                .unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { name: "shared memory", .. }), "{e}");
        assert!(e.to_string().contains("selftest_declared_smem declares"), "{e}");
    }
    // A kernel that uses more than it declares: its write past the declaration is reported.
    let d = Device::emulated();
    let x = Tensor::from_slice(&d, &input, &[n]).unwrap();
    let y = Tensor::poisoned(&d, DType::F32, &[n]).unwrap();
    let e = selftest::launch(Kernel::DeclaredSmem, Variant::PlantedBug, Some(&x), &y, n, n, n).unwrap_err();
    let (kernel, status, message) = emulation_error("past the declaration", e);
    assert_eq!((kernel, status), ("selftest_declared_smem", "kernel trap"), "{message}");
    assert!(message.contains(&format!("past the {LLK_DECLARED_SMEM_TEST_BYTES} bytes")), "{message}");
}

#[test]
fn every_kernel_declares_its_dynamic_shared_memory() {
    // The tensor-core kernels carve a layout of their own out of dynamic shared memory and declare
    // its size; every other kernel declares none (only the emulator's self-tests size it at
    // launch). The declarations fit the largest architecture built for.
    use llama_kernels::backend::SharedMemory;
    let mut fixed = 0;
    for k in llama_kernels::dev::kernel_symbols() {
        match k.shared_memory().unwrap_or_else(|e| panic!("{}: {e}", k.symbol)) {
            SharedMemory::Fixed(bytes) => {
                assert!(
                    bytes > 0 && bytes as usize <= llama_kernels::EmuArch::Sm90.max_shared_memory_per_block(),
                    "{k:?}: {bytes}"
                );
                fixed += 1;
            }
            SharedMemory::AtLaunch => assert_eq!(k.module, "selftest", "{k:?} is sized at launch"),
            SharedMemory::None => {}
        }
        let tensor_core = ["attention_hd", "attention_sm90_", "paged_decode_hd", "moe_grouped_gemm", "qgemm_"]
            .iter()
            .any(|p| k.symbol.starts_with(p))
            && !k.symbol.ends_with("_f32");
        if tensor_core {
            assert!(matches!(k.shared_memory(), Ok(SharedMemory::Fixed(_))), "{k:?} declares no layout");
        }
    }
    assert!(fixed >= 40, "{fixed} kernels declare a fixed layout");
}
