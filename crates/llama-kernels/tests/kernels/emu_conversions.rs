//! The emulator's own f16 and bf16 conversions (`kernels/emu/emu_types.h`, which replaces
//! NVIDIA's `cuda_fp16.h`/`cuda_bf16.h` on the host) against the `half` crate.
//!
//! * 16-bit -> f32: every one of the 65536 patterns of each format, bit for bit (a NaN only has to
//!   stay a NaN: payload and quiet bit are free).
//! * f32 -> 16-bit, round to nearest even: the value of every pattern; every midpoint between two
//!   adjacent representable values and the f32 values just below and above it (ties to even, and
//!   the overflow threshold past the largest finite value); ±0, ±inf, NaNs with many payloads
//!   (quiet and signaling); f32 subnormals; values around the largest finite value; and every
//!   251st f32 bit pattern (17,111,424 values, NaNs and infinities included). Bit for bit, except
//!   that a NaN reference only asks for a NaN.
//! * The pair forms `__floats2half2_rn`/`__half22float2` (and bf16) that `llk.cuh` uses on its
//!   16-byte path, on the same inputs, which also checks that `.x` is the low half of the word.
//! * The emulator's documented NaN choices: every NaN narrows to the canonical `0x7fff`, and
//!   widening returns a quiet NaN with the sign kept.
//!
//! The comparison helpers are themselves checked: deliberately wrong conversions (truncation,
//! ties away from zero, NaN turned into inf, subnormals flushed) must be reported.
//!
//! The conversions are reached through batch entry points of `kernels/emu/emu_exports.cc`,
//! compiled into the crate's host library by build.rs.

// Nothing of the crate's Rust API is used; this links its host library (the entry points below).
extern crate llama_kernels;

use half::{bf16, f16};
use std::time::Instant;

// SAFETY: these are the `extern "C"` functions of kernels/emu/emu_exports.cc, linked in through
// the crate's host library, with these exact signatures (`uint16_t`/`uint32_t`/`float`/`uint64_t`
// map to u16/u32/f32/u64). Each reads `n` elements (`2n` floats for the x2 forms taking floats)
// from `input` and writes `n` elements (`2n` floats for those returning floats) to `out`, and
// nothing else; the safe wrappers below size both slices accordingly.
unsafe extern "C" {
    fn llk_emu_f32_to_f16_bits(input: *const f32, out: *mut u16, n: u64);
    fn llk_emu_f32_to_bf16_bits(input: *const f32, out: *mut u16, n: u64);
    fn llk_emu_f16_bits_to_f32(input: *const u16, out: *mut f32, n: u64);
    fn llk_emu_bf16_bits_to_f32(input: *const u16, out: *mut f32, n: u64);
    fn llk_emu_f32x2_to_f16x2_bits(input: *const f32, out: *mut u32, n: u64);
    fn llk_emu_f32x2_to_bf16x2_bits(input: *const f32, out: *mut u32, n: u64);
    fn llk_emu_f16x2_bits_to_f32x2(input: *const u32, out: *mut f32, n: u64);
    fn llk_emu_bf16x2_bits_to_f32x2(input: *const u32, out: *mut f32, n: u64);
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fmt {
    F16,
    Bf16,
}

impl Fmt {
    fn name(self) -> &'static str {
        match self {
            Fmt::F16 => "f16",
            Fmt::Bf16 => "bf16",
        }
    }
    /// The reference: `half`'s round-to-nearest-even conversion.
    fn ref_narrow(self, x: f32) -> u16 {
        match self {
            Fmt::F16 => f16::from_f32(x).to_bits(),
            Fmt::Bf16 => bf16::from_f32(x).to_bits(),
        }
    }
    fn ref_widen(self, b: u16) -> f32 {
        match self {
            Fmt::F16 => f16::from_bits(b).to_f32(),
            Fmt::Bf16 => bf16::from_bits(b).to_f32(),
        }
    }
    fn is_nan(self, b: u16) -> bool {
        match self {
            Fmt::F16 => b & 0x7fff > 0x7c00,
            Fmt::Bf16 => b & 0x7fff > 0x7f80,
        }
    }
    /// Bits of the largest finite positive value.
    fn max_finite(self) -> u16 {
        match self {
            Fmt::F16 => 0x7bff,
            Fmt::Bf16 => 0x7f7f,
        }
    }
}

