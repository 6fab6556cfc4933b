//! [`Device`]: a CUDA context and stream, or the emulator; and [`Queue`], what an op is queued on.

use std::sync::Arc;

use super::counters::{Count, Counters, DeviceCounters};
use super::cuda::{self, CudaKernelInfo};
use super::emulated::{self, EmuOptions};
use super::kernel::{KernelParams, KernelRef, LaunchShape};
use crate::error::{Error, Result};
use crate::target::Target;

pub(crate) enum DeviceInner {
    Cuda(cuda::CudaDevice),
    Emulated(Arc<emulated::EmuBackend>),
}

/// A device: a CUDA context and stream, or the emulator. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct Device(pub(crate) Arc<DeviceInner>);

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.description())
    }
}

/// What [`Device::select`] chose, and why CUDA was not chosen when it was not.
#[derive(Debug)]
pub struct Selection {
    /// The device chosen: CUDA device 0, or the emulated target.
    pub device: Device,
    /// Why the CUDA target was not used (no driver, no device, compute capability too low).
    pub cuda_skipped: Option<Error>,
}

/// Shared memory the CUDA runtime reserves for each resident block on 8.0 and later (the device
/// attribute `cudaDevAttrReservedSharedMemoryPerBlock`).
pub const RESERVED_SMEM_PER_BLOCK: usize = 1024;

/// Blocks of `block_bytes` shared memory (static + dynamic) that fit in `per_sm` bytes of one SM.
pub const fn blocks_per_sm_by_smem(per_sm: usize, block_bytes: usize) -> usize {
    per_sm / (block_bytes + RESERVED_SMEM_PER_BLOCK)
}

