//! Device-resident tensors: shape, strides (in elements), dtype and a shared storage.
//!
//! A [`Tensor`] is a strided view into a storage it shares with its other views; `narrow` and
//! `as_strided` make more views of the same storage (a fused QKV buffer split into q, k and v,
//! say). Ops read and write through these views. Device memory is only touched on a stream of the
//! device's context (CUDA) or under its stream lock (emulated), so views may share storage without
//! data races; ops check that the views they write do not overlap the ones they read, except where
//! an op documents in-place operation.
//!
//! The `Tensor` API is a convenience over the borrowed-view layer ([`TensorView`],
//! [`TensorViewMut`] and the `*_on` ops): engines that own their buffers use that layer directly.

mod owned;
pub(crate) mod view;

pub use crate::backend::storage::{CudaBuffer, CudaBufferGuard, CudaElement};
pub use owned::Tensor;
pub use owned::as_bytes;
pub(crate) use view::Dims;
pub(crate) use view::numel;
pub use view::{CudaRead, CudaWrite, MAX_RANK, TensorView, TensorViewMut, contiguous_strides};
