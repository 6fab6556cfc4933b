//! Device memory owned by tensors: a typed cudarc buffer on the GPU, guarded host memory on the
//! emulated target.
//!
//! Emulated allocations are laid out so that an out-of-bounds kernel access is caught:
//!
//! ```text
//! | 64 KiB guard | guard zone (canary bytes) | data, 256-byte aligned | < 256 canary bytes | 64 KiB guard |
//! ```
//!
//! A read or write that reaches a guard (PROT_NONE pages: address space, no memory) stops the kernel with a memory-fault error naming
//! it; a write into a guard zone (the alignment slack that the pages cannot cover) is found by the
//! canary check after every launch that used the buffer.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, SyncOnDrop};
use half::{bf16, f16};

use super::counters::Count;
use super::device::{Device, DeviceInner};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::target::Target;

/// Alignment of data on the emulated target, as cudaMalloc gives at least 256 bytes.
const HOST_ALIGN: usize = 256;
/// The byte the guard zones are filled with.
const CANARY: u8 = 0xA5;
/// Guard bytes (PROT_NONE, reserved address space only) on each side of an emulated buffer: a
/// kernel access up to this far outside a buffer faults.
const GUARD_BYTES: usize = 64 * 1024;

/// A cudarc buffer of one element type. Tensors created by this crate hold the type of their
/// dtype; [`crate::Tensor::from_cuda_bytes`] wraps untyped bytes.
#[derive(Debug)]
pub enum CudaBuffer {
    /// Untyped bytes (fp8 tensors, and [`Tensor::from_cuda_bytes`](crate::Tensor::from_cuda_bytes)).
    U8(CudaSlice<u8>),
    /// [`DType::F32`] elements.
    F32(CudaSlice<f32>),
    /// [`DType::F16`] elements.
    F16(CudaSlice<f16>),
    /// [`DType::BF16`] elements.
    BF16(CudaSlice<bf16>),
    /// [`DType::I32`] elements.
    I32(CudaSlice<i32>),
    /// [`DType::I64`] elements.
    I64(CudaSlice<i64>),
}

macro_rules! each_buffer {
    ($self:expr, $s:ident => $body:expr) => {
        match $self {
            CudaBuffer::U8($s) => $body,
            CudaBuffer::F32($s) => $body,
            CudaBuffer::F16($s) => $body,
            CudaBuffer::BF16($s) => $body,
            CudaBuffer::I32($s) => $body,
            CudaBuffer::I64($s) => $body,
        }
    };
}

impl CudaBuffer {
    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        each_buffer!(self, s => s.num_bytes())
    }
    /// The context the buffer belongs to.
    pub fn context(&self) -> &std::sync::Arc<cudarc::driver::CudaContext> {
        each_buffer!(self, s => s.context())
    }
    /// The element type, or `None` for untyped bytes.
    pub fn dtype(&self) -> Option<DType> {
        match self {
            CudaBuffer::U8(_) => None,
            CudaBuffer::F32(_) => Some(DType::F32),
            CudaBuffer::F16(_) => Some(DType::F16),
            CudaBuffer::BF16(_) => Some(DType::BF16),
            CudaBuffer::I32(_) => Some(DType::I32),
            CudaBuffer::I64(_) => Some(DType::I64),
        }
    }
    /// The address, taken with read intent on `stream` (cudarc's `device_ptr`).
    pub(crate) fn ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        each_buffer!(self, s => s.device_ptr(stream))
    }
    /// The address, taken with write intent on `stream` (cudarc's `device_ptr_mut`).
    pub(crate) fn ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        each_buffer!(self, s => s.device_ptr_mut(stream))
    }
    fn alloc(stream: &std::sync::Arc<CudaStream>, dtype: DType, elems: usize) -> Result<CudaBuffer> {
        let n = elems.max(1);
        Ok(match dtype {
            DType::F32 => CudaBuffer::F32(stream.alloc_zeros(n)?),
            DType::F16 => CudaBuffer::F16(stream.alloc_zeros(n)?),
            DType::BF16 => CudaBuffer::BF16(stream.alloc_zeros(n)?),
            DType::I32 => CudaBuffer::I32(stream.alloc_zeros(n)?),
            DType::I64 => CudaBuffer::I64(stream.alloc_zeros(n)?),
            DType::F8E4M3 | DType::U8 => CudaBuffer::U8(stream.alloc_zeros(n)?),
        })
    }
}

