//! cudarc buffers borrowed by views: the sealed traits that read their address with cudarc's
//! stream-ordering guards, and the three kinds of memory a view can point at.

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use half::{bf16, f16};

use super::storage::Storage;
use crate::dtype::DType;

mod sealed {
    pub trait Sealed {}
}

/// A cudarc buffer a [`TensorView`] can borrow: `CudaSlice<T>`, `CudaView<T>` or
/// `CudaViewMut<T>` for T in f32, f16, bf16, i32, i64 (typed), or u8 (untyped bytes, with an
/// explicit dtype). Sealed.
///
/// [`TensorView`]: crate::TensorView
pub trait CudaRead: sealed::Sealed {
    #[doc(hidden)]
    fn elem_dtype(&self) -> Option<DType>;
    #[doc(hidden)]
    fn byte_len(&self) -> usize;
    #[doc(hidden)]
    fn context_ptr(&self) -> usize;
    #[doc(hidden)]
    fn read_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>);
}

/// A cudarc buffer a [`TensorViewMut`] can borrow: `CudaSlice<T>` or `CudaViewMut<T>`. Sealed.
///
/// [`TensorViewMut`]: crate::TensorViewMut
pub trait CudaWrite: CudaRead {
    #[doc(hidden)]
    fn write_ptr<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>);
}

macro_rules! cuda_buffers {
    ($($t:ty => $d:expr),* $(,)?) => {$(
        impl sealed::Sealed for CudaSlice<$t> {}
        impl sealed::Sealed for CudaView<'_, $t> {}
        impl sealed::Sealed for CudaViewMut<'_, $t> {}
        cuda_buffers!(@read CudaSlice<$t>, $d);
        cuda_buffers!(@read CudaView<'_, $t>, $d);
        cuda_buffers!(@read CudaViewMut<'_, $t>, $d);
        impl CudaWrite for CudaSlice<$t> {
            fn write_ptr<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
                self.device_ptr_mut(stream)
            }
        }
        impl CudaWrite for CudaViewMut<'_, $t> {
            fn write_ptr<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
                self.device_ptr_mut(stream)
            }
        }
    )*};
    (@read $ty:ty, $d:expr) => {
        impl CudaRead for $ty {
            fn elem_dtype(&self) -> Option<DType> {
                $d
            }
            fn byte_len(&self) -> usize {
                self.num_bytes()
            }
            fn context_ptr(&self) -> usize {
                self.stream().context().cu_ctx() as usize
            }
            fn read_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
                self.device_ptr(stream)
            }
        }
    };
}
cuda_buffers!(
    u8 => None,
    f32 => Some(DType::F32),
    f16 => Some(DType::F16),
    bf16 => Some(DType::BF16),
    i32 => Some(DType::I32),
    i64 => Some(DType::I64),
);

/// What a read-only view borrows.
#[derive(Clone, Copy)]
pub(crate) enum ReadSrc<'a> {
    Storage(&'a Storage),
    Cuda(&'a dyn CudaRead),
    /// Host memory (emulated target): the address of byte 0 of the borrowed slice.
    Host(u64),
}

/// What a writable view borrows.
pub(crate) enum WriteSrc<'a> {
    Storage(&'a Storage),
    Cuda(&'a mut dyn CudaWrite),
    Host(u64),
}