// ------------------------------------------------------------------------- the emulator, batched

fn emu_narrow(fmt: Fmt, input: &[f32]) -> Vec<u16> {
    let mut out = vec![0u16; input.len()];
    let n = input.len() as u64;
    match fmt {
        // SAFETY: `input` and `out` both hold `n` elements (see the extern block).
        Fmt::F16 => unsafe { llk_emu_f32_to_f16_bits(input.as_ptr(), out.as_mut_ptr(), n) },
        // SAFETY: as above.
        Fmt::Bf16 => unsafe { llk_emu_f32_to_bf16_bits(input.as_ptr(), out.as_mut_ptr(), n) },
    }
    out
}

fn emu_widen(fmt: Fmt, input: &[u16]) -> Vec<f32> {
    let mut out = vec![0f32; input.len()];
    let n = input.len() as u64;
    match fmt {
        // SAFETY: `input` and `out` both hold `n` elements (see the extern block).
        Fmt::F16 => unsafe { llk_emu_f16_bits_to_f32(input.as_ptr(), out.as_mut_ptr(), n) },
        // SAFETY: as above.
        Fmt::Bf16 => unsafe { llk_emu_bf16_bits_to_f32(input.as_ptr(), out.as_mut_ptr(), n) },
    }
    out
}

/// Through the pair intrinsics: `input` holds pairs (its length must be even); the result is
/// unpacked to one u16 per input, low half first, so it lines up with `input`.
fn emu_narrow_pairs(fmt: Fmt, input: &[f32]) -> Vec<u16> {
    assert!(input.len() % 2 == 0);
    let n = input.len() / 2;
    let mut words = vec![0u32; n];
    match fmt {
        // SAFETY: `input` holds 2n floats and `words` n words (see the extern block).
        Fmt::F16 => unsafe { llk_emu_f32x2_to_f16x2_bits(input.as_ptr(), words.as_mut_ptr(), n as u64) },
        // SAFETY: as above.
        Fmt::Bf16 => unsafe { llk_emu_f32x2_to_bf16x2_bits(input.as_ptr(), words.as_mut_ptr(), n as u64) },
    }
    words.iter().flat_map(|w| [(w & 0xffff) as u16, (w >> 16) as u16]).collect()
}

/// Through the pair intrinsics: each word's low half, then its high half.
fn emu_widen_pairs(fmt: Fmt, words: &[u32]) -> Vec<f32> {
    let mut out = vec![0f32; 2 * words.len()];
    let n = words.len() as u64;
    match fmt {
        // SAFETY: `words` holds n words and `out` 2n floats (see the extern block).
        Fmt::F16 => unsafe { llk_emu_f16x2_bits_to_f32x2(words.as_ptr(), out.as_mut_ptr(), n) },
        // SAFETY: as above.
        Fmt::Bf16 => unsafe { llk_emu_bf16x2_bits_to_f32x2(words.as_ptr(), out.as_mut_ptr(), n) },
    }
    out
}

// ------------------------------------------------------------------------- comparison helpers

/// What a comparison found: how many results differ from the reference, and the first few.
#[derive(Debug, Default)]
struct Mismatches {
    count: usize,
    first: Vec<String>,
}

impl Mismatches {
    fn note(&mut self, what: impl FnOnce() -> String) {
        self.count += 1;
        if self.first.len() < 10 {
            self.first.push(what());
        }
    }
    #[track_caller]
    fn assert_none(&self, what: &str) {
        assert!(
            self.count == 0,
            "{what}: {} results differ from the half crate; first ones:\n  {}",
            self.count,
            self.first.join("\n  ")
        );
    }
}

