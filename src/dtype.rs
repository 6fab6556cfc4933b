//! Element types: the three floating-point storage types kernels compute on, and the two integer
//! types used for positions and sequence offsets.

use half::{bf16, f16};

/// The dtype of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
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
        }
    }
    /// The floating-point dtypes every kernel supports.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
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
            DType::I32 | DType::I64 => 0.0,
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
    const DTYPE: DType;
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
element!(f16, DType::F16, |x| x.to_f64(), |v| f16::from_f64(v));
element!(bf16, DType::BF16, |x| x.to_f64(), |v| bf16::from_f64(v));
element!(i32, DType::I32, |x| x as f64, |v| v as i32);
element!(i64, DType::I64, |x| x as f64, |v| v as i64);

/// Rounds an f64 to the nearest value representable in `dtype` (round to nearest even), as a
/// kernel storing into that dtype would.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::I32 | DType::I64 => v.round(),
    }
}
