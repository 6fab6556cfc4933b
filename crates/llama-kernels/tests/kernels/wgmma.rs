//! The emulator's wgmma.mma_async (kernels/emu/emu_wgmma.h) against the PTX ISA's definitions,
//! through `selftest_wgmma`: shared-memory images laid out here from the ISA's canonical layouts
//! (written in CuTe's shape:stride form, as the ISA's table gives them) and Swizzle<b,4,3>, the
//! accumulators read back through the ISA's fragment layout, under every schedule and both
//! completion timings; then each planted misuse of the asynchronous protocol.
//!
//! The inputs are small integers, so every product and sum is exact in f32 and the results are
//! compared bit for bit with the f64 product.

use crate::common;

use llama_kernels::dev::selftest::{
    self, Kernel, Variant, WGMMA_A_FRAGMENTS, WGMMA_ACCUMULATORS, WGMMA_IMAGE, WGMMA_SMEM_BYTES,
};
use llama_kernels::dev::testing::Rng;
use llama_kernels::{CpAsyncTiming, DType, Device, EmuOptions, Error, Schedule, Tensor};

/// One case of the kernel (its template arguments, kernels/selftest.cu `wgmma_kernel`).
#[derive(Clone, Copy, Debug)]
struct Case {
    id: u32,
    bf16: bool,
    n: usize,
    a_in_regs: bool,
    a_mn_major: bool,
    b_mn_major: bool,
}

const CASES: [Case; 5] = [
    Case { id: 0, bf16: true, n: 64, a_in_regs: false, a_mn_major: false, b_mn_major: false },
    Case { id: 1, bf16: true, n: 64, a_in_regs: true, a_mn_major: false, b_mn_major: true },
    Case { id: 2, bf16: false, n: 8, a_in_regs: false, a_mn_major: true, b_mn_major: true },
    Case { id: 3, bf16: true, n: 256, a_in_regs: false, a_mn_major: false, b_mn_major: true },
    Case { id: 4, bf16: false, n: 24, a_in_regs: true, a_mn_major: false, b_mn_major: false },
];

/// A descriptor operand: swizzle width in bytes (0: none) and the descriptor fields.
#[derive(Clone, Copy, Debug)]
struct Operand {
    swizzle: u32,
    mn_major: bool,
    lbo: u32,
    sbo: u32,
    start: u32, // byte offset in shared memory (the atom's base is `start` rounded down to 1024)
}

impl Operand {
    /// Strides for an operand of `mn` rows (M or N) by 16 k, padded so that no stride is the
    /// dense one by accident.
    fn new(swizzle: u32, mn_major: bool, mn: u32, base: u32) -> Operand {
        let (lbo, sbo) = match (mn_major, swizzle) {
            (false, 0) => (128 * (mn / 8) + 64, 128), // k halves apart, 8-row groups adjacent
            (false, w) => (16, 8 * w),                // lbo unused ("assumed 1")
            (true, 0) => (128 * (mn / 8) + 32, 128),  // k groups apart, mn groups adjacent
            (true, w) => (2 * 8 * w + 1024, 8 * w),   // mn atoms after both k groups (+ a gap)
        };
        // K-major 64/128-byte swizzles: start at k 16 of the atom (the advance along K inside
        // a swizzle row that a kernel makes by moving the start address).
        let start = if !mn_major && swizzle >= 64 { base + 32 } else { base };
        Operand { swizzle, mn_major, lbo, sbo, start }
    }
    fn code(&self) -> u32 {
        match self.swizzle {
            0 => 0,
            128 => 1,
            64 => 2,
            32 => 3,
            w => panic!("swizzle {w}"),
        }
    }
    /// The byte address of element (mn, k), from the ISA's canonical layouts in elements of 2
    /// bytes (T = 8 elements = 16 bytes; x = swizzle bytes / 16):
    ///   K-major:  ((8,m),(T,2)):((1T,SBO),(1,LBO)) or, swizzled, ((8,m),(T,2)):((xT,SBO),(1,T))
    ///   MN-major: ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)) or ((T,x,m),(8,k)):((1,T,LBO),(xT,SBO))
    /// then Swizzle<b,4,3> on the absolute byte address (b = log2 x).
    fn address(&self, mn: u32, k: u32) -> u32 {
        const T: u32 = 8;
        let (lbo, sbo) = (self.lbo / 2, self.sbo / 2);
        let x = self.swizzle / 16;
        let elems = match (self.mn_major, x) {
            (false, 0) => (mn % 8) * T + (mn / 8) * sbo + (k % T) + (k / T) * lbo,
            (false, x) => (mn % 8) * x * T + (mn / 8) * sbo + (k % T) + (k / T) * T,
            (true, 0) => (mn % T) + (mn / T) * sbo + (k % 8) * T + (k / 8) * lbo,
            (true, x) => (mn % T) + (mn / T % x) * T + (mn / (T * x)) * lbo + (k % 8) * x * T + (k / 8) * sbo,
        };
        let addr = self.start + 2 * elems;
        let b = if x == 0 { 0 } else { x.trailing_zeros() }; // 0, 1, 2, 3 for none, 32, 64, 128 bytes
        let yyy = ((1u32 << b) - 1) << 7;
        addr ^ ((addr & yyy) >> 3)
    }
}