/// f32 -> 16-bit: `got[i]` must have the reference's bits, except that a NaN reference asks only
/// for a NaN (the emulator returns the canonical NaN, `half` keeps the payload).
fn check_narrowing(fmt: Fmt, input: &[f32], got: &[u16]) -> Mismatches {
    assert_eq!(input.len(), got.len());
    let mut m = Mismatches::default();
    for (&x, &g) in input.iter().zip(got) {
        let want = fmt.ref_narrow(x);
        let ok = if fmt.is_nan(want) { fmt.is_nan(g) } else { g == want };
        if !ok {
            m.note(|| format!("{} of {x:e} (0x{:08x}): got 0x{g:04x}, want 0x{want:04x}", fmt.name(), x.to_bits()));
        }
    }
    m
}

/// 16-bit -> f32: `got[i]` must have the reference's bits (so -0 and +0 differ), except that a
/// NaN reference asks only for a NaN.
fn check_widening(fmt: Fmt, input: &[u16], got: &[f32]) -> Mismatches {
    assert_eq!(input.len(), got.len());
    let mut m = Mismatches::default();
    for (&b, &g) in input.iter().zip(got) {
        let want = fmt.ref_widen(b);
        let ok = if want.is_nan() { g.is_nan() } else { g.to_bits() == want.to_bits() };
        if !ok {
            m.note(|| {
                format!(
                    "{} 0x{b:04x}: got {g:e} (0x{:08x}), want {want:e} (0x{:08x})",
                    fmt.name(),
                    g.to_bits(),
                    want.to_bits()
                )
            });
        }
    }
    m
}

// ------------------------------------------------------------------------- inputs

fn every_pattern() -> Vec<u16> {
    (0..=u16::MAX).collect()
}

fn with_both_signs(bits: impl IntoIterator<Item = u32>) -> Vec<f32> {
    bits.into_iter().flat_map(|b| [f32::from_bits(b & 0x7fff_ffff), f32::from_bits(b | 0x8000_0000)]).collect()
}

/// Every midpoint between adjacent non-negative representable values of `fmt` (including the one
/// between the largest finite value and the next power of two, the overflow threshold), with its
/// f32 neighbours below and above, with both signs.
fn midpoints_and_neighbours(fmt: Fmt) -> Vec<f32> {
    let max = fmt.max_finite();
    let mut bits = Vec::new();
    for b in 0..=max {
        let lo = fmt.ref_widen(b) as f64;
        let hi = if b < max {
            fmt.ref_widen(b + 1) as f64
        } else {
            2.0 * lo - fmt.ref_widen(b - 1) as f64 // one ulp past the largest finite value
        };
        let mid = (lo + hi) / 2.0;
        let mid32 = mid as f32;
        assert_eq!(mid32 as f64, mid, "{} midpoint after 0x{b:04x} is exact in f32", fmt.name());
        let m = mid32.to_bits();
        bits.extend([m - 1, m, m + 1]);
    }
    with_both_signs(bits)
}

/// ±0, ±inf, NaNs (quiet and signaling, with payloads that a truncating conversion would turn
/// into inf or into another class), f32 subnormals, and values around the largest finite values
/// of both formats.
fn special_values() -> Vec<f32> {
    let mut bits: Vec<u32> = vec![0, 0x7f80_0000];
    // NaN payloads: every single bit, every run of low ones, and a few others.
    let mut payloads: Vec<u32> = (0..23).map(|k| 1u32 << k).collect();
    payloads.extend((1..=23).map(|k| (1u32 << k) - 1));
    payloads
        .extend([0x40_0000, 0x40_0001, 0x3f_ffff, 0x7f_e000, 0x00_2000, 0x00_1fff, 0x00_8000, 0x00_7fff, 0x12_3456]);
    bits.extend(payloads.iter().map(|p| 0x7f80_0000 | p));
    // f32 subnormals and the smallest normals.
    bits.extend([1, 2, 3, 0x40_0000, 0x40_0001, 0x7f_ffff, 0x80_0000, 0x80_0001]);
    bits.extend((0..0x80_0000).step_by(997));
    // Around f16's largest finite value 65504 (0x477fe000) and its overflow threshold 65520.
    bits.extend([
        0x477f_e000,
        0x477f_e001,
        0x477f_efff,
        0x477f_f000,
        0x477f_f001,
        0x477f_ffff,
        0x4780_0000,
        0x47c3_5000,
    ]);
    // Around bf16's largest finite value 0x7f7f0000 and its overflow threshold 0x7f7f8000.
    bits.extend([0x7f7f_0000, 0x7f7f_0001, 0x7f7f_7fff, 0x7f7f_8000, 0x7f7f_8001, 0x7f7f_ffff]);
    // Around the smallest subnormals and normals of both formats.
    bits.extend([0x3300_0000, 0x3300_0001, 0x3380_0000, 0x33c0_0000, 0x387f_ffff, 0x3880_0000, 0x3880_1000]);
    bits.extend([0x0000_8000, 0x0000_8001, 0x0001_0000, 0x0001_8000, 0x007f_8000, 0x007f_ffff]);
    with_both_signs(bits)
}

