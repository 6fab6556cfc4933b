//! The kernel tables: for each family (`kernels/<family>.cu`) the symbols its wrappers may load,
//! keyed by what a wrapper selects on. A symbol is also the kernel's name in the PTX and in the
//! emulated registry; `tests/static_checks.rs` checks both directions (every row exists there,
//! and every PTX kernel is reachable from exactly one row).

pub mod attention;
pub mod attention_backward;
pub mod attention_sm90;
pub mod cross_entropy;
pub mod dropout;
pub mod embedding;
pub mod moe;
pub mod optimizer;
pub mod paged_attention;
pub mod qlinear;
pub mod rms_norm;
pub mod rope;
pub mod sampling;
pub mod swiglu;

use crate::backend::KernelRef;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// How a memory-bound kernel moves its elements: one at a time (any alignment, any size), or in
/// 16-byte vectors (rows aligned to 16 bytes, sizes a whole number of vectors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// One element per access.
    Scalar,
    /// 16-byte vectors.
    Vector,
}

impl Access {
    /// [`Access::Vector`] when `vectorized`, else [`Access::Scalar`].
    pub fn of(vectorized: bool) -> Access {
        if vectorized { Access::Vector } else { Access::Scalar }
    }
}

/// What a wrapper selects a kernel by: the variant, then the dtype the error names when a table
/// has no kernel of it. One key type per table; the dispatch from runtime values to a kernel
/// instantiation is the table's [`KernelTable::find`], nothing else.
pub trait KernelKey: Copy + PartialEq + std::fmt::Debug + 'static {
    /// The dtype of this key.
    fn dtype(self) -> DType;
    /// The same key with another dtype.
    fn with_dtype(self, dtype: DType) -> Self;
}

impl KernelKey for DType {
    fn dtype(self) -> DType {
        self
    }
    fn with_dtype(self, dtype: DType) -> Self {
        dtype
    }
}

/// Keys of some variant fields, then the dtype.
macro_rules! dtype_last {
    ($($v:ident),+) => {
        impl<$($v: Copy + PartialEq + std::fmt::Debug + 'static),+> KernelKey for ($($v,)+ DType) {
            fn dtype(self) -> DType {
                #[allow(non_snake_case, unused_variables)]
                let ($($v,)+ dtype) = self;
                dtype
            }
            fn with_dtype(self, dtype: DType) -> Self {
                #[allow(non_snake_case)]
                let ($($v,)+ _) = self;
                ($($v,)+ dtype)
            }
        }
    };
}
dtype_last!(A);
dtype_last!(A, B);
dtype_last!(A, B, C);

/// A family's kernels: the key a wrapper selects by and the symbol, which is also the name in
/// the PTX and in the emulated registry.
#[derive(Debug)]
pub struct KernelTable<K: 'static> {
    /// The family (`kernels/<module>.cu`).
    pub module: &'static str,
    /// Every kernel: its key and its symbol.
    pub entries: &'static [(K, &'static str)],
}

impl<K: KernelKey> KernelTable<K> {
    /// Every symbol, for static checks.
    #[cfg(feature = "dev")]
    pub fn symbols(&'static self) -> impl Iterator<Item = KernelRef> {
        self.entries.iter().map(|(_, symbol)| KernelRef { module: self.module, symbol })
    }
    /// Whether the table has a kernel for `key`.
    pub fn has(&self, key: K) -> bool {
        self.entries.iter().any(|(k, _)| *k == key)
    }
    /// The kernel for `key`, if the table has one.
    pub fn get(&self, key: K) -> Option<KernelRef> {
        self.entries.iter().find(|(k, _)| *k == key).map(|(_, symbol)| KernelRef { module: self.module, symbol })
    }
    /// The kernel for `key`. Without one: [`Error::UnsupportedDType`] naming the dtypes the table
    /// has for the rest of the key (`what` is the argument whose dtype it is), or
    /// [`Error::Unsupported`] when the table has no kernel of that variant at all.
    pub fn find(&self, op: &'static str, what: &'static str, key: K) -> Result<KernelRef> {
        if let Some(kernel) = self.get(key) {
            return Ok(kernel);
        }
        let supported: Vec<&str> = self
            .entries
            .iter()
            .filter(|(k, _)| *k == key.with_dtype(k.dtype()))
            .map(|(k, _)| k.dtype().name())
            .collect();
        if supported.is_empty() {
            return Err(Error::Unsupported { what: format!("{op}: no {} kernel for {key:?}", self.module) });
        }
        Err(Error::UnsupportedDType { op, what, dtype: key.dtype(), supported: supported.join(", ") })
    }
}

/// Every kernel the library's wrappers may load, family by family.
#[cfg(feature = "dev")]
pub fn all() -> Vec<KernelRef> {
    let v = rms_norm::symbols().chain(rope::symbols()).chain(swiglu::symbols());
    v.chain(embedding::symbols())
        .chain(attention::symbols())
        .chain(attention_sm90::symbols())
        .chain(attention_backward::symbols())
        .chain(paged_attention::symbols())
        .chain(moe::symbols())
        .chain(sampling::symbols())
        .chain(qlinear::symbols())
        .chain(cross_entropy::symbols())
        .chain(optimizer::symbols())
        .chain(dropout::symbols())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::quant::QuantFormat;

    #[test]
    fn a_missing_kernel_names_the_dtypes_its_table_has() {
        // The tensor-core GEMV has f16 and bf16 kernels of Q4_0, and no Q8_0 kernel at all.
        let e = qlinear::MMA_GEMV.find("qlinear", "x", (QuantFormat::Q4_0, DType::F32)).unwrap_err();
        match e {
            Error::UnsupportedDType { op: "qlinear", what: "x", dtype: DType::F32, supported } => {
                assert_eq!(supported, "f16, bf16")
            }
            other => panic!("expected UnsupportedDType, got {other}"),
        }
        let e = qlinear::MMA_GEMV.find("qlinear", "x", (QuantFormat::Q8_0, DType::F16)).unwrap_err();
        assert!(matches!(&e, Error::Unsupported { what } if what.contains("no qmmv kernel for (Q8_0, F16)")), "{e}");
        let k = attention::SMALL_KEY_KERNELS.find("gqa_attention", "q", (128, DType::BF16)).unwrap();
        assert_eq!(k.symbol, "attention_hd128_k32_bf16");
    }
}
