//! The kernels of `kernels/embedding.cu`.

use super::{Access, KernelTable};
use crate::dtype::DType;
use crate::spec::quant::QuantFormat;

/// Every kernel, by (access, dtype).
pub static KERNELS: KernelTable<(Access, DType)> = KernelTable {
    module: "embedding",
    entries: &[
        ((Access::Scalar, DType::F32), "embedding_f32"),
        ((Access::Scalar, DType::F16), "embedding_f16"),
        ((Access::Scalar, DType::BF16), "embedding_bf16"),
        ((Access::Vector, DType::F32), "embedding_vec_f32"),
        ((Access::Vector, DType::F16), "embedding_vec_f16"),
        ((Access::Vector, DType::BF16), "embedding_vec_bf16"),
    ],
};

macro_rules! packed {
    ($($fmt:ident $name:literal),*) => {
        &[$(
            ((QuantFormat::$fmt, DType::F32), concat!("qembedding_", $name, "_f32")),
            ((QuantFormat::$fmt, DType::F16), concat!("qembedding_", $name, "_f16")),
            ((QuantFormat::$fmt, DType::BF16), concat!("qembedding_", $name, "_bf16")),
        )*]
    };
}

/// The lookups from a packed table, by (format, output dtype).
pub static PACKED: KernelTable<(QuantFormat, DType)> = KernelTable {
    module: "embedding",
    entries: packed!(Q8_0 "q8_0", Q4_0 "q4_0", Q4_1 "q4_1", Q4_K "q4_k", Q6_K "q6_k", NF4 "nf4", Q5_0 "q5_0", Q5_1 "q5_1", Q5_K "q5_k"),
};

/// The backward's row sums, by (access, d_out's dtype).
pub static BACKWARD: KernelTable<(Access, DType)> = KernelTable {
    module: "embedding",
    entries: &[
        ((Access::Scalar, DType::F32), "embedding_backward_f32"),
        ((Access::Scalar, DType::F16), "embedding_backward_f16"),
        ((Access::Scalar, DType::BF16), "embedding_backward_bf16"),
        ((Access::Vector, DType::F32), "embedding_backward_vec_f32"),
        ((Access::Vector, DType::F16), "embedding_backward_vec_f16"),
        ((Access::Vector, DType::BF16), "embedding_backward_vec_bf16"),
    ],
};

/// The backward's per-chunk key sort (one block).
pub const BACKWARD_SORT: crate::backend::KernelRef =
    crate::backend::KernelRef { module: "embedding", symbol: "embedding_backward_sort" };

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols().chain(PACKED.symbols()).chain(BACKWARD.symbols()).chain([BACKWARD_SORT])
}
