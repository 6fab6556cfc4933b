//! [`Tensor`]: a strided view into device memory it shares with its other views.

use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::view::{self, Dims, TensorView, TensorViewMut, contiguous_strides};
use crate::backend::storage::Storage;
use crate::backend::storage::{CudaBuffer, CudaBufferGuard, CudaElement};
use crate::backend::{Device, PinnedStaging};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// A strided view of device memory with a dtype; cheap to clone (the storage is shared).
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    dtype: DType,
    dims: Dims,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} {:?} on {:?})", self.dtype, self.dims, self.storage.device().target())
    }
}

fn byte_size(what: &'static str, dtype: DType, shape: &[usize]) -> Result<(usize, usize)> {
    let too_large = || Error::TooLarge { what, shape: shape.to_vec() };
    let n = view::numel(shape).ok_or_else(too_large)?;
    let bytes = n.checked_mul(dtype.size()).filter(|&b| b <= isize::MAX as usize).ok_or_else(too_large)?;
    Ok((n, bytes))
}

impl Tensor {
    /// A new zero-filled contiguous tensor.
    pub fn zeros(device: &Device, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let dims = Dims::contiguous("Tensor::zeros", shape)?;
        let (n, bytes) = byte_size("Tensor::zeros", dtype, shape)?;
        Ok(Tensor { storage: Arc::new(Storage::new(device, dtype, n, bytes)?), dtype, dims })
    }

    /// A new contiguous tensor filled with 0xFF bytes: NaN for every float dtype, -1 for integers.
    /// Tests poison outputs this way, so that an element a kernel forgot to write cannot pass.
    pub fn poisoned(device: &Device, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let t = Tensor::zeros(device, dtype, shape)?;
        t.fill_bytes(0xff)?;
        Ok(t)
    }

    /// Wraps a typed cudarc buffer (an engine's own allocation) as a contiguous tensor of
    /// `shape`, without copying. The buffer must belong to `device`'s context and hold at least
    /// `shape`'s elements; the tensor owns it from now on ([`Tensor::into_cuda_buffer`] gives it
    /// back).
    pub fn from_cuda<T: CudaElement>(device: &Device, slice: CudaSlice<T>, shape: &[usize]) -> Result<Tensor> {
        Self::from_cuda_buffer(device, T::wrap(slice), T::DTYPE, shape)
    }

    /// Wraps untyped cudarc bytes as a contiguous tensor of `dtype` and `shape`.
    pub fn from_cuda_bytes(device: &Device, slice: CudaSlice<u8>, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Self::from_cuda_buffer(device, CudaBuffer::U8(slice), dtype, shape)
    }

    fn from_cuda_buffer(device: &Device, buf: CudaBuffer, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let (_, bytes) = byte_size("Tensor::from_cuda", dtype, shape)?;
        if buf.num_bytes() < bytes {
            return Err(Error::InvalidView {
                what: "Tensor::from_cuda",
                why: format!("a {}-byte buffer cannot hold {shape:?} of {dtype}", buf.num_bytes()),
            });
        }
        let dims = Dims::contiguous("Tensor::from_cuda", shape)?;
        Ok(Tensor { storage: Arc::new(Storage::wrap_cuda(device, buf)?), dtype, dims })
    }

