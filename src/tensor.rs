//! Device-resident tensors: shape, strides (in elements), dtype and a shared storage.
//!
//! A [`Tensor`] is a strided view into a [`Storage`]; `narrow` and `as_strided` make more views of
//! the same storage (a fused QKV buffer split into q, k and v, say). Ops read and write through
//! these views. Device memory is only touched on the device's stream (CUDA) or under its stream
//! lock (emulated), so views may share storage without data races; ops check that the views they
//! write do not overlap the ones they read, except where an op documents in-place operation.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, SyncOnDrop};

use crate::backend::{Device, DeviceInner};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// Alignment of host allocations on the emulated target, as cudaMalloc gives at least 256 bytes.
const HOST_ALIGN: usize = 256;

struct HostBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain bytes owned by this struct. Every access goes through
// `Storage::{read,write}_bytes` or an emulated launch, and both hold the device's stream lock,
// so there are never concurrent unsynchronized accesses from different threads.
unsafe impl Send for HostBuf {}
// SAFETY: as for Send: shared access is serialized by the device's stream lock.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    fn zeroed(bytes: usize) -> Result<HostBuf> {
        let layout = Layout::from_size_align(bytes.max(1), HOST_ALIGN)
            .map_err(|e| Error::Host(format!("allocation of {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::Host(format!("out of host memory ({bytes} bytes)")))?;
        Ok(HostBuf { ptr, layout })
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

enum Memory {
    Cuda(CudaSlice<u8>),
    Host(HostBuf),
}

/// A block of device memory (GPU memory, or host memory for the emulated target).
pub struct Storage {
    device: Device,
    bytes: usize,
    mem: Memory,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Storage({} bytes on {:?})", self.bytes, self.device.target())
    }
}

impl Storage {
    fn new(device: &Device, bytes: usize) -> Result<Storage> {
        let mem = match &*device.0 {
            DeviceInner::Cuda(c) => Memory::Cuda(c.stream.alloc_zeros::<u8>(bytes.max(1))?),
            DeviceInner::Emulated(_) => Memory::Host(HostBuf::zeroed(bytes)?),
        };
        Ok(Storage { device: device.clone(), bytes, mem })
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device address of byte 0, and (CUDA) the guard that must outlive the launch using it.
    pub(crate) fn base_address(&self) -> Result<(u64, Option<SyncOnDrop<'_>>)> {
        match (&self.mem, &*self.device.0) {
            (Memory::Cuda(slice), DeviceInner::Cuda(c)) => {
                let (ptr, guard) = slice.device_ptr(&c.stream);
                Ok((ptr, Some(guard)))
            }
            (Memory::Host(h), _) => Ok((h.ptr.as_ptr() as u64, None)),
            (Memory::Cuda(_), _) => Err(Error::Host("CUDA memory attached to a non-CUDA device".into())),
        }
    }

    fn check_range(&self, start: usize, len: usize) -> Result<()> {
        if start.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(Error::Host(format!("byte range {start}..+{len} outside a {}-byte storage", self.bytes)));
        }
        Ok(())
    }

    fn read_bytes(&self, start: usize, len: usize) -> Result<Vec<u8>> {
        self.check_range(start, len)?;
        let mut out = vec![0u8; len];
        if len == 0 {
            return Ok(out);
        }
        match (&self.mem, &*self.device.0) {
            (Memory::Cuda(_), DeviceInner::Cuda(c)) => {
                let (base, guard) = self.base_address()?;
                // SAFETY: [base+start, base+start+len) lies inside this allocation (checked above);
                // `out` is a live host buffer of exactly `len` bytes that stays in place until the
                // stream synchronization below completes the copy.
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(&mut out, base + start as u64, c.stream.cu_stream())
                }?;
                c.stream.synchronize()?;
                drop(guard);
            }
            (Memory::Host(h), DeviceInner::Emulated(e)) => {
                let _stream = e.stream.lock().unwrap_or_else(|p| p.into_inner());
                // SAFETY: the range is inside the allocation (checked above) and the stream lock
                // excludes concurrent kernel writes.
                unsafe { std::ptr::copy_nonoverlapping(h.ptr.as_ptr().add(start), out.as_mut_ptr(), len) };
            }
            _ => return Err(Error::Host("storage does not match its device".into())),
        }
        Ok(out)
    }

    fn write_bytes(&self, start: usize, data: &[u8]) -> Result<()> {
        self.write_bytes_ordered(start, data)?;
        if let DeviceInner::Cuda(c) = &*self.device.0 {
            c.stream.synchronize()?;
        }
        Ok(())
    }

    /// Writes host bytes in stream order without waiting for the copy to land: the driver stages
    /// pageable host memory before `cuMemcpyHtoDAsync` returns, so `data` may be dropped at once,
    /// and kernels queued later on the stream see the new bytes.
    fn write_bytes_ordered(&self, start: usize, data: &[u8]) -> Result<()> {
        self.check_range(start, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        match (&self.mem, &*self.device.0) {
            (Memory::Cuda(_), DeviceInner::Cuda(c)) => {
                let (base, guard) = self.base_address()?;
                // SAFETY: the destination range is inside this allocation (checked above); `data` is
                // pageable host memory, which the driver copies to a staging buffer before the call
                // returns, so it may be dropped afterwards; the copy is ordered on the stream.
                unsafe { cudarc::driver::result::memcpy_htod_async(base + start as u64, data, c.stream.cu_stream()) }?;
                drop(guard);
            }
            (Memory::Host(h), DeviceInner::Emulated(e)) => {
                let _stream = e.stream.lock().unwrap_or_else(|p| p.into_inner());
                // SAFETY: the range is inside the allocation (checked above); the stream lock
                // excludes concurrent kernel access.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), h.ptr.as_ptr().add(start), data.len()) };
            }
            _ => return Err(Error::Host("storage does not match its device".into())),
        }
        Ok(())
    }
}

/// A strided view of a [`Storage`] with a dtype.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({} {:?} strides {:?} offset {} on {:?})",
            self.dtype,
            self.shape,
            self.strides,
            self.offset,
            self.storage.device.target()
        )
    }
}

