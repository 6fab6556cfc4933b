//! Tests of the emulation runtime itself, through the self-test kernels.

mod common;

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