impl Device {
    /// The GPU with this ordinal, on a new non-blocking stream of its primary context. Fails
    /// cleanly (never panics) when there is no CUDA driver or no such device.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        Ok(Device(Arc::new(DeviceInner::Cuda(cuda::CudaDevice::new(ordinal)?))))
    }
    /// The GPU of `stream`'s context, queueing every launch and copy on `stream`: share an
    /// engine's own stream with the kernels of this crate.
    pub fn cuda_on_stream(stream: Arc<cudarc::driver::CudaStream>) -> Result<Device> {
        Ok(Device(Arc::new(DeviceInner::Cuda(cuda::CudaDevice::on_stream(stream)?))))
    }
    /// The same context on another of its streams (CUDA), or this device (emulated, which has
    /// one stream). Tensors of `self` may be used by calls on the returned device.
    pub fn with_stream(&self, stream: Arc<cudarc::driver::CudaStream>) -> Result<Device> {
        match &*self.0 {
            DeviceInner::Cuda(c) => {
                if stream.context().cu_ctx() != c.shared.ctx.cu_ctx() {
                    return Err(Error::DeviceMismatch { op: "with_stream", what: "stream" });
                }
                Self::cuda_on_stream(stream)
            }
            DeviceInner::Emulated(_) => {
                Err(Error::WrongTarget { what: "Device::with_stream", expected: Target::Cuda, got: Target::Emulated })
            }
        }
    }
    /// The stream this device queues work on (CUDA only).
    pub fn cuda_stream(&self) -> Option<&Arc<cudarc::driver::CudaStream>> {
        match &*self.0 {
            DeviceInner::Cuda(c) => Some(&c.stream),
            DeviceInner::Emulated(_) => None,
        }
    }
    /// Whether this device's stream is being captured into a CUDA graph (`false` on the
    /// emulated target, which has no graphs).
    pub fn is_capturing(&self) -> Result<bool> {
        match &*self.0 {
            DeviceInner::Cuda(c) => {
                Ok(c.stream.capture_status()?
                    != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
            }
            DeviceInner::Emulated(_) => Ok(false),
        }
    }
    /// The emulated target with default options (forward schedule, all cores).
    pub fn emulated() -> Device {
        Self::emulated_with(EmuOptions::default())
    }
    /// The emulated target with explicit scheduling options.
    pub fn emulated_with(options: EmuOptions) -> Device {
        Device(Arc::new(DeviceInner::Emulated(Arc::new(emulated::EmuBackend::new(options)))))
    }
    /// CUDA device 0 when a GPU is usable, otherwise the emulated target, with the reason CUDA
    /// was not used.
    pub fn select() -> Selection {
        match Self::cuda(0) {
            Ok(device) => Selection { device, cuda_skipped: None },
            Err(e) => Selection { device: Self::emulated(), cuda_skipped: Some(e) },
        }
    }
    /// CUDA device 0 when a GPU is usable, otherwise the emulated target.
    /// [`Device::select`] also says why.
    pub fn best() -> Device {
        Self::select().device
    }
    /// Why the CUDA target is not available here, or `None` when it is.
    pub fn cuda_unavailable_reason() -> Option<String> {
        cuda::probe().err().map(|e| e.to_string())
    }

    /// The target this device runs kernels on.
    pub fn target(&self) -> Target {
        match &*self.0 {
            DeviceInner::Cuda(_) => Target::Cuda,
            DeviceInner::Emulated(_) => Target::Emulated,
        }
    }
    /// A one-line description: GPU name and compute capability, or the emulator's options.
    pub fn description(&self) -> String {
        match &*self.0 {
            DeviceInner::Cuda(c) => c.description(),
            DeviceInner::Emulated(e) => e.description(),
        }
    }
    /// Number of streaming multiprocessors (the emulator reports an H100-like 132), used to size
    /// grids.
    pub fn sm_count(&self) -> usize {
        match &*self.0 {
            DeviceInner::Cuda(c) => c.shared.sm_count,
            DeviceInner::Emulated(_) => 132,
        }
    }
    /// The most shared memory one block may use, in bytes (the opt-in maximum: 227 KiB on 9.0,
    /// 163 KiB on 8.0, 99 KiB on 8.6 and 8.9). The emulated target reports that of the
    /// architecture it emulates ([`EmuOptions::arch`], 9.0 by default).
    pub fn max_shared_memory_per_block(&self) -> usize {
        match &*self.0 {
            DeviceInner::Cuda(c) => c.shared.max_optin_smem,
            DeviceInner::Emulated(e) => e.arch().max_shared_memory_per_block(),
        }
    }
    /// The shared memory of one SM, in bytes (228 KiB on 9.0, 164 KiB on 8.0, 100 KiB on 8.6 and
    /// 8.9); the emulated target reports that of the architecture it emulates.
    pub fn max_shared_memory_per_sm(&self) -> usize {
        match &*self.0 {
            DeviceInner::Cuda(c) => c.shared.max_sm_smem,
            DeviceInner::Emulated(e) => e.arch().max_shared_memory_per_sm(),
        }
    }
    /// The PTX architecture of the images loaded on this device (`sm_90`, `sm_80`), or `None`
    /// when emulated.
    pub fn ptx_arch(&self) -> Option<&'static str> {
        match &*self.0 {
            DeviceInner::Cuda(c) => Some(c.shared.arch),
            DeviceInner::Emulated(_) => None,
        }
    }
    /// Whether this device runs kernels built for sm_90a, compute capability 9.0's own features
    /// (wgmma, setmaxnreg): an H100 or H200, or the emulator standing for sm_90
    /// ([`EmuArch::Sm90`](super::EmuArch)). Hopper-only kernels are chosen only here.
    pub fn has_sm90a_features(&self) -> bool {
        match &*self.0 {
            DeviceInner::Cuda(c) => c.shared.compute_capability() == (9, 0),
            DeviceInner::Emulated(e) => e.arch().compute_capability() == 90,
        }
    }
    /// Waits until all queued work on this device's stream is done.
    pub fn synchronize(&self) -> Result<()> {
        self.count(Count::Synchronization);
        match &*self.0 {
            DeviceInner::Cuda(c) => Ok(c.stream.synchronize()?),
            DeviceInner::Emulated(_) => Ok(()),
        }
    }
    /// Whether `other` is the same device: the same CUDA context and stream, or the same
    /// emulated device.
    pub fn same(&self, other: &Device) -> bool {
        match (&*self.0, &*other.0) {
            (DeviceInner::Cuda(a), DeviceInner::Cuda(b)) => {
                a.shared.ctx.cu_ctx() == b.shared.ctx.cu_ctx() && a.stream.cu_stream() == b.stream.cu_stream()
            }
            (DeviceInner::Emulated(a), DeviceInner::Emulated(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
    /// Whether memory of `other` may be used by calls on `self`: the same CUDA context (any
    /// stream), or the same emulated device.
    pub fn same_context(&self, other: &Device) -> bool {
        match (&*self.0, &*other.0) {
            (DeviceInner::Cuda(a), DeviceInner::Cuda(b)) => a.shared.ctx.cu_ctx() == b.shared.ctx.cu_ctx(),
            (DeviceInner::Emulated(a), DeviceInner::Emulated(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The counting hook: launches, allocations, copies and host waits so far on this device's
    /// context.
    pub fn counters(&self) -> DeviceCounters {
        self.counters_ref().snapshot()
    }
    fn counters_ref(&self) -> &Counters {
        match &*self.0 {
            DeviceInner::Cuda(c) => &c.shared.counters,
            DeviceInner::Emulated(e) => &e.counters,
        }
    }
    pub(crate) fn count(&self, what: Count) {
        self.counters_ref().add(what)
    }

    /// Per-kernel facts the driver reports for the images loaded so far (CUDA only): which
    /// image (cubin or PTX JIT) each family loaded, and each loaded kernel's registers and local
    /// memory from `cuFuncGetAttribute`.
    pub fn loaded_kernels(&self) -> Vec<CudaKernelInfo> {
        match &*self.0 {
            DeviceInner::Cuda(c) => c.shared.loaded_kernels(),
            DeviceInner::Emulated(_) => Vec::new(),
        }
    }
    /// Loads (if needed) and describes one kernel (CUDA only; `None` when emulated).
    pub fn kernel_info(&self, kernel: KernelRef) -> Result<Option<CudaKernelInfo>> {
        match &*self.0 {
            DeviceInner::Cuda(c) => c.shared.kernel_info(kernel).map(Some),
            DeviceInner::Emulated(_) => Ok(None),
        }
    }

    /// Blocks of `threads` threads with `dyn_smem` bytes of dynamic shared memory that fit on
    /// one SM, from the driver's occupancy calculator (CUDA only; `None` when emulated).
    pub fn blocks_per_sm(&self, kernel: KernelRef, threads: u32, dyn_smem: u32) -> Result<Option<u32>> {
        match &*self.0 {
            DeviceInner::Cuda(c) => c.shared.blocks_per_sm(kernel, threads, dyn_smem).map(Some),
            DeviceInner::Emulated(_) => Ok(None),
        }
    }

    #[doc(hidden)]
    /// GPU timing of `f` with CUDA events (milliseconds), for benchmarks. `None` when emulated.
    pub fn time_with_events<E: From<Error>>(
        &self,
        iters: usize,
        mut f: impl FnMut() -> Result<(), E>,
    ) -> Result<Option<f64>, E> {
        match &*self.0 {
            DeviceInner::Cuda(c) => c.time_with_events(iters, &mut f).map(Some),
            DeviceInner::Emulated(_) => Ok(None),
        }
    }

    #[doc(hidden)]
    /// GPU time of `iters` calls of `f` (milliseconds, summed), each timed alone by its own event
    /// pair with `between` queued before it and not timed (benchmarks flush the L2 cache there).
    /// `None` when emulated.
    pub fn time_each_with_events<E: From<Error>>(
        &self,
        iters: usize,
        mut between: impl FnMut() -> Result<(), E>,
        mut f: impl FnMut() -> Result<(), E>,
    ) -> Result<Option<f64>, E> {
        match &*self.0 {
            DeviceInner::Cuda(c) => c.time_each_with_events(iters, &mut between, &mut f).map(Some),
            DeviceInner::Emulated(_) => Ok(None),
        }
    }
}

/// The raw launch layer: what [`crate::launch`] builds on once it has registered a call's
/// memory (and, on CUDA, taken cudarc's guards on this device's stream).
impl Device {
    /// This device's CUDA stream and its context's id, or `None` when emulated.
    pub(crate) fn cuda_stream_and_context(&self) -> Option<(&Arc<cudarc::driver::CudaStream>, usize)> {
        match &*self.0 {
            DeviceInner::Cuda(c) => Some((&c.stream, c.shared.ctx.cu_ctx() as usize)),
            DeviceInner::Emulated(_) => None,
        }
    }

    /// Queues `kernel` with its params struct on this device's stream (CUDA), or runs it under
    /// the emulated stream lock. Counted as one launch.
    pub(crate) fn launch_kernel<P: KernelParams>(
        &self,
        kernel: KernelRef,
        dims: LaunchShape,
        params: &P,
    ) -> Result<()> {
        self.count(Count::Launch);
        match &*self.0 {
            DeviceInner::Cuda(c) => c.launch(kernel, dims, params),
            DeviceInner::Emulated(e) => e.launch(kernel, dims, params),
        }
    }

    /// Queues a library call instead of one of our kernels: `cuda` gets this device's stream
    /// (cuBLAS), `host` runs under the emulated stream lock. Counted as one launch.
    pub(crate) fn launch_call(
        &self,
        cuda: impl FnOnce(&Arc<cudarc::driver::CudaStream>) -> Result<()>,
        host: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.count(Count::Launch);
        match &*self.0 {
            DeviceInner::Cuda(c) => cuda(&c.stream),
            DeviceInner::Emulated(e) => {
                let _stream = e.stream.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                host()
            }
        }
    }
}

/// Something kernels can be queued on: a [`Device`], or an engine's own cudarc stream (whose
/// context's kernel images are loaded once and shared).
pub trait Queue {
    /// The device that queues on this.
    fn queue_device(&self) -> Result<Device>;
}

impl Queue for Device {
    fn queue_device(&self) -> Result<Device> {
        Ok(self.clone())
    }
}

impl Queue for Arc<cudarc::driver::CudaStream> {
    /// No driver call and no global lock after the first call on this stream (per thread).
    fn queue_device(&self) -> Result<Device> {
        Ok(Device(Arc::new(DeviceInner::Cuda(cuda::CudaDevice::for_queue(self)?))))
    }
}