/// Every 251st f32 bit pattern: 17,111,424 values spread over the whole range.
fn sweep() -> Vec<f32> {
    (0..=u64::from(u32::MAX)).step_by(251).map(|b| f32::from_bits(b as u32)).collect()
}

fn narrowing_inputs(fmt: Fmt) -> Vec<f32> {
    let mut v: Vec<f32> = every_pattern().into_iter().map(|b| fmt.ref_widen(b)).collect();
    v.extend(midpoints_and_neighbours(fmt));
    v.extend(special_values());
    v
}

fn even(mut v: Vec<f32>) -> Vec<f32> {
    if v.len() % 2 == 1 {
        v.push(1.0);
    }
    v
}

// ------------------------------------------------------------------------- tests

fn widening_every_pattern(fmt: Fmt) {
    let t = Instant::now();
    let all = every_pattern();
    check_widening(fmt, &all, &emu_widen(fmt, &all)).assert_none(&format!("{} -> f32", fmt.name()));
    // Pairs: every pattern once in the low half and once in the high half.
    let words: Vec<u32> = all.iter().map(|&b| u32::from(b) | u32::from(b.wrapping_add(12345)) << 16).collect();
    let unpacked: Vec<u16> = words.iter().flat_map(|w| [(w & 0xffff) as u16, (w >> 16) as u16]).collect();
    check_widening(fmt, &unpacked, &emu_widen_pairs(fmt, &words)).assert_none(&format!("{}x2 -> f32x2", fmt.name()));
    println!("{} -> f32: {} patterns, {} pairs, {:.2?}", fmt.name(), all.len(), words.len(), t.elapsed());
}

#[test]
fn f16_to_f32_every_pattern() {
    widening_every_pattern(Fmt::F16);
}

#[test]
fn bf16_to_f32_every_pattern() {
    widening_every_pattern(Fmt::Bf16);
}

fn narrowing_targeted(fmt: Fmt) {
    let t = Instant::now();
    let input = even(narrowing_inputs(fmt));
    check_narrowing(fmt, &input, &emu_narrow(fmt, &input)).assert_none(&format!("f32 -> {}", fmt.name()));
    check_narrowing(fmt, &input, &emu_narrow_pairs(fmt, &input)).assert_none(&format!("f32x2 -> {}x2", fmt.name()));
    // Ties to even, explicitly: the midpoint above the odd pattern 1 rounds up to 2, the one above
    // the even pattern 2 rounds down to 2 (in both formats these are tiny subnormals, f32-exact).
    let mid = |b: u16| ((fmt.ref_widen(b) as f64 + fmt.ref_widen(b + 1) as f64) / 2.0) as f32;
    assert_eq!(emu_narrow(fmt, &[mid(1), mid(2), -mid(1)]), [2, 2, 0x8002], "{} ties to even", fmt.name());
    println!("f32 -> {}: {} targeted values (scalar and pairs), {:.2?}", fmt.name(), input.len(), t.elapsed());
}

#[test]
fn f32_to_f16_targeted() {
    narrowing_targeted(Fmt::F16);
}

#[test]
fn f32_to_bf16_targeted() {
    narrowing_targeted(Fmt::Bf16);
}