    /// Exclusive access to the cudarc buffer behind this tensor (CUDA only; `None` when
    /// emulated), for an engine's own kernels or cuBLAS: `guard.view_mut::<bf16>()` is a
    /// `CudaViewMut` of the whole buffer. The tensor's first element is at element
    /// [`Tensor::offset`] of it. Ops on tensors sharing the buffer wait until the guard is dropped
    /// (other threads) or fail with [`Error::StorageBusy`] (this thread).
    pub fn cuda_buffer(&self) -> Result<Option<CudaBufferGuard<'_>>> {
        self.storage.cuda_guard()
    }

    /// Gives the cudarc buffer back when this is the last view of it (CUDA only); otherwise
    /// returns the tensor unchanged.
    pub fn into_cuda_buffer(self) -> std::result::Result<CudaBuffer, Tensor> {
        let Tensor { storage, dtype, dims } = self;
        match Arc::try_unwrap(storage) {
            Ok(s) => s.into_cuda_buffer().map_err(|s| Tensor { storage: Arc::new(s), dtype, dims }),
            Err(storage) => Err(Tensor { storage, dtype, dims }),
        }
    }

    /// A new contiguous tensor holding `data`.
    pub fn from_slice<T: Element>(device: &Device, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let t = Tensor::zeros(device, T::DTYPE, shape)?;
        if t.numel() != data.len() {
            return Err(Error::LengthMismatch { what: "Tensor::from_slice", expected: t.numel(), got: data.len() });
        }
        t.storage.write_bytes(0, as_bytes(data))?;
        Ok(t)
    }

    /// A new contiguous tensor of `dtype` from f64 values, rounded to nearest.
    pub fn from_f64(device: &Device, dtype: DType, data: &[f64], shape: &[usize]) -> Result<Tensor> {
        let t = Tensor::zeros(device, dtype, shape)?;
        t.copy_from_f64(data)?;
        Ok(t)
    }

    /// A borrowed read-only view (the layer the ops are built on).
    pub fn view(&self) -> TensorView<'_> {
        TensorView::of_tensor(self)
    }

    /// A writable view of the whole tensor, for the `_on` calls that take views. Tensors share
    /// their storage (as every op's `&Tensor` output does); each op checks that what it writes
    /// does not overlap what it reads, and a buffer borrowed elsewhere is an error, not a race.
    pub fn view_mut(&self) -> TensorViewMut<'_> {
        TensorViewMut::of_tensor(self)
    }

    /// Copies `bytes` into this contiguous tensor from its first element (at most its size),
    /// through `staging`'s page-locked memory, without waiting for the copy: what a planned
    /// workspace does with per-step host data ([`PinnedStaging`]'s rules: queued on this
    /// tensor's stream, refused during CUDA graph capture; `staging` is `None` on the emulated
    /// target). `reader` is the device (stream) whose kernels read the upload.
    pub fn upload_staged(&self, staging: Option<&mut PinnedStaging>, bytes: &[u8], reader: &Device) -> Result<()> {
        const OP: &str = "Tensor::upload_staged";
        if !self.is_contiguous() {
            return Err(Error::BadLayout {
                op: OP,
                what: "tensor",
                shape: self.shape().to_vec(),
                strides: self.strides().to_vec(),
                why: "must be contiguous",
            });
        }
        let capacity = self.numel() * self.dtype.size();
        if bytes.len() > capacity {
            return Err(Error::invalid(OP, "bytes", bytes.len(), format!("exceeds the tensor's {capacity} bytes")));
        }
        PinnedStaging::upload(staging, bytes, &self.storage, self.offset() * self.dtype.size(), reader)
    }

    /// The device whose memory holds the tensor.
    pub fn device(&self) -> &Device {
        self.storage.device()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The size of each dimension, outermost first.
    pub fn shape(&self) -> &[usize] {
        self.dims.shape()
    }
    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        self.dims.strides()
    }
    /// Offset of the first element in the storage, in elements.
    pub fn offset(&self) -> usize {
        self.dims.offset()
    }
    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.rank()
    }
    /// The number of elements (the product of the shape).
    pub fn numel(&self) -> usize {
        self.dims.numel()
    }
    pub(crate) fn dims(&self) -> &Dims {
        &self.dims
    }
    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }
    /// Whether the elements are row-major without gaps (dimensions of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        self.dims.is_contiguous()
    }
    /// Whether the two tensors view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// A view with explicit shape, strides and offset (all in elements) over the same storage.
    /// Every element it addresses must lie inside the storage; the arithmetic is checked, so no
    /// view can wrap around. An empty view is normalized to offset 0 and zero strides.
    pub fn as_strided(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor> {
        let dims = Dims::new("as_strided", shape, strides, offset)?;
        dims.check_fits("as_strided", self.dtype, self.storage.bytes())?;
        Ok(Tensor { storage: self.storage.clone(), dtype: self.dtype, dims })
    }

    /// A contiguous `dtype` view of `shape` starting `byte_offset` bytes into the storage (a
    /// multiple of the dtype's size): one planned buffer holding arrays of several integer types.
    pub fn reinterpret(&self, dtype: DType, byte_offset: usize, shape: &[usize]) -> Result<Tensor> {
        if byte_offset % dtype.size() != 0 {
            return Err(Error::InvalidView {
                what: "reinterpret",
                why: format!("byte offset {byte_offset} is not a multiple of {dtype}'s size"),
            });
        }
        let strides =
            contiguous_strides(shape).ok_or_else(|| Error::TooLarge { what: "reinterpret", shape: shape.to_vec() })?;
        let dims = Dims::new("reinterpret", shape, &strides, byte_offset / dtype.size())?;
        dims.check_fits("reinterpret", dtype, self.storage.bytes())?;
        Ok(Tensor { storage: self.storage.clone(), dtype, dims })
    }

    /// The view of `len` entries of dimension `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let dims = self.dims().narrow("narrow", dim, start, len)?;
        self.as_strided(dims.shape(), dims.strides(), dims.offset())
    }

    /// A view with another shape; the tensor must be contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if !self.is_contiguous() {
            return Err(Error::InvalidView { what: "reshape", why: format!("{self:?} is not contiguous") });
        }
        let n = view::numel(shape).ok_or_else(|| Error::TooLarge { what: "reshape", shape: shape.to_vec() })?;
        if n != self.numel() {
            return Err(Error::InvalidView {
                what: "reshape",
                why: format!("{:?} -> {shape:?} changes the element count", self.shape()),
            });
        }
        let strides =
            contiguous_strides(shape).ok_or_else(|| Error::TooLarge { what: "reshape", shape: shape.to_vec() })?;
        self.as_strided(shape, &strides, self.offset())
    }

    /// Elements spanned in storage: [first, last] (inclusive), or None when empty. Views are
    /// validated at creation, so this cannot overflow.
    fn element_span(&self) -> Option<(usize, usize)> {
        self.dims.span("tensor").ok().flatten()
    }

    /// Sets every byte the view spans (including gaps between strided rows) to `byte`.
    pub fn fill_bytes(&self, byte: u8) -> Result<()> {
        if let Some((first, last)) = self.element_span() {
            let sz = self.dtype.size();
            self.storage.write_bytes(first * sz, &vec![byte; (last - first + 1) * sz])?;
        }
        Ok(())
    }

    /// Logical (row-major) element offsets of the view, relative to its first spanned element.
    fn gather_offsets(&self, first: usize) -> Vec<usize> {
        let (shape, strides) = (self.shape(), self.strides());
        let mut out = Vec::with_capacity(self.numel());
        let mut idx = vec![0usize; self.rank()];
        for _ in 0..self.numel() {
            out.push(self.offset() - first + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>());
            for d in (0..self.rank()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }

    /// The elements in logical (row-major) order.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                what: "element type",
                got: T::DTYPE,
                expected: self.dtype,
            });
        }
        let Some((first, last)) = self.element_span() else { return Ok(Vec::new()) };
        let sz = self.dtype.size();
        let raw = self.storage.read_bytes(first * sz, (last - first + 1) * sz)?;
        Ok(self
            .gather_offsets(first)
            .into_iter()
            // SAFETY: `raw` holds (last-first+1) elements of T written by this crate or by a
            // kernel; every offset is < that count; read_unaligned tolerates any alignment, and
            // every bit pattern is a valid f32/f16/bf16/i32/i64.
            .map(|o| unsafe { std::ptr::read_unaligned(raw.as_ptr().add(o * sz).cast::<T>()) })
            .collect())
    }

    /// Overwrites the view's elements (logical order) with `data`, rounded to the tensor's dtype.
    pub fn copy_from_f64(&self, data: &[f64]) -> Result<()> {
        match self.dtype {
            DType::F32 => self.copy_from_slice(&convert::<f32>(data)),
            DType::F16 => self.copy_from_slice(&convert::<half::f16>(data)),
            DType::BF16 => self.copy_from_slice(&convert::<half::bf16>(data)),
            DType::I32 => self.copy_from_slice(&convert::<i32>(data)),
            DType::I64 => self.copy_from_slice(&convert::<i64>(data)),
            DType::F8E4M3 => self.copy_from_slice(&convert::<crate::dtype::F8E4M3>(data)),
            DType::U8 => self.copy_from_slice(&convert::<u8>(data)),
        }
    }

    /// The elements as f64, in logical order, whatever the dtype.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        fn conv<T: Element>(t: &Tensor) -> Result<Vec<f64>> {
            Ok(t.to_vec::<T>()?.into_iter().map(Element::to_f64).collect())
        }
        match self.dtype {
            DType::F32 => conv::<f32>(self),
            DType::F16 => conv::<half::f16>(self),
            DType::BF16 => conv::<half::bf16>(self),
            DType::I32 => conv::<i32>(self),
            DType::I64 => conv::<i64>(self),
            DType::F8E4M3 => conv::<crate::dtype::F8E4M3>(self),
            DType::U8 => conv::<u8>(self),
        }
    }

    /// Overwrites the view's elements (logical order) with `data`; bytes between strided rows
    /// are left as they were.
    pub fn copy_from_slice<T: Element>(&self, data: &[T]) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "copy_from_slice",
                what: "element type",
                got: T::DTYPE,
                expected: self.dtype,
            });
        }
        if data.len() != self.numel() {
            return Err(Error::LengthMismatch { what: "copy_from_slice", expected: self.numel(), got: data.len() });
        }
        let Some((first, last)) = self.element_span() else { return Ok(()) };
        let sz = self.dtype.size();
        let src = as_bytes(data);
        if self.is_contiguous() {
            return self.storage.write_bytes(first * sz, src);
        }
        // Strided: read the span, scatter, write it back (the gaps keep their bytes).
        let mut raw = self.storage.read_bytes(first * sz, (last - first + 1) * sz)?;
        for (i, o) in self.gather_offsets(first).into_iter().enumerate() {
            raw[o * sz..(o + 1) * sz].copy_from_slice(&src[i * sz..(i + 1) * sz]);
        }
        self.storage.write_bytes(first * sz, &raw)
    }
}