/// Typed access to a tensor's cudarc buffer, for an engine's own kernels or cuBLAS.
pub trait CudaElement: crate::dtype::Element + cudarc::driver::DeviceRepr {
    #[doc(hidden)]
    fn slice(b: &CudaBuffer) -> Option<&CudaSlice<Self>>;
    #[doc(hidden)]
    fn slice_mut(b: &mut CudaBuffer) -> Option<&mut CudaSlice<Self>>;
    #[doc(hidden)]
    fn wrap(s: CudaSlice<Self>) -> CudaBuffer;
}

macro_rules! cuda_element {
    ($($t:ty => $v:ident),*) => {$(
        impl CudaElement for $t {
            fn slice(b: &CudaBuffer) -> Option<&CudaSlice<Self>> {
                if let CudaBuffer::$v(s) = b { Some(s) } else { None }
            }
            fn slice_mut(b: &mut CudaBuffer) -> Option<&mut CudaSlice<Self>> {
                if let CudaBuffer::$v(s) = b { Some(s) } else { None }
            }
            fn wrap(s: CudaSlice<Self>) -> CudaBuffer {
                CudaBuffer::$v(s)
            }
        }
    )*};
}
cuda_element!(f32 => F32, f16 => F16, bf16 => BF16, i32 => I32, i64 => I64);

/// Exclusive access to a tensor's cudarc buffer (see [`crate::Tensor::cuda_buffer`]). While it
/// lives, ops on tensors sharing the buffer wait (other threads) or fail with
/// [`Error::StorageBusy`] (this thread) instead of racing with it.
pub struct CudaBufferGuard<'a> {
    guard: MutexGuard<'a, CudaBuffer>,
    holder: &'a AtomicU64,
}

impl std::fmt::Debug for CudaBufferGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBufferGuard({} bytes)", self.guard.num_bytes())
    }
}

impl CudaBufferGuard<'_> {
    /// The untyped buffer (for its size, context and dtype).
    pub fn buffer(&self) -> &CudaBuffer {
        &self.guard
    }
    /// The whole buffer as `T` elements, read-only (`None` when the buffer holds another type).
    pub fn view<T: CudaElement>(&self) -> Option<CudaView<'_, T>> {
        T::slice(&self.guard).map(|s| s.as_view())
    }
    /// The whole buffer as untyped bytes, writable (`None` unless it was wrapped as bytes with
    /// [`crate::Tensor::from_cuda_bytes`]).
    pub fn bytes_mut(&mut self) -> Option<CudaViewMut<'_, u8>> {
        if let CudaBuffer::U8(s) = &mut *self.guard { Some(s.as_view_mut()) } else { None }
    }
    /// The whole buffer as `T` elements, writable: pass it to cuBLAS or your own kernels. The
    /// view cannot reallocate the buffer, so the tensor stays valid.
    pub fn view_mut<T: CudaElement>(&mut self) -> Option<CudaViewMut<'_, T>> {
        T::slice_mut(&mut self.guard).map(|s| s.as_view_mut())
    }
}

impl Drop for CudaBufferGuard<'_> {
    fn drop(&mut self) {
        self.holder.store(0, Ordering::Release);
    }
}

/// A per-thread token (never 0) naming the thread that holds a [`CudaBufferGuard`].
fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static TOKEN: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    TOKEN.with(|t| *t)
}

pub(crate) struct CudaCell {
    buf: Mutex<CudaBuffer>,
    /// The thread holding a user guard, or 0.
    holder: AtomicU64,
}

