//! Shared test helpers: the devices every parity test runs on.
#![allow(dead_code)]

use llama_kernels::{Device, EmuOptions, Schedule};

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

/// Three emulated devices whose schedules differ: forward, reverse and seeded random.
pub fn schedule_devices() -> [Device; 3] {
    [
        Device::emulated_with(EmuOptions::with_schedule(Schedule::Forward)),
        Device::emulated_with(EmuOptions::with_schedule(Schedule::Reverse)),
        Device::emulated_with(EmuOptions::with_schedule(Schedule::Random { seed: 0x1234_5678 })),
    ]
}

/// Bitwise equality of f64 vectors that came from kernel outputs (NaN == NaN when bits agree).
pub fn bitwise_equal(a: &[Vec<f64>], b: &[Vec<f64>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()))
}