fn convert<T: Element>(data: &[f64]) -> Vec<T> {
    data.iter().map(|&v| T::from_f64(v)).collect()
}

/// The bytes of a slice of elements (plain numbers without padding), borrowed.
pub fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: Element types are plain numbers without padding; the byte view covers exactly the
    // slice's memory and borrows it.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

impl Tensor {
    /// Copies `src` into `self` on the device, queued on `self`'s device (same dtype, same
    /// element count, both contiguous). Benchmarks use it as the bandwidth yardstick.
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        const OP: &str = "copy";
        let dst = self;
        if !src.device().same_context(dst.device()) {
            return Err(Error::DeviceMismatch { op: OP, what: "src/dst" });
        }
        if src.dtype() != dst.dtype() {
            return Err(Error::DTypeMismatch { op: OP, what: "dst", got: dst.dtype(), expected: src.dtype() });
        }
        if src.numel() != dst.numel() || !src.is_contiguous() || !dst.is_contiguous() {
            return Err(Error::shape(
                OP,
                "dst",
                dst.shape().to_vec(),
                format!("a contiguous tensor of {} elements like src", src.numel()),
            ));
        }
        let bytes = src.numel() * src.dtype().size();
        let (s0, d0) = (src.offset() * src.dtype().size(), dst.offset() * dst.dtype().size());
        dst.storage().copy_from(d0, src.storage(), s0, bytes)
    }
}

impl<'a> TensorView<'a> {
    /// A read-only view of all of `t`.
    pub(crate) fn of_tensor(t: &'a Tensor) -> Self {
        TensorView::of_storage(t.storage(), t.dtype(), *t.dims())
    }
}

impl<'a> TensorViewMut<'a> {
    /// A writable view of all of `t` (the tensor API's outputs: tensors share storage, and the
    /// op checks that what it writes does not overlap what it reads).
    pub(crate) fn of_tensor(t: &'a Tensor) -> Self {
        TensorViewMut::of_storage(t.storage(), t.dtype(), *t.dims())
    }
}