/// Guarded host memory for the emulated target.
struct HostBuf {
    map: NonNull<u8>,
    map_len: usize,
    /// Bytes of PROT_NONE guard on each side.
    guard: usize,
    /// Offset of the data in the mapping, and its length.
    data_off: usize,
    bytes: usize,
}

// SAFETY: the mapping is plain bytes owned by this struct. Every access goes through
// `Storage::{read,write}_bytes` or an emulated launch, and both hold the device's stream lock,
// so there are never concurrent unsynchronized accesses from different threads.
unsafe impl Send for HostBuf {}
// SAFETY: as for Send: shared access is serialized by the device's stream lock.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    fn new(bytes: usize) -> Result<HostBuf> {
        let oom = |detail: String| Error::OutOfMemory { bytes, target: Target::Emulated, detail };
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(4096);
        let round = |n: usize, to: usize| n.checked_add(to - 1).map(|m| m / to * to);
        let body = round(bytes.max(1), page).ok_or_else(|| oom(String::new()))?;
        let guard = round(GUARD_BYTES, page).ok_or_else(|| oom(String::new()))?;
        let map_len = body.checked_add(2 * guard).ok_or_else(|| oom(String::new()))?;
        let aligned = round(bytes, HOST_ALIGN).ok_or_else(|| oom(String::new()))?;
        let data_off = guard + body - aligned;
        // SAFETY: an anonymous private mapping of map_len > 0 bytes, not tied to any existing
        // memory; the result is checked for MAP_FAILED.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(oom(format!(" ({})", std::io::Error::last_os_error())));
        }
        let map = NonNull::new(map.cast::<u8>()).ok_or_else(|| oom(String::new()))?;
        let buf = HostBuf { map, map_len, guard, data_off, bytes };
        // SAFETY: both ranges are whole pages inside the mapping just created.
        let protected = unsafe {
            libc::mprotect(map.as_ptr().cast(), guard, libc::PROT_NONE) == 0
                && libc::mprotect(map.as_ptr().add(guard + body).cast(), guard, libc::PROT_NONE) == 0
        };
        if !protected {
            return Err(oom(format!(" (mprotect: {})", std::io::Error::last_os_error())));
        }
        for (start, len) in buf.guard_zones() {
            // SAFETY: the guard zones lie inside the mapping's read-write body.
            unsafe { std::ptr::write_bytes(map.as_ptr().add(start), CANARY, len) };
        }
        Ok(buf)
    }
    fn data(&self) -> *mut u8 {
        // SAFETY: data_off < map_len (the data lies inside the mapping's body).
        unsafe { self.map.as_ptr().add(self.data_off) }
    }
    /// (offset in the mapping, length) of the bytes around the data that no tensor owns.
    fn guard_zones(&self) -> [(usize, usize); 2] {
        let end = self.data_off + self.bytes;
        [(self.guard, self.data_off - self.guard), (end, self.map_len - self.guard - end)]
    }
    fn check_guard_zones(&self) -> Option<String> {
        for (zone, (start, len)) in self.guard_zones().into_iter().enumerate() {
            // SAFETY: the zone lies inside the mapping's read-write body; nothing else writes
            // it while the stream lock is held (the caller holds it, or the launch is over).
            let bytes = unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(start), len) };
            if let Some(i) = bytes.iter().position(|&b| b != CANARY) {
                // Re-arm the zone: the fault is reported once, by the launch that caused it.
                // SAFETY: as above; the zone is this buffer's own slack.
                unsafe { std::ptr::write_bytes(self.map.as_ptr().add(start), CANARY, len) };
                return Some(if zone == 0 {
                    format!("{} bytes before the start of a {}-byte buffer", len - i, self.bytes)
                } else {
                    format!("{i} bytes past the end of a {}-byte buffer", self.bytes)
                });
            }
        }
        None
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`, once.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

enum Memory {
    Cuda(CudaCell),
    Host(HostBuf),
}

/// A block of device memory (GPU memory, or guarded host memory for the emulated target).
pub struct Storage {
    device: Device,
    bytes: usize,
    /// Device address of byte 0 (stable: the buffer is never reallocated).
    addr: u64,
    mem: Memory,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Storage({} bytes on {:?})", self.bytes, self.device.target())
    }
}

impl Storage {
    /// Zero-filled memory for `elems` elements of `dtype` (`bytes` = their size).
    pub(crate) fn new(device: &Device, dtype: DType, elems: usize, bytes: usize) -> Result<Storage> {
        device.count(Count::Allocation);
        match &*device.0 {
            DeviceInner::Cuda(c) => {
                let buf = CudaBuffer::alloc(&c.stream, dtype, elems)?;
                Ok(Self::from_cuda_buffer(device, buf))
            }
            DeviceInner::Emulated(_) => {
                let host = HostBuf::new(bytes)?;
                Ok(Storage { device: device.clone(), bytes, addr: host.data() as u64, mem: Memory::Host(host) })
            }
        }
    }

    /// Wraps an engine's cudarc buffer, which must belong to `device`'s CUDA context.
    pub(crate) fn wrap_cuda(device: &Device, buf: CudaBuffer) -> Result<Storage> {
        let DeviceInner::Cuda(c) = &*device.0 else {
            return Err(Error::WrongTarget { what: "Tensor::from_cuda", expected: Target::Cuda, got: device.target() });
        };
        if buf.context().cu_ctx() != c.shared.ctx.cu_ctx() {
            return Err(Error::DeviceMismatch { op: "Tensor::from_cuda", what: "slice" });
        }
        Ok(Self::from_cuda_buffer(device, buf))
    }

    /// Wraps a cudarc buffer (its context was checked by the caller).
    fn from_cuda_buffer(device: &Device, buf: CudaBuffer) -> Storage {
        let bytes = buf.num_bytes();
        let addr = match &*device.0 {
            DeviceInner::Cuda(c) => buf.ptr(&c.stream).0,
            DeviceInner::Emulated(_) => 0,
        };
        Storage {
            device: device.clone(),
            bytes,
            addr,
            mem: Memory::Cuda(CudaCell { buf: Mutex::new(buf), holder: AtomicU64::new(0) }),
        }
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    /// The device address of byte 0.
    pub(crate) fn address(&self) -> u64 {
        self.addr
    }

    /// Locks the cudarc buffer for a launch. Fails instead of deadlocking when this thread holds
    /// a [`CudaBufferGuard`] on it.
    pub(crate) fn lock_cuda(&self, op: &'static str, what: &'static str) -> Result<MutexGuard<'_, CudaBuffer>> {
        match &self.mem {
            Memory::Cuda(c) => {
                if c.holder.load(Ordering::Acquire) == thread_token() {
                    return Err(Error::StorageBusy { op, what });
                }
                Ok(c.buf.lock().unwrap_or_else(|p| p.into_inner()))
            }
            Memory::Host(_) => {
                Err(Error::WrongTarget { what: "lock_cuda", expected: Target::Cuda, got: Target::Emulated })
            }
        }
    }

    /// Exclusive access to the cudarc buffer (CUDA only).
    pub(crate) fn cuda_guard(&self) -> Result<Option<CudaBufferGuard<'_>>> {
        match &self.mem {
            Memory::Cuda(c) => {
                let guard = self.lock_cuda("cuda_buffer", "tensor")?;
                c.holder.store(thread_token(), Ordering::Release);
                Ok(Some(CudaBufferGuard { guard, holder: &c.holder }))
            }
            Memory::Host(_) => Ok(None),
        }
    }

    /// Takes the cudarc buffer out (CUDA only); gives the storage back otherwise.
    pub(crate) fn into_cuda_buffer(self) -> std::result::Result<CudaBuffer, Storage> {
        let Storage { device, bytes, addr, mem } = self;
        match mem {
            Memory::Cuda(c) => Ok(c.buf.into_inner().unwrap_or_else(|p| p.into_inner())),
            mem @ Memory::Host(_) => Err(Storage { device, bytes, addr, mem }),
        }
    }

    /// Describes a write into the guard zones of emulated memory, if any happened.
    pub(crate) fn check_guard_zone(&self) -> Option<String> {
        match &self.mem {
            Memory::Host(h) => {
                let _stream = self.emu_lock();
                h.check_guard_zones()
            }
            Memory::Cuda(_) => None,
        }
    }

    fn emu_lock(&self) -> Option<MutexGuard<'_, ()>> {
        match &*self.device.0 {
            DeviceInner::Emulated(e) => Some(e.stream.lock().unwrap_or_else(|p| p.into_inner())),
            DeviceInner::Cuda(_) => None,
        }
    }

    fn check_range(&self, start: usize, len: usize) -> Result<()> {
        if start.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(Error::InvalidView {
                what: "storage access",
                why: format!("byte range {start}..+{len} outside a {}-byte storage", self.bytes),
            });
        }
        Ok(())
    }

    /// Copies bytes to the host, waiting for the device (a download and a synchronization).
    pub(crate) fn read_bytes(&self, start: usize, len: usize) -> Result<Vec<u8>> {
        self.check_range(start, len)?;
        let mut out = vec![0u8; len];
        if len == 0 {
            return Ok(out);
        }
        self.device.count(Count::Download);
        match (&self.mem, &*self.device.0) {
            (Memory::Cuda(_), DeviceInner::Cuda(c)) => {
                let lock = self.lock_cuda("read", "tensor")?;
                let (base, guard) = lock.ptr(&c.stream);
                // SAFETY: [base+start, base+start+len) lies inside this allocation (checked above);
                // `out` is a live host buffer of exactly `len` bytes that stays in place until the
                // stream synchronization below completes the copy.
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(&mut out, base + start as u64, c.stream.cu_stream())
                }?;
                self.device.count(Count::Synchronization);
                c.stream.synchronize()?;
                drop(guard);
            }
            (Memory::Host(h), DeviceInner::Emulated(_)) => {
                let _stream = self.emu_lock();
                // SAFETY: the range is inside the allocation (checked above) and the stream lock
                // excludes concurrent kernel writes.
                unsafe { std::ptr::copy_nonoverlapping(h.data().add(start), out.as_mut_ptr(), len) };
            }
            _ => return Err(mismatch()),
        }
        Ok(out)
    }

    /// Copies host bytes in, from pageable memory, and waits for the copy to land.
    pub(crate) fn write_bytes(&self, start: usize, data: &[u8]) -> Result<()> {
        self.check_range(start, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.device.count(Count::PageableUpload);
        match (&self.mem, &*self.device.0) {
            (Memory::Cuda(_), DeviceInner::Cuda(c)) => {
                let mut lock = self.lock_cuda("write", "tensor")?;
                let (base, guard) = lock.ptr_mut(&c.stream);
                // SAFETY: the destination range is inside this allocation (checked above); `data`
                // outlives the synchronization below, which completes the copy.
                unsafe { cudarc::driver::result::memcpy_htod_async(base + start as u64, data, c.stream.cu_stream()) }?;
                drop(guard);
                self.device.count(Count::Synchronization);
                c.stream.synchronize()?;
            }
            (Memory::Host(h), DeviceInner::Emulated(_)) => {
                let _stream = self.emu_lock();
                // SAFETY: the range is inside the allocation (checked above); the stream lock
                // excludes concurrent kernel access.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), h.data().add(start), data.len()) };
            }
            _ => return Err(mismatch()),
        }
        Ok(())
    }

    /// Copies from pinned host memory (`src`, `len` bytes) in stream order without waiting: the
    /// caller keeps `src` unchanged until the copy has run (see `PinnedStaging`).
    ///
    /// # Safety
    /// `src` must point to `len` readable bytes of page-locked memory of this context that stay
    /// valid and unmodified until the stream has executed the copy.
    pub(crate) unsafe fn upload_pinned(&self, start: usize, src: *const u8, len: usize) -> Result<()> {
        self.check_range(start, len)?;
        if len == 0 {
            return Ok(());
        }
        self.device.count(Count::PinnedUpload);
        match (&self.mem, &*self.device.0) {
            (Memory::Cuda(_), DeviceInner::Cuda(c)) => {
                let mut lock = self.lock_cuda("upload", "workspace")?;
                let (base, guard) = lock.ptr_mut(&c.stream);
                // SAFETY: the destination lies inside this allocation (checked above); the source
                // is pinned and stays valid until the copy ran (the caller's contract).
                unsafe {
                    let src = std::slice::from_raw_parts(src, len);
                    cudarc::driver::result::memcpy_htod_async(base + start as u64, src, c.stream.cu_stream())
                }?;
                drop(guard);
            }
            (Memory::Host(h), DeviceInner::Emulated(_)) => {
                let _stream = self.emu_lock();
                // SAFETY: the destination range is inside the allocation (checked above); the
                // source holds `len` bytes (the caller's contract); the stream lock excludes
                // concurrent kernel access.
                unsafe { std::ptr::copy_nonoverlapping(src, h.data().add(start), len) };
            }
            _ => return Err(mismatch()),
        }
        Ok(())
    }

    /// Device-to-device copy of `len` bytes from `src` (at `src_start`) to `self` (at `start`).
    pub(crate) fn copy_from(&self, start: usize, src: &Storage, src_start: usize, len: usize) -> Result<()> {
        self.check_range(start, len)?;
        src.check_range(src_start, len)?;
        if len == 0 {
            return Ok(());
        }
        match (&self.mem, &src.mem, &*self.device.0) {
            (Memory::Cuda(_), Memory::Cuda(_), DeviceInner::Cuda(c)) => {
                if std::ptr::eq(self, src) {
                    let mut lock = self.lock_cuda("copy", "dst")?;
                    let (base, guard) = lock.ptr_mut(&c.stream);
                    // SAFETY: both ranges lie inside this allocation (checked above); the copy is
                    // queued on the stream that the guard orders.
                    unsafe {
                        cudarc::driver::result::memcpy_dtod_async(
                            base + start as u64,
                            base + src_start as u64,
                            len,
                            c.stream.cu_stream(),
                        )
                    }?;
                    drop(guard);
                } else {
                    // Lock in address order, so that two opposite copies cannot deadlock.
                    let (mut dst_lock, src_lock) = if self.addr < src.addr {
                        let d = self.lock_cuda("copy", "dst")?;
                        (d, src.lock_cuda("copy", "src")?)
                    } else {
                        let s = src.lock_cuda("copy", "src")?;
                        (self.lock_cuda("copy", "dst")?, s)
                    };
                    let (d, dg) = dst_lock.ptr_mut(&c.stream);
                    let (s, sg) = src_lock.ptr(&c.stream);
                    // SAFETY: both ranges lie inside live allocations of this context (checked
                    // above); the guards are dropped only after the copy is queued.
                    unsafe {
                        cudarc::driver::result::memcpy_dtod_async(
                            d + start as u64,
                            s + src_start as u64,
                            len,
                            c.stream.cu_stream(),
                        )
                    }?;
                    drop((dg, sg));
                }
            }
            (Memory::Host(d), Memory::Host(s), DeviceInner::Emulated(_)) => {
                let _stream = self.emu_lock();
                // SAFETY: both ranges are inside their allocations (checked above); `copy`
                // tolerates overlap; the stream lock excludes concurrent kernel access.
                unsafe { std::ptr::copy(s.data().add(src_start), d.data().add(start), len) };
            }
            _ => return Err(mismatch()),
        }
        Ok(())
    }
}

impl Storage {}

fn mismatch() -> Error {
    Error::DeviceMismatch { op: "storage", what: "memory of another target" }
}
