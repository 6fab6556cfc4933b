//! The emulator's named barriers, setmaxnreg and elect.sync (kernels/emu/emu_warp_specialize.h)
//! through `selftest_warp_specialize`: two warpgroups hand one shared-memory slot back and forth
//! on two named barriers for several rounds (the ping-pong of a warp-specialized kernel), after
//! setmaxnreg moves registers between them, and every warp elects a lane. The result must be
//! exact under every schedule; each planted misuse must be reported, or change the result under
//! some schedule.

use crate::common;

use llama_kernels::dev::selftest::{self, Kernel, Variant, WS_DATA, WS_MAX_ROUNDS};
use llama_kernels::dev::testing::Rng;
use llama_kernels::{CpAsyncTiming, DType, Device, Error, Target, Tensor};

fn devices() -> Vec<Device> {
    common::every_schedule(&[CpAsyncTiming::AtWait])
}

/// The input words and the expected output (rounds x 128, then lane 0 for each of 8 warps).
fn setup(rounds: usize, seed: u64) -> (Vec<u32>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let mut input = vec![0u32; WS_DATA + WS_MAX_ROUNDS * 128];
    input[0] = rounds as u32;
    let mut want = Vec::new();
    for r in 0..rounds {
        for i in 0..128 {
            let x = rng.normal() as f32;
            input[WS_DATA + r * 128 + i] = x.to_bits();
            want.push(x * 3.0 + r as f32);
        }
    }
    want.extend([0.0; 8]);
    (input, want)
}

fn run(device: &Device, variant: Variant, input: &[u32]) -> Result<Vec<f32>, Error> {
    let x: Vec<f32> = input.iter().map(|&w| f32::from_bits(w)).collect();
    let x = Tensor::from_slice(device, &x, &[x.len()])?;
    let out = Tensor::poisoned(device, DType::F32, &[WS_MAX_ROUNDS * 128 + 8])?;
    selftest::launch(Kernel::WarpSpecialize, variant, Some(&x), &out, 0, 0, 0)?;
    out.to_vec()
}

/// The first element that differs from `want` bit for bit, or that was written past it.
fn first_difference(got: &[f32], want: &[f32]) -> Option<usize> {
    got.iter().enumerate().position(|(i, g)| want.get(i).map_or(!g.is_nan(), |w| g.to_bits() != w.to_bits()))
}

#[test]
fn two_warpgroups_take_turns_on_named_barriers_exactly_under_every_schedule() {
    let gpus = common::devices().into_iter().filter(|d| d.target() == Target::Cuda && d.ptx_arch() == Some("sm_90"));
    let all: Vec<Device> = devices().into_iter().chain(gpus).collect();
    for rounds in [0, 1, 2, 5, WS_MAX_ROUNDS] {
        let (input, want) = setup(rounds, 40 + rounds as u64);
        for device in &all {
            let got =
                run(device, Variant::Correct, &input).unwrap_or_else(|e| panic!("{rounds} rounds, {device:?}: {e}"));
            if let Some(i) = first_difference(&got, &want) {
                panic!("{rounds} rounds, {device:?}: out[{i}] = {} want {:?}", got[i], want.get(i));
            }
        }
    }
}

#[test]
fn misuse_is_reported_under_every_schedule() {
    for (bug, status, words) in [
        (1, "deadlock", &["at named barriers"][..]),
        (5, "unsupported operation", &["named barrier id outside 1..15"][..]),
        (6, "kernel trap", &["setmaxnreg for different counts", "selftest.cu:"][..]),
        (7, "deadlock", &["at warp operations"][..]),
    ] {
        let (mut input, _) = setup(4, 5);
        input[1] = bug;
        for device in devices() {
            run(&device, Variant::Correct, &input).unwrap_or_else(|e| panic!("bug {bug}'s case, {device:?}: {e}"));
            let context = format!("bug {bug}, {device:?}");
            common::assert_reported(
                run(&device, Variant::PlantedBug, &input),
                "selftest_warp_specialize",
                status,
                words,
                &context,
            );
        }
    }
}

#[test]
fn two_counts_on_one_barrier_are_reported_when_they_meet_in_a_phase() {
    // Bug 4: the producer counts 128 threads at barrier 1, the consumers 256. Where one side
    // opens a phase the other joins, the second count is reported; where the producer's 128
    // complete a phase of their own, the consumers wait for ever: a deadlock report.
    let (mut input, _) = setup(4, 5);
    input[1] = 4;
    let mut named = 0;
    for device in devices() {
        let e = run(&device, Variant::PlantedBug, &input).unwrap_err();
        let Error::Emulation { status, message, .. } = e else { panic!("{e}") };
        match status {
            "kernel trap" => {
                let both = ["used with 128 threads while a phase of 256", "used with 256 threads while a phase of 128"];
                assert!(both.iter().any(|w| message.contains(w)), "{device:?}: {message}");
                named += 1;
            }
            "deadlock" => assert!(message.contains("at named barriers"), "{device:?}: {message}"),
            other => panic!("{device:?}: {other}: {message}"),
        }
    }
    assert!(named > 0, "no schedule reports the two counts");
}

#[test]
fn a_missing_wait_fails_or_changes_the_result_under_some_schedule() {
    // Bug 2: the consumers read the slot without waiting for it; bug 3: the producer refills it
    // without waiting for the consumers.
    for bug in [2, 3] {
        let (mut input, want) = setup(4, 6);
        input[1] = bug;
        let caught = common::devices_catching(
            &devices(),
            |d| run(d, Variant::PlantedBug, &input),
            |got| first_difference(got, &want).is_some(),
        );
        assert!(caught > 0, "bug {bug} passes under every schedule");
    }
}
