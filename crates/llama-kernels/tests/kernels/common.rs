//! Shared test helpers: the devices every parity test runs on.
#![allow(dead_code)]

use llama_kernels::{CpAsyncTiming, Device, EmuArch, EmuOptions, Schedule};

/// The emulated target always; CUDA device 0 too when a GPU is usable (then the same tests run
/// on it automatically). The reason for skipping CUDA is printed, never hidden.
pub fn devices() -> Vec<Device> {
    let mut v = vec![Device::emulated()];
    match Device::cuda(0) {
        Ok(d) => v.push(d),
        Err(e) => eprintln!("note: CUDA not tested here: {e}"),
    }
    v
}

/// Emulated devices whose schedules differ (forward, reverse, seeded random, and one warp at a
/// time from the last), with cp.async copies landing at the wait or at the issue.
pub fn schedule_devices() -> [Device; 4] {
    schedule_devices_on(EmuArch::Sm90)
}

/// The schedules of [`schedule_devices`], emulating `arch` (its shared-memory limits, and so the
/// kernel configurations the ops pick for it).
pub fn schedule_devices_on(arch: EmuArch) -> [Device; 4] {
    let dev =
        |schedule, cp_async| Device::emulated_with(EmuOptions { schedule, cp_async, arch, ..EmuOptions::default() });
    [
        dev(Schedule::Forward, CpAsyncTiming::AtWait),
        dev(Schedule::Reverse, CpAsyncTiming::AtIssue),
        dev(Schedule::Random { seed: 0x1234_5678 }, CpAsyncTiming::AtWait),
        dev(Schedule::WarpByWarp { reverse: true }, CpAsyncTiming::AtIssue),
    ]
}

/// Bitwise equality of f64 vectors that came from kernel outputs (NaN == NaN when bits agree).
pub fn bitwise_equal(a: &[Vec<f64>], b: &[Vec<f64>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()))
}

/// Runs a case under the three schedules: every run passes, and all outputs agree bit for bit.
pub fn assert_schedules_agree(
    what: &str,
    run: impl Fn(&Device) -> llama_kernels::Result<llama_kernels::dev::verify::CaseResult>,
) {
    assert_schedules_agree_on(EmuArch::Sm90, what, run)
}

/// [`assert_schedules_agree`] on an emulated `arch`.
pub fn assert_schedules_agree_on(
    arch: EmuArch,
    what: &str,
    run: impl Fn(&Device) -> llama_kernels::Result<llama_kernels::dev::verify::CaseResult>,
) {
    let runs: Vec<_> =
        schedule_devices_on(arch).iter().map(|d| run(d).unwrap_or_else(|e| panic!("{what}: {e}"))).collect();
    for r in &runs {
        assert!(r.pass, "{}", r.describe());
        assert!(bitwise_equal(&runs[0].outputs, &r.outputs), "{what}: schedules disagree");
    }
}

/// Every emulator schedule (forward, reverse, seeded random, warp by warp both ways) under each
/// of `timings`.
pub fn every_schedule(timings: &[CpAsyncTiming]) -> Vec<Device> {
    let schedules = [
        Schedule::Forward,
        Schedule::Reverse,
        Schedule::Random { seed: 0x5eed },
        Schedule::WarpByWarp { reverse: false },
        Schedule::WarpByWarp { reverse: true },
    ];
    schedules
        .iter()
        .flat_map(|&schedule| {
            timings
                .iter()
                .map(move |&cp_async| Device::emulated_with(EmuOptions { schedule, cp_async, ..EmuOptions::default() }))
        })
        .collect()
}

/// A planted bug's launch failed in `kernel` with `status`, and the message names every word of
/// `words`; `context` says which bug and device, for the failure message.
pub fn assert_reported<T>(result: llama_kernels::Result<T>, kernel: &str, status: &str, words: &[&str], context: &str) {
    let e = match result {
        Ok(_) => panic!("{context}: the launch succeeded"),
        Err(e) => e,
    };
    let llama_kernels::Error::Emulation { kernel: got_kernel, status: got, message } = e else {
        panic!("{context}: not an emulation error: {e}")
    };
    assert_eq!((got_kernel, got), (kernel, status), "{context}: {message}");
    for w in words {
        assert!(message.contains(w), "{context}: {message:?} lacks {w:?}");
    }
}

/// On how many of `devices` a planted race shows: the launch fails with an emulation error, or
/// `wrong` says its output is not the expected one. Any other error panics.
pub fn devices_catching<T>(
    devices: &[Device],
    run: impl Fn(&Device) -> llama_kernels::Result<T>,
    wrong: impl Fn(&T) -> bool,
) -> usize {
    devices
        .iter()
        .filter(|d| match run(d) {
            Err(llama_kernels::Error::Emulation { .. }) => true,
            Err(e) => panic!("{d:?}: {e}"),
            Ok(got) => wrong(&got),
        })
        .count()
}

/// The largest `|central difference - grad[i]|` over the entries of `x`, with `loss` the scalar
/// function whose gradient at `x` `grad` claims to be (step 1e-6, f64).
pub fn central_difference_error(x: &[f64], grad: &[f64], loss: impl Fn(&[f64]) -> f64) -> f64 {
    let h = 1e-6;
    let mut worst: f64 = 0.0;
    let mut p = x.to_vec();
    for i in 0..x.len() {
        p[i] = x[i] + h;
        let up = loss(&p);
        p[i] = x[i] - h;
        let down = loss(&p);
        p[i] = x[i];
        worst = worst.max(((up - down) / (2.0 * h) - grad[i]).abs());
    }
    worst
}
