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
