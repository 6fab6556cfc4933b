//! Shared benchmark support: GPU detection, CUDA-event timing, the copy-bandwidth yardstick, and
//! the summary table (time, bytes, GB/s, fraction of copy bandwidth or TFLOP/s).
#![allow(dead_code)]

use std::time::Duration;

use criterion::Criterion;
use llama_kernels::{DType, Device, Error, Tensor};

/// CUDA device 0, or `None` after printing why there is nothing to measure.
pub fn gpu_or_explain(bench: &str) -> Option<Device> {
    match Device::cuda(0) {
        Ok(d) => {
            println!("{bench}: {}", d.description());
            Some(d)
        }
        Err(e) => {
            println!("{bench}: no GPU here ({e}); GPU benchmarks measure nothing on this machine.");
            None
        }
    }
}

/// Criterion tuned for GPU kernels timed by events: short warm-up, enough samples.
pub fn criterion() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(600))
        .sample_size(10)
        .configure_from_args()
}

/// Mean GPU time of one call of `f`, in microseconds, from CUDA events around `iters` calls.
/// `f` may return the kernel crate's error or any error that wraps it (the model crate's).
pub fn gpu_time_us<E: From<Error> + std::fmt::Debug>(
    device: &Device,
    iters: usize,
    mut f: impl FnMut() -> std::result::Result<(), E>,
) -> f64 {
    f().expect("warm-up launch");
    device.synchronize().expect("sync");
    let ms = device.time_with_events(iters, &mut f).expect("timed launches").expect("CUDA events on a GPU");
    ms * 1e3 / iters as f64
}

/// The H200's L2 holds 50-60 MB: a working set below this is flushed before each timed call.
pub const L2_FLUSH_BELOW_BYTES: f64 = 120e6;

/// Mean GPU time of one call (microseconds) for the summary tables, measured cold: when the
/// call's working set (`bytes`) would fit in the L2 cache, every call is timed alone after a
/// 256 MiB device copy that evicts it, so bandwidth is not overstated by cache hits. Larger working
/// sets are timed back to back (they cannot stay in the L2 anyway).
pub fn summary_time_us<E: From<Error> + std::fmt::Debug>(
    device: &Device,
    iters: usize,
    bytes: f64,
    mut f: impl FnMut() -> std::result::Result<(), E>,
) -> f64 {
    if bytes >= L2_FLUSH_BELOW_BYTES {
        return gpu_time_us(device, iters, f);
    }
    thread_local!(static FLUSH: std::cell::RefCell<Option<(Tensor, Tensor)>> = const { std::cell::RefCell::new(None) });
    let flush = FLUSH.with(|cell| {
        cell.borrow_mut()
            .get_or_insert_with(|| {
                let n = 1usize << 27; // bf16 elements: 256 MiB each
                (
                    Tensor::zeros(device, DType::BF16, &[n]).expect("alloc"),
                    Tensor::zeros(device, DType::BF16, &[n]).expect("alloc"),
                )
            })
            .clone()
    });
    f().expect("warm-up launch");
    let ms = device
        .time_each_with_events(iters, || flush.1.copy_from(&flush.0).map_err(E::from), &mut f)
        .expect("timed launches")
        .expect("CUDA events on a GPU");
    ms * 1e3 / iters as f64
}

/// Criterion's custom timing: CUDA-event time of `iters` launches.
pub fn event_duration<E: From<Error> + std::fmt::Debug>(
    device: &Device,
    iters: u64,
    f: &mut dyn FnMut() -> std::result::Result<(), E>,
) -> Duration {
    let ms = device.time_with_events(iters as usize, f).expect("timed launches").expect("CUDA events on a GPU");
    Duration::from_secs_f64(ms / 1e3)
}

/// Device-to-device copy bandwidth (bytes read + bytes written per second), 1 GiB each way.
pub fn copy_bandwidth_gbs(device: &Device) -> f64 {
    let n = 1usize << 29; // bf16 elements: 1 GiB
    let a = Tensor::zeros(device, DType::BF16, &[n]).expect("alloc");
    let b = Tensor::zeros(device, DType::BF16, &[n]).expect("alloc");
    let us = gpu_time_us(device, 20, || b.copy_from(&a));
    let gbs = 2.0 * (n * 2) as f64 / (us * 1e-6) / 1e9;
    println!("copy yardstick: 1 GiB device-to-device in {us:.1} us = {gbs:.0} GB/s (read + write)");
    gbs
}

/// One row of the summary table.
pub struct Row {
    pub name: String,
    pub us: f64,
    pub bytes: f64,
    pub flops: f64,
}

pub fn print_memory_table(title: &str, rows: &[Row], copy_gbs: f64) {
    println!("\n{title}");
    println!("{:<48} {:>10} {:>12} {:>9} {:>8}", "case", "time us", "bytes", "GB/s", "% copy");
    for r in rows {
        let gbs = r.bytes / (r.us * 1e-6) / 1e9;
        println!("{:<48} {:>10.2} {:>12.0} {:>9.0} {:>7.1}%", r.name, r.us, r.bytes, gbs, 100.0 * gbs / copy_gbs);
    }
}

pub fn print_flops_table(title: &str, rows: &[Row]) {
    println!("\n{title}");
    println!("{:<56} {:>10} {:>10}", "case", "time us", "TFLOP/s");
    for r in rows {
        println!("{:<56} {:>10.1} {:>10.1}", r.name, r.us, r.flops / (r.us * 1e-6) / 1e12);
    }
}

/// Fills `data` in parallel (every core), in chunks of `unit * k` elements (whole rows when
/// `unit` is a row), calling `f(rng, chunk)` with a generator seeded by `seed` and the chunk's
/// index: the same values on any number of cores. For weights too large to draw one value at a
/// time (a 128256 x 4096 LM head) within a few seconds.
pub fn par_fill<T: Send>(
    data: &mut [T],
    unit: usize,
    seed: u64,
    f: impl Fn(&mut llama_kernels::dev::testing::Rng, &mut [T]) + Sync,
) {
    let unit = unit.max(1);
    let chunk = unit * (1usize << 20).div_ceil(unit);
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(1, 64);
    let mut groups: Vec<Vec<(usize, &mut [T])>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, c) in data.chunks_mut(chunk).enumerate() {
        groups[i % threads].push((i, c));
    }
    std::thread::scope(|s| {
        for group in groups {
            let f = &f;
            s.spawn(move || {
                for (i, c) in group {
                    let mut rng = llama_kernels::dev::testing::Rng::new(
                        seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    );
                    f(&mut rng, c);
                }
            });
        }
    });
}

/// Random bytes, eight per draw.
pub fn random_bytes(rng: &mut llama_kernels::dev::testing::Rng, out: &mut [u8]) {
    let mut words = out.chunks_exact_mut(8);
    for w in &mut words {
        w.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let rest = words.into_remainder();
    let last = rng.next_u64().to_le_bytes();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
}

/// Values uniform in [-a, a) with a = sqrt(3) std (standard deviation `std`), in parallel.
pub fn par_uniform(data: &mut [f32], std: f64, seed: u64) {
    let a = (3f64.sqrt() * std) as f32;
    par_fill(data, 1, seed, |rng, c| {
        for v in c.iter_mut() {
            // 24 random bits -> [-1, 1).
            *v = a * ((rng.next_u64() >> 40) as f32 * (2.0 / (1u64 << 24) as f32) - 1.0);
        }
    });
}
