//! The emulator's mbarriers and bulk copies (kernels/emu/emu_async.h) through
//! `selftest_mbarrier`: a producer warp fills a ring of shared-memory stages by
//! `cp.async.bulk`, announced on each stage's "full" mbarrier with `arrive.expect_tx`, and the
//! consumers hand each stage back on its "empty" mbarrier. The pipeline must give the same
//! exact result under every schedule and both completion timings, with rings that wrap many
//! times; each planted misuse of the protocol must be reported, or change the result under some
//! schedule.

use crate::common;

use llama_kernels::dev::selftest::{
    self, Kernel, MBARRIER_DATA, MBARRIER_MAX_STAGES, MBARRIER_MAX_TILES, MBARRIER_TILE,
};
use llama_kernels::dev::testing::Rng;
use llama_kernels::{CpAsyncTiming, DType, Device, EmuOptions, Error, Target, Tensor};
use selftest::Variant;

/// Every schedule under both completion timings.
fn devices() -> Vec<Device> {
    common::every_schedule(&[CpAsyncTiming::AtWait, CpAsyncTiming::AtIssue])
}

/// The kernel's input words (header, then the tiles) and the output it must write.
fn setup(tiles: usize, stages: usize, copies: usize, seed: u64) -> (Vec<u32>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let mut input = vec![0u32; MBARRIER_DATA + MBARRIER_MAX_TILES * MBARRIER_TILE];
    input[..3].copy_from_slice(&[tiles as u32, stages as u32, copies as u32]);
    let mut want = Vec::with_capacity(tiles * MBARRIER_TILE);
    for i in 0..tiles {
        for c in 0..MBARRIER_TILE {
            let x = rng.normal() as f32;
            input[MBARRIER_DATA + i * MBARRIER_TILE + c] = x.to_bits();
            want.push(x * 2.0 + i as f32);
        }
    }
    (input, want)
}

/// Runs the kernel; returns the whole output buffer (poisoned where the kernel did not write).
fn run(device: &Device, variant: Variant, input: &[u32]) -> Result<Vec<u32>, Error> {
    let x: Vec<f32> = input.iter().map(|&w| f32::from_bits(w)).collect();
    let x = Tensor::from_slice(device, &x, &[x.len()])?;
    let out = Tensor::poisoned(device, DType::F32, &[MBARRIER_MAX_TILES * MBARRIER_TILE])?;
    selftest::launch(Kernel::Mbarrier, variant, Some(&x), &out, 0, 0, 0)?;
    Ok(out.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect())
}

/// The first element where `got` (as bits) differs from `want`, or where the kernel wrote past it
/// (the poison there is a NaN pattern).
fn first_difference(got: &[u32], want: &[f32]) -> Option<usize> {
    got.iter().enumerate().position(|(i, &g)| want.get(i).map_or(!f32::from_bits(g).is_nan(), |w| g != w.to_bits()))
}

#[test]
fn a_pipeline_through_a_ring_of_stages_is_exact_under_every_schedule_and_timing() {
    let empty = run(&Device::emulated(), Variant::Correct, &setup(0, 1, 1, 0).0).unwrap();
    assert!(first_difference(&empty, &[]).is_none(), "an empty pipeline writes nothing");
    for (tiles, stages, copies) in
        [(1, 1, 1), (7, 3, 1), (7, 3, 2), (5, 1, 2), (MBARRIER_MAX_TILES, MBARRIER_MAX_STAGES, 2), (3, 4, 1)]
    {
        let (input, want) = setup(tiles, stages, copies, 17 + tiles as u64);
        // And on a GPU of sm_90 or later, when one is usable: the hardware runs the same pipeline.
        let gpus =
            common::devices().into_iter().filter(|d| d.target() == Target::Cuda && d.ptx_arch() == Some("sm_90"));
        for device in devices().into_iter().chain(gpus) {
            let got = run(&device, Variant::Correct, &input)
                .unwrap_or_else(|e| panic!("{tiles} tiles, {stages} stages, {copies} copies, {device:?}: {e}"));
            if let Some(i) = first_difference(&got, &want) {
                panic!(
                    "{tiles} tiles, {stages} stages, {copies} copies, {device:?}: out[{}][{}] = {} want {:?}",
                    i / MBARRIER_TILE,
                    i % MBARRIER_TILE,
                    f32::from_bits(got[i]),
                    want.get(i)
                );
            }
        }
    }
}

fn planted(bug: u32) -> (Vec<u32>, Vec<f32>) {
    let (mut input, want) = setup(7, 3, 2, 99);
    input[3] = bug;
    (input, want)
}

#[test]
fn protocol_errors_are_reported_under_every_schedule_and_timing() {
    for (bug, status, words) in [
        (1, "deadlock", &["at mbarriers", "16 tx bytes pending"][..]),
        (2, "kernel trap", &["complete_tx crossed a phase", "selftest.cu:"][..]),
        (5, "kernel trap", &["before its mbarrier.init", "selftest.cu:"][..]),
        (6, "kernel trap", &["more arrivals", "selftest.cu:"][..]),
        (7, "misaligned access", &["multiple of 16 bytes"][..]),
    ] {
        let (input, _) = planted(bug);
        for device in devices() {
            run(&device, Variant::Correct, &input).unwrap_or_else(|e| panic!("bug {bug}'s case, {device:?}: {e}"));
            let context = format!("bug {bug}, {device:?}");
            common::assert_reported(
                run(&device, Variant::PlantedBug, &input),
                "selftest_mbarrier",
                status,
                words,
                &context,
            );
        }
    }
}

#[test]
fn a_missing_wait_fails_or_changes_the_result_under_some_schedule() {
    // Bug 3: the consumers read a stage without waiting for it to fill; bug 4: the producer
    // refills a stage without waiting for the consumers to empty it. Neither is an error the
    // emulator can name at the point of the bug; each must show up as a failed launch (a
    // deadlock, copies left in flight) or a wrong result under some schedule and timing.
    for bug in [3, 4] {
        let (input, want) = planted(bug);
        let caught = common::devices_catching(
            &devices(),
            |d| run(d, Variant::PlantedBug, &input),
            |got| first_difference(got, &want).is_some(),
        );
        assert!(caught > 0, "bug {bug} passes under every schedule and timing");
    }
    // At the latest completion, a consumer that does not wait reads the NaN pattern of a stage
    // whose copy is in flight (or the launch stops first: the producer's next arrival on a
    // phase still waiting for its bytes is one too many).
    let (input, _) = planted(3);
    let late = Device::emulated_with(EmuOptions { cp_async: CpAsyncTiming::AtWait, ..EmuOptions::default() });
    match run(&late, Variant::PlantedBug, &input) {
        Err(Error::Emulation { .. }) => {}
        Err(e) => panic!("bug 3 at the latest completion: {e}"),
        Ok(got) => assert!(got.iter().any(|&v| f32::from_bits(v).is_nan()), "bug 3 read no poison"),
    }
}
