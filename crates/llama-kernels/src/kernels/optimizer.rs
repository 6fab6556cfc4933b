//! The kernels of `kernels/optimizer.cu`.

use crate::backend::KernelRef;

/// Each chunk's sum of squared gradients.
pub const NORM_PARTIALS: KernelRef = KernelRef { module: "optimizer", symbol: "optim_norm_partials" };
/// The global norm, clip coefficient, non-finite check, step count and loss scale (one block).
pub const FINALIZE: KernelRef = KernelRef { module: "optimizer", symbol: "optim_finalize" };
/// The AdamW update of every chunk.
pub const ADAMW: KernelRef = KernelRef { module: "optimizer", symbol: "optim_adamw" };

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = KernelRef> {
    [NORM_PARTIALS, FINALIZE, ADAMW].into_iter()
}