#[test]
fn f32_sweep_every_251st_pattern() {
    let t = Instant::now();
    let input = even(sweep());
    for fmt in [Fmt::F16, Fmt::Bf16] {
        check_narrowing(fmt, &input, &emu_narrow(fmt, &input)).assert_none(&format!("sweep f32 -> {}", fmt.name()));
        check_narrowing(fmt, &input, &emu_narrow_pairs(fmt, &input))
            .assert_none(&format!("sweep f32x2 -> {}x2", fmt.name()));
    }
    println!("sweep: {} f32 values x 2 formats (scalar and pairs), {:.2?}", input.len(), t.elapsed());
}

/// The emulator's own NaN choices, beyond what `half` checks: narrowing gives the canonical quiet
/// NaN 0x7fff (as cvt.rn.f16.f32 / cvt.rn.bf16.f32 on the GPU); widening gives a quiet NaN and
/// keeps the sign.
#[test]
fn nan_results_are_quiet() {
    let nans: Vec<f32> = special_values().into_iter().filter(|x| x.is_nan()).collect();
    assert!(nans.len() > 90);
    for fmt in [Fmt::F16, Fmt::Bf16] {
        assert!(emu_narrow(fmt, &nans).iter().all(|&b| b == 0x7fff), "{} NaNs narrow to 0x7fff", fmt.name());
        let nan16: Vec<u16> = every_pattern().into_iter().filter(|&b| fmt.is_nan(b)).collect();
        for (&b, g) in nan16.iter().zip(emu_widen(fmt, &nan16)) {
            let g = g.to_bits();
            assert!(g & 0x7fc0_0000 == 0x7fc0_0000, "{} 0x{b:04x} widens to a quiet NaN, got 0x{g:08x}", fmt.name());
            assert_eq!(g >> 31, u32::from(b >> 15), "{} 0x{b:04x} keeps its sign", fmt.name());
        }
    }
}

/// The helpers above can fail: deliberately wrong conversions, run over the same inputs, must be
/// reported, and the reference itself must pass.
#[test]
fn comparison_detects_wrong_conversions() {
    for fmt in [Fmt::F16, Fmt::Bf16] {
        let input = narrowing_inputs(fmt);
        let reference: Vec<u16> = input.iter().map(|&x| fmt.ref_narrow(x)).collect();
        assert_eq!(check_narrowing(fmt, &input, &reference).count, 0, "{}: the reference passes", fmt.name());

        // Round toward zero (truncation) instead of to nearest: every value above a midpoint
        // (in magnitude) comes out one step short.
        let truncated: Vec<u16> = input
            .iter()
            .zip(&reference)
            .map(|(&x, &r)| {
                let v = fmt.ref_widen(r);
                if !fmt.is_nan(r) && v.is_finite() && v.abs() > x.abs() { r - 1 } else { r }
            })
            .collect();
        let m = check_narrowing(fmt, &input, &truncated);
        assert!(m.count > 10_000, "{}: truncation must be caught, {} mismatches", fmt.name(), m.count);

        // Ties away from zero instead of to even: only the exact midpoints above an even pattern
        // differ, so this fails only because midpoints are tested.
        let ties_away: Vec<u16> = input
            .iter()
            .zip(&reference)
            .map(|(&x, &r)| {
                let mag = r & 0x7fff; // sign-magnitude: mag + 1 is the next value away from zero
                if fmt.is_nan(r) || mag >= fmt.max_finite() || mag & 1 == 1 {
                    return r;
                }
                let tie = (fmt.ref_widen(mag) as f64 + fmt.ref_widen(mag + 1) as f64) / 2.0;
                if x.abs() as f64 == tie { r + 1 } else { r }
            })
            .collect();
        let m = check_narrowing(fmt, &input, &ties_away);
        assert!(m.count > 1_000, "{}: ties away from zero must be caught, {} mismatches", fmt.name(), m.count);

        // A NaN turned into inf (what a conversion that forgets NaNs does to payloads it truncates
        // away).
        let inf = match fmt {
            Fmt::F16 => 0x7c00,
            Fmt::Bf16 => 0x7f80,
        };
        let nan_to_inf: Vec<u16> = reference.iter().map(|&r| if fmt.is_nan(r) { inf } else { r }).collect();
        let m = check_narrowing(fmt, &input, &nan_to_inf);
        assert!(m.count > 100, "{}: NaN -> inf must be caught, {} mismatches", fmt.name(), m.count);

        // Widening that flushes subnormals to zero, and one that loses the sign of -0.
        let all = every_pattern();
        let exact: Vec<f32> = all.iter().map(|&b| fmt.ref_widen(b)).collect();
        assert_eq!(check_widening(fmt, &all, &exact).count, 0);
        let flushed: Vec<f32> = exact.iter().map(|&v| if fmt_subnormal(fmt, v) { 0.0 } else { v }).collect();
        let subnormal_patterns = match fmt {
            Fmt::F16 => 2 * 1023,
            Fmt::Bf16 => 2 * 127,
        };
        assert_eq!(
            check_widening(fmt, &all, &flushed).count,
            subnormal_patterns,
            "{}: flushing subnormals must be caught",
            fmt.name()
        );
        let unsigned_zero: Vec<f32> = exact.iter().map(|&v| if v == 0.0 { 0.0 } else { v }).collect();
        assert_eq!(check_widening(fmt, &all, &unsigned_zero).count, 1, "{}: -0 -> +0 must be caught", fmt.name());
    }
}