fn to_bits(bf16: bool, v: f32) -> u16 {
    if bf16 { (v.to_bits() >> 16) as u16 } else { half::f16::from_f32(v).to_bits() }
}

/// The kernel's input and the expected accumulators ([128][n/2], each thread's d[i]).
struct Setup {
    input: Vec<u32>,
    want: Vec<f32>,
}

fn setup(case: Case, a: Operand, b: Operand, issues: u32, accumulate: bool, seed: u64) -> Setup {
    let n = case.n;
    let mut rng = Rng::new(seed);
    let mut small = |lo: i64, span: u64| (lo + (rng.next_u64() % span) as i64) as f32;
    let am: Vec<f32> = (0..64 * 16).map(|_| small(-2, 5) * 0.5).collect(); // A[m][k]
    let bm: Vec<f32> = (0..16 * n).map(|_| small(-3, 7)).collect(); // B[k][c]
    let cm: Vec<f32> = (0..64 * n).map(|_| small(-8, 17)).collect(); // C[m][c]
    let mut input = vec![0u32; WGMMA_IMAGE + WGMMA_SMEM_BYTES / 4];
    let mut image = vec![0xffu8; WGMMA_SMEM_BYTES]; // NaN wherever no element belongs
    let mut put = |addr: u32, bits: u16| {
        let at = addr as usize;
        assert!(at + 2 <= WGMMA_SMEM_BYTES, "test layout outside the image");
        assert_eq!(&image[at..at + 2], &[0xff, 0xff], "two elements at byte {at}");
        image[at..at + 2].copy_from_slice(&bits.to_le_bytes());
    };
    if !case.a_in_regs {
        for m in 0..64 {
            for k in 0..16 {
                put(a.address(m, k), to_bits(case.bf16, am[(m * 16 + k) as usize]));
            }
        }
    }
    for c in 0..n as u32 {
        for k in 0..16 {
            put(b.address(c, k), to_bits(case.bf16, bm[(k as usize) * n + c as usize]));
        }
    }
    // Fragments: thread t, warp w, g = lane / 4, q = lane % 4.
    let d_coord = |t: usize, i: usize| {
        let (w, g, q) = (t / 32, (t % 32) / 4, t % 4);
        (16 * w + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * q + (i & 1))
    };
    let mut want = vec![0f32; 128 * n / 2];
    for t in 0..128 {
        for i in 0..n / 2 {
            let (row, col) = d_coord(t, i);
            let c = cm[row * n + col];
            input[WGMMA_ACCUMULATORS + t * n / 2 + i] = c.to_bits();
            let ab: f64 = (0..16).map(|k| f64::from(am[row * 16 + k]) * f64::from(bm[k * n + col])).sum();
            let init = if accumulate { f64::from(c) } else { 0.0 };
            want[t * n / 2 + i] = (init + f64::from(issues) * ab) as f32;
        }
        let (w, g, q) = (t / 32, (t % 32) / 4, t % 4);
        for r in 0..4 {
            let (row, k) = (16 * w + g + 8 * (r & 1), 2 * q + 8 * (r >> 1));
            let lo = to_bits(case.bf16, am[row * 16 + k]);
            let hi = to_bits(case.bf16, am[row * 16 + k + 1]);
            input[WGMMA_A_FRAGMENTS + 4 * t + r] = u32::from(lo) | (u32::from(hi) << 16);
        }
    }
    let used = image.iter().rposition(|&b| b != 0xff).map_or(0, |p| (p + 16) & !15);
    for (i, chunk) in image.chunks(4).enumerate() {
        input[WGMMA_IMAGE + i] = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    let header = [
        case.id,
        a.code(),
        a.lbo,
        a.sbo,
        b.code(),
        b.lbo,
        b.sbo,
        u32::from(accumulate),
        used as u32,
        a.start,
        b.start,
        issues,
        0,
    ];
    input[..header.len()].copy_from_slice(&header);
    Setup { input, want }
}

/// Runs the kernel; returns the bits of the [128][n/2] accumulators it wrote.
fn run(device: &Device, variant: Variant, input: &[u32]) -> Result<Vec<u32>, Error> {
    let case = CASES.iter().find(|c| c.id == input[0]).expect("a known case");
    let x: Vec<f32> = input.iter().map(|&w| f32::from_bits(w)).collect();
    let x = Tensor::from_slice(device, &x, &[x.len()])?;
    let out = Tensor::poisoned(device, DType::F32, &[128 * 128])?;
    selftest::launch(Kernel::Wgmma, variant, Some(&x), &out, 0, 128, 128)?;
    let got: Vec<f32> = out.to_vec()?;
    Ok(got[..128 * case.n / 2].iter().map(|v| v.to_bits()).collect())
}

const SWIZZLES: [u32; 4] = [0, 32, 64, 128];

#[test]
fn wgmma_follows_the_isa_layouts_for_every_swizzle_major_ness_and_shape() {
    for case in CASES {
        for (s, &swizzle) in SWIZZLES.iter().enumerate() {
            let a = Operand::new(SWIZZLES[(s + 1) % 4], case.a_mn_major, 64, 0);
            let b = Operand::new(swizzle, case.b_mn_major, case.n as u32, 16384);
            for (issues, accumulate) in [(1, true), (2, false)] {
                let su = setup(case, a, b, issues, accumulate, 1000 + u64::from(case.id) * 10 + s as u64);
                for device in common::schedule_devices() {
                    let got =
                        run(&device, Variant::Correct, &su.input).unwrap_or_else(|e| panic!("{case:?} {b:?}: {e}"));
                    let bad = got.iter().zip(&su.want).position(|(&g, w)| g != w.to_bits());
                    assert!(
                        bad.is_none(),
                        "{case:?}, A {a:?}, B {b:?}, {issues} issue(s), {device:?}: thread {} d[{}] = {} want {}",
                        bad.unwrap_or(0) / (case.n / 2),
                        bad.unwrap_or(0) % (case.n / 2),
                        f32::from_bits(got[bad.unwrap_or(0)]),
                        su.want[bad.unwrap_or(0)]
                    );
                }
            }
        }
    }
}

/// The emulated device with a given completion timing (forward schedule).
fn timed(cp_async: CpAsyncTiming) -> Device {
    Device::emulated_with(EmuOptions { schedule: Schedule::Forward, cp_async, ..EmuOptions::default() })
}

fn planted(case: Case, bug: u32) -> Vec<u32> {
    let a = Operand::new(128, case.a_mn_major, 64, 0);
    let b = Operand::new(128, case.b_mn_major, case.n as u32, 16384);
    let mut su = setup(case, a, b, 1, true, 7);
    su.input[12] = bug;
    su.input
}

#[test]
fn wgmma_misuse_is_reported_with_the_source_line() {
    let (ss, rs) = (CASES[0], CASES[1]);
    for (case, bug, status, words) in [
        (ss, 1, "kernel trap", &["without a wgmma.fence"][..]),
        (ss, 2, "kernel trap", &["accumulator register was written", "selftest.cu:"][..]),
        (rs, 3, "kernel trap", &["A-fragment register was written", "selftest.cu:"][..]),
        (ss, 5, "kernel trap", &["different wgmma.mma_async", "thread (5,0,0)"][..]),
        (ss, 6, "unsupported operation", &["non-zero matrix base offset"][..]),
        (ss, 8, "kernel trap", &["not waited for"][..]),
        (ss, 9, "kernel trap", &["wgmma.mma_async reads shared memory", "fence.proxy.async", "selftest.cu:"][..]),
        // B's shared memory stored to while the op is in flight: the async proxy's read at the
        // latest completion sees the store without a fence.
        (ss, 7, "kernel trap", &["fence.proxy.async", "in flight"][..]),
    ] {
        let input = planted(case, bug);
        run(&timed(CpAsyncTiming::AtWait), Variant::Correct, &input)
            .unwrap_or_else(|e| panic!("bug {bug}'s case: {e}"));
        let result = run(&timed(CpAsyncTiming::AtWait), Variant::PlantedBug, &input);
        common::assert_reported(result, "selftest_wgmma", status, words, &format!("bug {bug}"));
    }
}

#[test]
fn reading_an_accumulator_before_the_wait_shows_up_between_completion_timings() {
    // Bug 4 reads an accumulator before the wait: NaN at the latest completion, the product at
    // the earliest. It is no error, and it changes the result with the timing: the schedules
    // test that the ops run under sees it. (Bug 7, B's shared memory stored to before the wait,
    // lands at the earliest completion and is reported at the latest: see above.)
    {
        let bug = 4;
        let input = planted(CASES[0], bug);
        let correct = run(&timed(CpAsyncTiming::AtWait), Variant::Correct, &input).unwrap();
        assert!(correct == run(&timed(CpAsyncTiming::AtIssue), Variant::Correct, &input).unwrap(), "bug {bug}'s case");
        let late = run(&timed(CpAsyncTiming::AtWait), Variant::PlantedBug, &input).unwrap();
        let early = run(&timed(CpAsyncTiming::AtIssue), Variant::PlantedBug, &input).unwrap();
        let differ = late.iter().zip(&early).filter(|(a, b)| a != b).count();
        assert!(differ > 0, "bug {bug}: both timings agree");
        let d1_nan = late.iter().skip(1).step_by(32).all(|&v| f32::from_bits(v).is_nan());
        assert!(d1_nan, "d[1] read before the wait is NaN at the latest completion");
    }
}
