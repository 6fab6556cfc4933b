//! The arguments of one launch: device addresses, cudarc's stream-ordering guards, and the
//! memory ranges the kernel may touch.
//!
//! Every op registers its tensors here before it launches: inputs with [`KernelArgs::read`],
//! outputs with [`KernelArgs::write`]. Registration checks that the memory belongs to the
//! launching device's context and returns an [`Arg`]: its address and layout.
//!
//! Ordering across streams follows cudarc's protocol: a borrowed cudarc buffer is taken with
//! `device_ptr` (read intent: the stream waits for its last write) or `device_ptr_mut` (write
//! intent: the stream waits for its last reads and write, and the write is recorded), and the
//! returned guards are dropped only after the launch is queued. Tensors created by this crate
//! keep their cudarc buffer behind a lock; at launch each distinct buffer is locked once and taken
//! with the strongest intent any of its views needs.

use std::sync::MutexGuard;

use cudarc::driver::SyncOnDrop;

use crate::backend::borrowed::{ReadSrc, WriteSrc};
use crate::backend::storage::{CudaBuffer, Storage};
use crate::backend::{Device, KernelParams, KernelRef, LaunchDims, LaunchShape, SharedMemory};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Dims, Tensor, TensorView, TensorViewMut};

/// A registered argument: where its first element is and how it is laid out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arg {
    /// Device address of the view's first element (its offset applied).
    pub addr: u64,
    pub dtype: DType,
    pub dims: Dims,
}

impl Arg {
    pub fn shape(&self) -> &[usize] {
        self.dims.shape()
    }
    pub fn strides(&self) -> &[usize] {
        self.dims.strides()
    }
    fn at(base: u64, dtype: DType, dims: Dims) -> Arg {
        Arg { addr: base + (dims.offset() * dtype.size()) as u64, dtype, dims }
    }
}

