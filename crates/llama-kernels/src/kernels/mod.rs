//! The kernel tables: for each family (`kernels/<family>.cu`) the symbols its wrappers may load,
//! keyed by what a wrapper selects on. A symbol is also the kernel's name in the PTX and in the
//! emulated registry; `tests/static_checks.rs` checks both directions (every row exists there,
//! and every PTX kernel is reachable from exactly one row).

pub mod attention;
pub mod attention_sm90;
pub mod embedding;
pub mod moe;
pub mod paged_attention;
pub mod qlinear;
pub mod rms_norm;
pub mod rope;
pub mod sampling;
pub mod swiglu;

use crate::backend::KernelRef;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A family's kernels: the key a wrapper selects by (path, dtype, ...) and the symbol, which is
/// also the name in the PTX and in the emulated registry.
#[derive(Debug)]
pub struct KernelTable<K: 'static> {
    /// The family (`kernels/<module>.cu`).
    pub module: &'static str,
    /// Every kernel: its key and its symbol.
    pub entries: &'static [(K, &'static str)],
}

impl<K: PartialEq + Copy> KernelTable<K> {
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
    /// The kernel for `key`; a dtype without one is an [`Error::UnsupportedDType`].
    pub fn find(&self, op: &'static str, what: &'static str, key: K, dtype: DType) -> Result<KernelRef> {
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, symbol)| KernelRef { module: self.module, symbol })
            .ok_or(Error::UnsupportedDType { op, what, dtype, supported: "f32, f16, bf16" })
    }
}

/// Every kernel the library's wrappers may load, family by family.
#[cfg(feature = "dev")]
pub fn all() -> Vec<KernelRef> {
    let v = rms_norm::symbols().chain(rope::symbols()).chain(swiglu::symbols());
    v.chain(embedding::symbols())
        .chain(attention::symbols())
        .chain(attention_sm90::symbols())
        .chain(paged_attention::symbols())
        .chain(moe::symbols())
        .chain(sampling::symbols())
        .chain(qlinear::symbols())
        .collect()
}
