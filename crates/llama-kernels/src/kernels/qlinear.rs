//! The kernels of `kernels/qlinear.cu` and `kernels/qmmv.cu` (the tensor-core GEMV).

use super::KernelTable;
use crate::dtype::DType;
use crate::spec::quant::QuantFormat;

/// Which kernel of a (format, activation dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QKernel {
    /// The decode GEMV (1 to `LLK_QGEMV_MAX_ROWS` rows).
    Gemv,
    /// The tensor-core GEMM over weight tiles dequantized in shared memory (bf16, f16).
    Gemm,
    /// The input gradient `dx = dy W` on the same GEMM, W's dimensions exchanged (bf16, f16).
    GemmInputGrad,
    /// A band of weight rows expanded to the activation dtype.
    Dequantize,
}

macro_rules! rows {
    ($($fmt:ident $name:literal),*) => {
        &[$(
            ((QKernel::Gemv, QuantFormat::$fmt, DType::F32), concat!("qgemv_", $name, "_f32")),
            ((QKernel::Gemv, QuantFormat::$fmt, DType::F16), concat!("qgemv_", $name, "_f16")),
            ((QKernel::Gemv, QuantFormat::$fmt, DType::BF16), concat!("qgemv_", $name, "_bf16")),
            ((QKernel::Gemm, QuantFormat::$fmt, DType::F16), concat!("qgemm_", $name, "_f16")),
            ((QKernel::Gemm, QuantFormat::$fmt, DType::BF16), concat!("qgemm_", $name, "_bf16")),
            ((QKernel::GemmInputGrad, QuantFormat::$fmt, DType::F16), concat!("qgemm_dx_", $name, "_f16")),
            ((QKernel::GemmInputGrad, QuantFormat::$fmt, DType::BF16), concat!("qgemm_dx_", $name, "_bf16")),
            ((QKernel::Dequantize, QuantFormat::$fmt, DType::F32), concat!("qdequant_", $name, "_f32")),
            ((QKernel::Dequantize, QuantFormat::$fmt, DType::F16), concat!("qdequant_", $name, "_f16")),
            ((QKernel::Dequantize, QuantFormat::$fmt, DType::BF16), concat!("qdequant_", $name, "_bf16")),
        )*]
    };
}

/// Every kernel, by (kernel, format, activation dtype).
pub static KERNELS: KernelTable<(QKernel, QuantFormat, DType)> = KernelTable {
    module: "qlinear",
    entries: rows!(Q8_0 "q8_0", Q4_0 "q4_0", Q4_1 "q4_1", Q4_K "q4_k", Q6_K "q6_k", NF4 "nf4", Q5_0 "q5_0", Q5_1 "q5_1", Q5_K "q5_k"),
};

/// The tensor-core GEMV of decode, by (format, activation dtype): the 4- and 6-bit formats; bf16
/// and f16.
pub static MMA_GEMV: KernelTable<(QuantFormat, DType)> = KernelTable {
    module: "qmmv",
    entries: &[
        ((QuantFormat::Q4_0, DType::F16), "qmmv_q4_0_f16"),
        ((QuantFormat::Q4_0, DType::BF16), "qmmv_q4_0_bf16"),
        ((QuantFormat::Q4_1, DType::F16), "qmmv_q4_1_f16"),
        ((QuantFormat::Q4_1, DType::BF16), "qmmv_q4_1_bf16"),
        ((QuantFormat::Q4_K, DType::F16), "qmmv_q4_k_f16"),
        ((QuantFormat::Q4_K, DType::BF16), "qmmv_q4_k_bf16"),
        ((QuantFormat::Q6_K, DType::F16), "qmmv_q6_k_f16"),
        ((QuantFormat::Q6_K, DType::BF16), "qmmv_q6_k_bf16"),
        ((QuantFormat::NF4, DType::F16), "qmmv_nf4_f16"),
        ((QuantFormat::NF4, DType::BF16), "qmmv_nf4_bf16"),
    ],
};

/// The split-K GEMM's reduction of its f32 partials, by output dtype (one for every format).
pub static SPLIT_REDUCE: KernelTable<DType> = KernelTable {
    module: "qlinear",
    entries: &[(DType::F16, "qsplit_reduce_f16"), (DType::BF16, "qsplit_reduce_bf16")],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols().chain(MMA_GEMV.symbols()).chain(SPLIT_REDUCE.symbols())
}