/// Row-major strides of a shape (saturating: only an empty shape can get that far, and then
/// the strides are never used).
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1]);
    }
    strides
}

fn numel_of(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::Host(format!("shape {shape:?} has too many elements")))
}

impl Tensor {
    /// A new zero-filled contiguous tensor.
    pub fn zeros(device: &Device, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let bytes = numel_of(shape)?
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::Host(format!("shape {shape:?} is too large")))?;
        Ok(Tensor {
            storage: Arc::new(Storage::new(device, bytes)?),
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        })
    }

    /// A new contiguous tensor filled with 0xFF bytes: NaN for every float dtype, -1 for integers.
    /// Tests poison outputs this way, so that an element a kernel forgot to write cannot pass.
    pub fn poisoned(device: &Device, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let t = Tensor::zeros(device, dtype, shape)?;
        t.fill_bytes(0xff)?;
        Ok(t)
    }

    /// Wraps device memory allocated elsewhere (an engine's own cudarc buffer) as a contiguous
    /// tensor of `shape`, without copying. The slice must belong to `device`'s context and hold
    /// at least `shape`'s bytes; the tensor owns it from now on.
    pub fn from_cuda_slice(device: &Device, slice: CudaSlice<u8>, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let DeviceInner::Cuda(c) = &*device.0 else {
            return Err(Error::Host("from_cuda_slice needs a CUDA device".into()));
        };
        if slice.context().cu_ctx() != c.ctx.cu_ctx() {
            return Err(Error::DeviceMismatch { op: "from_cuda_slice", what: "slice" });
        }
        let bytes = numel_of(shape)?
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::Host(format!("shape {shape:?} is too large")))?;
        if slice.len() < bytes {
            return Err(Error::Host(format!("a {}-byte slice cannot hold {shape:?} of {dtype}", slice.len())));
        }
        let storage = Storage { device: device.clone(), bytes: slice.len(), mem: Memory::Cuda(slice) };
        Ok(Tensor {
            storage: Arc::new(storage),
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        })
    }

    /// The cudarc buffer behind this tensor (CUDA only), for interop: the tensor's first element
    /// is at byte `offset() * dtype().size()` of it.
    pub fn cuda_slice(&self) -> Option<&CudaSlice<u8>> {
        match &self.storage.mem {
            Memory::Cuda(s) => Some(s),
            Memory::Host(_) => None,
        }
    }

    /// A new contiguous tensor holding `data`.
    pub fn from_slice<T: Element>(device: &Device, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let n = numel_of(shape)?;
        if n != data.len() {
            return Err(Error::Host(format!("shape {shape:?} needs {n} elements, the slice has {}", data.len())));
        }
        let t = Tensor::zeros(device, T::DTYPE, shape)?;
        t.storage.write_bytes(0, as_bytes(data))?;
        Ok(t)
    }

    /// A new contiguous tensor of `dtype` from f64 values, rounded to nearest.
    pub fn from_f64(device: &Device, dtype: DType, data: &[f64], shape: &[usize]) -> Result<Tensor> {
        let n = numel_of(shape)?;
        if n != data.len() {
            return Err(Error::Host(format!("shape {shape:?} needs {n} elements, the slice has {}", data.len())));
        }
        let t = Tensor::zeros(device, dtype, shape)?;
        t.copy_from_f64(data)?;
        Ok(t)
    }

    pub fn device(&self) -> &Device {
        &self.storage.device
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Offset of the first element in the storage, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }
    pub fn is_contiguous(&self) -> bool {
        self.numel() == 0 || self.strides == contiguous_strides(&self.shape) || self.shape.iter().all(|&d| d <= 1)
    }
    /// Whether the two tensors view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Elements spanned in storage: [first, last] (inclusive), or None when empty. Views are
    /// validated at creation, so this cannot overflow.
    pub(crate) fn element_span(&self) -> Option<(usize, usize)> {
        if self.numel() == 0 {
            return None;
        }
        let last = self.offset + self.shape.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>();
        Some((self.offset, last))
    }

    /// A view with explicit shape, strides and offset (all in elements) over the same storage.
    /// Every element it addresses must lie inside the storage; the arithmetic is checked, so no
    /// view can wrap around. An empty view is normalized to offset 0 and zero strides.
    pub fn as_strided(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor> {
        let out_of_bounds = || {
            Error::Host(format!(
                "view {shape:?} strides {strides:?} offset {offset} exceeds a storage of {} bytes",
                self.storage.bytes
            ))
        };
        if shape.len() != strides.len() {
            return Err(Error::Host(format!("shape {shape:?} and strides {strides:?} differ in rank")));
        }
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(out_of_bounds)?;
        if numel == 0 {
            return Ok(Tensor {
                storage: self.storage.clone(),
                dtype: self.dtype,
                shape: shape.to_vec(),
                strides: vec![0; shape.len()],
                offset: 0,
            });
        }
        let last = shape
            .iter()
            .zip(strides)
            .try_fold(offset, |acc, (&d, &s)| (d - 1).checked_mul(s).and_then(|x| acc.checked_add(x)))
            .ok_or_else(out_of_bounds)?;
        let end = last.checked_add(1).and_then(|e| e.checked_mul(self.dtype.size())).ok_or_else(out_of_bounds)?;
        if end > self.storage.bytes {
            return Err(out_of_bounds());
        }
        Ok(Tensor {
            storage: self.storage.clone(),
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        })
    }

    /// The view of `len` entries of dimension `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let size = *self
            .shape
            .get(dim)
            .ok_or_else(|| Error::Host(format!("narrow: dim {dim} out of range for rank {}", self.rank())))?;
        if start.checked_add(len).is_none_or(|e| e > size) {
            return Err(Error::Host(format!("narrow: {start}..{start}+{len} exceeds dim {dim} of size {size}")));
        }
        let mut shape = self.shape.clone();
        shape[dim] = len;
        let offset = start
            .checked_mul(self.strides[dim])
            .and_then(|o| o.checked_add(self.offset))
            .ok_or_else(|| Error::Host(format!("narrow: offset of {start} overflows")))?;
        self.as_strided(&shape, &self.strides.clone(), offset)
    }

    /// A view with another shape; the tensor must be contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if !self.is_contiguous() {
            return Err(Error::Host(format!("reshape of a non-contiguous tensor {self:?}")));
        }
        if numel_of(shape)? != self.numel() {
            return Err(Error::Host(format!("reshape {:?} -> {shape:?} changes the element count", self.shape)));
        }
        self.as_strided(shape, &contiguous_strides(shape), self.offset)
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
        let mut out = Vec::with_capacity(self.numel());
        let mut idx = vec![0usize; self.rank()];
        for _ in 0..self.numel() {
            out.push(self.offset - first + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<usize>());
            for d in (0..self.rank()).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
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
            return Err(Error::Host(format!("to_vec::<{}> of a {} tensor", T::DTYPE, self.dtype)));
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
        }
    }

    /// Overwrites the view's elements (logical order) with `data`; bytes between strided rows
    /// are left as they were.
    pub fn copy_from_slice<T: Element>(&self, data: &[T]) -> Result<()> {
        if T::DTYPE != self.dtype || data.len() != self.numel() {
            return Err(Error::Host(format!(
                "copy_from_slice: {} values of {} into a {} tensor of {} elements",
                data.len(),
                T::DTYPE,
                self.dtype,
                self.numel()
            )));
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

impl Tensor {
    /// Overwrites a contiguous tensor's elements with `data`, ordered on the device's stream and
    /// without waiting (small per-call uploads, such as attention's sequence offsets).
    pub(crate) fn upload_ordered<T: Element>(&self, data: &[T]) -> Result<()> {
        if T::DTYPE != self.dtype || data.len() > self.numel() || !self.is_contiguous() {
            return Err(Error::Host(format!("upload of {} {} values into {self:?}", data.len(), T::DTYPE)));
        }
        self.storage.write_bytes_ordered(self.offset * self.dtype.size(), as_bytes(data))
    }
}

fn convert<T: Element>(data: &[f64]) -> Vec<T> {
    data.iter().map(|&v| T::from_f64(v)).collect()
}

fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: Element types are plain numbers without padding; the byte view covers exactly the
    // slice's memory and borrows it.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

/// Device-to-device copy of a contiguous tensor into another (benchmark yardstick).
pub(crate) fn copy_contiguous(device: &Device, src: &Tensor, dst: &Tensor) -> Result<()> {
    const OP: &str = "copy";
    if !src.device().same(device) || !dst.device().same(device) {
        return Err(Error::DeviceMismatch { op: OP, what: "src/dst" });
    }
    if src.dtype() != dst.dtype() {
        return Err(Error::DTypeMismatch { op: OP, what: "dst", got: dst.dtype(), expected: src.dtype() });
    }
    if src.numel() != dst.numel() || !src.is_contiguous() || !dst.is_contiguous() {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "dst",
            got: dst.shape().to_vec(),
            expected: format!("a contiguous tensor of {} elements like src", src.numel()),
        });
    }
    let bytes = src.numel() * src.dtype().size();
    let (s0, d0) = (src.offset() * src.dtype().size(), dst.offset() * dst.dtype().size());
    match &*device.0 {
        DeviceInner::Cuda(c) => {
            let (sb, sg) = src.storage().base_address()?;
            let (db, dg) = dst.storage().base_address()?;
            // SAFETY: both ranges lie inside live allocations of this context (views are
            // bounds-checked at creation); the copy is queued on the same stream as every kernel,
            // and the guards are dropped only after it is queued.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(db + d0 as u64, sb + s0 as u64, bytes, c.stream.cu_stream())
            }?;
            drop((sg, dg));
            Ok(())
        }
        DeviceInner::Emulated(_) => {
            let data = src.storage().read_bytes(s0, bytes)?;
            dst.storage().write_bytes(d0, &data)
        }
    }
}
