//! Element types: the three floating-point storage types kernels compute on, the fp8 storage
//! type of the paged KV cache, and the two integer types used for positions, offsets and slots.

use half::{bf16, f16};

/// The dtype of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 binary32 (4 bytes).
    F32,
    /// IEEE 754 binary16 (2 bytes).
    F16,
    /// bfloat16: f32's exponent range with an 8-bit significand (2 bytes).
    BF16,
    /// 32-bit signed integer: positions, sequence offsets, block tables, expert ids.
    I32,
    /// 64-bit signed integer: positions and KV slot mappings.
    I64,
    /// OCP FP8 E4M3 "fn" (finite, +-448, one NaN code per sign): a storage type of the paged KV
    /// cache only ([`F8E4M3`]).
    F8E4M3,
    /// Raw bytes: the planes of packed quantized weights ([`crate::spec::quant`]); storage only.
    U8,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::F8E4M3 | DType::U8 => 1,
        }
    }
    /// The short name used in kernel symbols (`rms_norm_vec_bf16`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F8E4M3 => "fp8",
            DType::U8 => "u8",
        }
    }
    /// The floating-point dtypes every kernel supports.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
    /// Whether this is one of the dtypes kernels compute on (f32, f16, bf16); fp8 is storage only.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
    /// Elements in one 16-byte vector.
    pub const fn vec16(self) -> usize {
        16 / self.size()
    }
    /// Unit roundoff (half an ulp at 1.0) of the storage type; 0 for integers.
    pub const fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => 5.960464477539063e-8, // 2^-24
            DType::F16 => 4.8828125e-4,         // 2^-11
            DType::BF16 => 3.90625e-3,          // 2^-8
            DType::F8E4M3 => 6.25e-2,           // 2^-4
            DType::I32 | DType::I64 | DType::U8 => 0.0,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can be stored in a [`crate::Tensor`].
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The dtype of a tensor of this type.
    const DTYPE: DType;
    /// The value as f64 (exact, except i64 values beyond 2^53, which round; fp8 codes decode).
    fn to_f64(self) -> f64;
    /// Rounds to nearest (even); saturates integers.
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr, |$x:ident| $to:expr, |$v:ident| $from:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline]
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            #[inline]
            fn from_f64($v: f64) -> Self {
                $from
            }
        }
    };
}
element!(f32, DType::F32, |x| x as f64, |v| v as f32);
element!(f16, DType::F16, |x| x.to_f64(), |v| f16::from_f32(f32_round_to_odd(v)));
element!(bf16, DType::BF16, |x| x.to_f64(), |v| bf16::from_f32(f32_round_to_odd(v)));
element!(i32, DType::I32, |x| x as f64, |v| v as i32);
element!(i64, DType::I64, |x| x as f64, |v| v as i64);
element!(u8, DType::U8, |x| f64::from(x), |v| v as u8);
element!(F8E4M3, DType::F8E4M3, |x| f8e4m3_decode(x.0), |v| F8E4M3(f8e4m3_encode(v)));

/// One e4m3fn code (OCP FP8 E4M3, finite variant): 1 sign, 4 exponent (bias 7) and 3 mantissa
/// bits; largest finite value 448 (`0x7e`), `0x7f`/`0xff` NaN, no infinities. Host slices of it
/// view fp8 pages ([`crate::TensorView::host`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// The value of an e4m3fn code (exact in f64; `0x7f`/`0xff` are NaN).
pub fn f8e4m3_decode(code: u8) -> f64 {
    let (mag, neg) = (code & 0x7f, code & 0x80 != 0);
    let v = if mag == 0x7f {
        f64::NAN
    } else {
        let (e, m) = (i32::from(mag >> 3), f64::from(mag & 7));
        if e == 0 { m * 2f64.powi(-9) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) }
    };
    if neg { -v } else { v }
}

/// The e4m3fn code of `x`: round to nearest, ties to even; magnitudes of 448 and more (infinity
/// included) saturate to +-448; NaN stays NaN (sign kept). The kernels convert f32 values with the
/// same rule (kernels/common/fp8.cuh), so `f8e4m3_encode(x as f64)` is what a kernel stores for
/// the f32 `x`.
pub fn f8e4m3_encode(x: f64) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    if x.is_nan() {
        return sign | 0x7f;
    }
    let a = x.abs();
    if a >= 448.0 {
        return sign | 0x7e;
    }
    if a < 2f64.powi(-6) {
        // Subnormal range: m * 2^-9, m = 0..8 (8 rounds up to the smallest normal, code 0x08).
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // a = 2^e * f, f in [1, 2); keep 3 fraction bits, ties to even; a carry moves to 2^(e+1).
    let e = a.log2().floor() as i32;
    let (e, f) = {
        let f = a / 2f64.powi(e);
        // log2 may round across a power of two: renormalize.
        if f >= 2.0 {
            (e + 1, f / 2.0)
        } else if f < 1.0 {
            (e - 1, f * 2.0)
        } else {
            (e, f)
        }
    };
    let q = ((f - 1.0) * 8.0).round_ties_even() as i32;
    let (e, q) = if q == 8 { (e + 1, 0) } else { (e, q) };
    sign | (((e + 7) << 3) | q) as u8
}

/// `v` rounded to f32 toward zero, with the last bit of the significand set when that was
/// inexact ("round to odd"). Rounding this to f16 or bf16 (nearest even) gives `v` correctly
/// rounded to them: the odd bit stands for every f64 bit the f32 drops, so a value just above a
/// halfway point never looks like a tie. (half's `from_f64` reads only the top 32 bits of an
/// f64 and rounds such a value down: 0x3d808005 as f32 to bf16 gives 0.0625, not 0.06298828.)
fn f32_round_to_odd(v: f64) -> f32 {
    let f = v as f32; // nearest even
    if !f.is_finite() || f64::from(f) == v {
        return f;
    }
    // Toward zero: step back one ulp when nearest rounded away from zero.
    let bits = f.to_bits();
    let toward_zero = if f64::from(f).abs() > v.abs() { bits - 1 } else { bits };
    f32::from_bits(toward_zero | 1)
}

/// Rounds an f64 to the nearest value representable in `dtype` (round to nearest even), as a
/// kernel storing into that dtype would.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f32(f32_round_to_odd(v)).to_f64(),
        DType::BF16 => bf16::from_f32(f32_round_to_odd(v)).to_f64(),
        DType::F8E4M3 => f8e4m3_decode(f8e4m3_encode(v)),
        DType::I32 | DType::I64 => v.round(),
        DType::U8 => v.round().clamp(0.0, 255.0),
    }
}