/// The memory one launch uses, registered before the launch is queued.
pub(crate) struct KernelArgs<'a> {
    op: &'static str,
    device: &'a Device,
    /// Buffers owned by tensors of this crate, with whether any view of them is written.
    storages: Vec<(&'a Storage, &'static str, bool)>,
    /// cudarc's guards for borrowed buffers: dropped after the launch is queued.
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> KernelArgs<'a> {
    pub fn new(op: &'static str, device: &'a Device) -> Self {
        KernelArgs { op, device, storages: Vec::new(), guards: Vec::new() }
    }

    /// The op this launch is for (its errors name it).
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// The launching device.
    pub fn device(&self) -> &'a Device {
        self.device
    }

    /// Registers an input view; returns where it is.
    pub fn read(&mut self, what: &'static str, v: &'a TensorView<'_>) -> Result<Arg> {
        let base = match v.src() {
            ReadSrc::Storage(s) => self.storage(what, s, false)?,
            ReadSrc::Cuda(c) => {
                let stream = self.cuda_stream(what, c.context_ptr())?;
                let (ptr, guard) = c.read_ptr(stream);
                self.guards.push(guard);
                ptr
            }
            ReadSrc::Host(addr) => self.host(what, *addr)?,
        };
        Ok(Arg::at(base, v.dtype(), *v.dims()))
    }

    /// Registers an output (or in-place) view; returns where it is.
    pub fn write(&mut self, what: &'static str, v: &'a mut TensorViewMut<'_>) -> Result<Arg> {
        let (dtype, dims) = (v.dtype(), *v.dims());
        let base = match v.src_mut() {
            WriteSrc::Storage(s) => self.storage(what, s, true)?,
            WriteSrc::Cuda(c) => {
                let stream = self.cuda_stream(what, c.context_ptr())?;
                let (ptr, guard) = c.write_ptr(stream);
                self.guards.push(guard);
                ptr
            }
            WriteSrc::Host(addr) => self.host(what, *addr)?,
        };
        Ok(Arg::at(base, dtype, dims))
    }

    /// Registers a tensor of this crate (workspaces, tables) as an input.
    pub fn read_tensor(&mut self, what: &'static str, t: &'a Tensor) -> Result<u64> {
        Ok(self.storage(what, t.storage(), false)? + (t.offset() * t.dtype().size()) as u64)
    }
    /// Registers a tensor of this crate (workspaces) as an output.
    pub fn write_tensor(&mut self, what: &'static str, t: &'a Tensor) -> Result<u64> {
        Ok(self.storage(what, t.storage(), true)? + (t.offset() * t.dtype().size()) as u64)
    }

    /// The launching stream, after checking that a borrowed buffer of context `ctx` may be used.
    fn cuda_stream(&self, what: &'static str, ctx: usize) -> Result<&'a cudarc::driver::CudaStream> {
        match self.device.cuda_stream_and_context() {
            Some((stream, own)) if own == ctx => Ok(stream),
            _ => Err(Error::DeviceMismatch { op: self.op, what }),
        }
    }

    fn host(&self, what: &'static str, addr: u64) -> Result<u64> {
        match self.device.cuda_stream_and_context() {
            None => Ok(addr),
            Some(_) => Err(Error::DeviceMismatch { op: self.op, what }),
        }
    }

    fn storage(&mut self, what: &'static str, s: &'a Storage, write: bool) -> Result<u64> {
        if !s.device().same_context(self.device) {
            return Err(Error::DeviceMismatch { op: self.op, what });
        }
        match self.storages.iter_mut().find(|(t, _, _)| std::ptr::eq(*t, s)) {
            Some(entry) => entry.2 |= write,
            None => self.storages.push((s, what, write)),
        }
        Ok(s.address())
    }

    /// Queues the kernel. Buffers are locked and their guards dropped only after the launch call
    /// returned. On the emulated target, the guard zones of every buffer are checked afterwards.
    pub fn launch<P: KernelParams>(self, kernel: KernelRef, dims: LaunchDims, params: &P) -> Result<()> {
        // The dynamic shared memory is the kernel's declaration (or, for a kernel sized at
        // launch, the op's). Both targets refuse a block over the device's shared memory (the
        // emulator that of the architecture it emulates), before anything is queued; the
        // emulator also counts the kernel's static shared memory.
        let dims = shape(self.op, kernel, dims)?;
        let limit = self.device.max_shared_memory_per_block();
        if dims.dyn_smem as usize > limit {
            return Err(Error::invalid(
                self.op,
                "shared memory",
                dims.dyn_smem,
                format!("{} needs more than this device's {limit} bytes per block", kernel.symbol),
            ));
        }
        let device = self.device;
        self.dispatch(kernel.symbol, || device.launch_kernel(kernel, dims, params))
    }

    /// Queues a library call instead of one of our kernels: cuBLAS on the CUDA target (`cuda` gets
    /// the launching stream; the registered addresses are device addresses of its context), a
    /// host function on the emulated target (`host` runs under the device's stream lock, where the
    /// registered addresses are host memory). The same locking, stream ordering and guard-zone
    /// checks as [`KernelArgs::launch`]; counted as one launch.
    pub fn call(
        self,
        name: &'static str,
        cuda: impl FnOnce(&std::sync::Arc<cudarc::driver::CudaStream>) -> Result<()>,
        host: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let device = self.device;
        self.dispatch(name, || device.launch_call(cuda, host))
    }

    fn dispatch(self, symbol: &'static str, queue: impl FnOnce() -> Result<()>) -> Result<()> {
        let KernelArgs { op, device, mut storages, guards } = self;
        // Lock in address order, so that two launches sharing buffers cannot deadlock.
        storages.sort_by_key(|(s, _, _)| s.address());
        match device.cuda_stream_and_context() {
            Some((stream, _)) => {
                // Lock each tensor-owned buffer once (deduplicated above), then take it with the
                // strongest intent any of its views needs.
                let mut locks: Vec<(MutexGuard<'a, CudaBuffer>, bool)> = Vec::with_capacity(storages.len());
                for (s, what, write) in &storages {
                    let lock = s.lock_cuda(op, what)?;
                    locks.push((lock, *write));
                }
                let mut storage_guards: Vec<SyncOnDrop<'_>> = Vec::with_capacity(locks.len());
                for (lock, write) in locks.iter_mut() {
                    let g = if *write { lock.ptr_mut(stream).1 } else { lock.ptr(stream).1 };
                    storage_guards.push(g);
                }
                let result = queue();
                drop(storage_guards);
                drop(locks);
                drop(guards);
                result
            }
            None => {
                let result = queue();
                drop(guards);
                // A write into a buffer's guard zone (the bytes between the end of the data and
                // the guard page) is an out-of-bounds write the guard page could not catch.
                if result.is_ok() {
                    for (s, what, _) in &storages {
                        if let Some(detail) = s.check_guard_zone() {
                            return Err(Error::Emulation {
                                kernel: symbol,
                                status: "memory fault",
                                message: format!("out-of-bounds write next to {what}: {detail}"),
                            });
                        }
                    }
                }
                result.map_err(|e| match e {
                    Error::Emulation { kernel, status, message } => {
                        Error::Emulation { kernel, status, message: describe_fault(&storages, message) }
                    }
                    other => other,
                })
            }
        }
    }
}

/// Names the buffer nearest to a faulting address in an emulated memory-fault message (the
/// runtime reports `fault address 0x...`).
fn describe_fault(storages: &[(&Storage, &'static str, bool)], message: String) -> String {
    let Some(addr) = message
        .split("fault address 0x")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_hexdigit()).next())
        .and_then(|h| u64::from_str_radix(h, 16).ok())
    else {
        return message;
    };
    let nearest = storages
        .iter()
        .map(|(s, what, _)| {
            let (lo, hi) = (s.address(), s.address() + s.bytes() as u64);
            let dist = if addr < lo { lo - addr } else { addr.saturating_sub(hi) };
            (dist, s, what, lo, hi)
        })
        .min_by_key(|x| x.0);
    match nearest {
        Some((_, s, what, _, hi)) if addr >= hi => {
            format!("{message}: {} bytes past the end of {what} (a {}-byte buffer)", addr - hi, s.bytes())
        }
        Some((_, s, what, lo, _)) if addr < lo => {
            format!("{message}: {} bytes before the start of {what} (a {}-byte buffer)", lo - addr, s.bytes())
        }
        _ => message,
    }
}

/// The launch of `kernel` with `dims`: its declared dynamic shared memory, or the size `dims`
/// gives for a kernel sized at launch. A size given for any other kernel is an error (`op` names
/// the caller): the declaration is the only source of the number.
fn shape(op: &'static str, kernel: KernelRef, dims: LaunchDims) -> Result<LaunchShape> {
    let dyn_smem = match (kernel.shared_memory()?, dims.smem_at_launch) {
        (SharedMemory::AtLaunch, bytes) => bytes,
        (declared, 0) => declared.bytes(),
        (declared, bytes) => {
            return Err(Error::invalid(
                op,
                "shared memory",
                bytes,
                format!("{} declares its dynamic shared memory ({declared:?}); a launch cannot size it", kernel.symbol),
            ));
        }
    };
    Ok(LaunchShape { grid: dims.grid, block: dims.block, dyn_smem })
}