/// Whether `v` (exactly representable in `fmt`) is a subnormal of `fmt`.
fn fmt_subnormal(fmt: Fmt, v: f32) -> bool {
    let min_normal = match fmt {
        Fmt::F16 => f32::from_bits(0x3880_0000), // 2^-14
        Fmt::Bf16 => f32::MIN_POSITIVE,          // 2^-126
    };
    v != 0.0 && v.abs() < min_normal
}

#[test]
fn the_reference_rounding_from_f64_is_correctly_rounded() {
    // `dtype::round_to` and `Element::from_f64` (what references and uploads round with) agree
    // with the f32 narrowing on every f32 input above that is not a NaN, the values just past a
    // midpoint included (f32 bit 0 set beyond bf16's round bit: a conversion that reads only the
    // top half of the f64 sees a tie there); and f64 values within an f32 ulp of a midpoint round
    // away from it, as the exact value says.
    use llama_kernels::dtype::round_to;
    use llama_kernels::{DType, Element};
    for (fmt, dtype) in [(Fmt::F16, DType::F16), (Fmt::Bf16, DType::BF16)] {
        let mut bad = Vec::new();
        for x in narrowing_inputs(fmt).into_iter().filter(|x| !x.is_nan()) {
            let want = fmt.ref_widen(fmt.ref_narrow(x)) as f64;
            let via_element = match fmt {
                Fmt::F16 => <f16 as Element>::from_f64(f64::from(x)).to_f64(),
                Fmt::Bf16 => <bf16 as Element>::from_f64(f64::from(x)).to_f64(),
            };
            let got = round_to(dtype, f64::from(x));
            if got != want || via_element != want {
                bad.push((x, got, want));
            }
        }
        assert!(bad.is_empty(), "{}: {} wrong, first {:?}", fmt.name(), bad.len(), &bad[..bad.len().min(4)]);
        // 1 + half an ulp of the format, plus or minus 2^-40 (far below an f32 ulp at 1).
        let half_ulp = match fmt {
            Fmt::F16 => 2f64.powi(-11),
            Fmt::Bf16 => 2f64.powi(-8),
        };
        assert_eq!(round_to(dtype, 1.0 + half_ulp + 2f64.powi(-40)), 1.0 + 2.0 * half_ulp, "{}", fmt.name());
        assert_eq!(round_to(dtype, 1.0 + half_ulp - 2f64.powi(-40)), 1.0, "{}", fmt.name());
        assert_eq!(round_to(dtype, -(1.0 + half_ulp + 2f64.powi(-40))), -(1.0 + 2.0 * half_ulp), "{}", fmt.name());
    }
}
