//! The CUDA target: per context, kernel images loaded lazily and shared by every stream.
//!
//! Which image a family loads: the embedded cubin built for the GPU's architecture family when
//! there is one (sm_90 cubins for compute capability 9.x, sm_80 for 8.x: SASS runs on later
//! minor versions of its major), else the sm_90 PTX, which the driver JIT-compiles (newer GPUs).
//! A cubin that the driver refuses falls back to PTX too. `Device::loaded_kernels` tells which
//! image each family got. A build with external device code reads the images from
//! `LLK_DEVICE_CODE_DIR` on the first load (see `modules`), and fails that load with
//! `Error::DeviceCode` when they cannot be used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::counters::{Count, Counters};
use super::kernel::{KernelParams, KernelRef, LaunchShape};
use super::modules::{MODULES, ModuleSource};
use crate::error::{Error, Result};

/// Which kind of image a kernel family was loaded from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    /// The embedded cubin for this architecture: no JIT.
    Cubin(&'static str),
    /// The embedded PTX for this architecture, JIT-compiled by the driver.
    PtxJit(&'static str),
}

impl std::fmt::Display for ImageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageKind::Cubin(a) => write!(f, "cubin {a}"),
            ImageKind::PtxJit(a) => write!(f, "PTX {a} (JIT)"),
        }
    }
}

/// What the driver reports about one loaded kernel (`cuFuncGetAttribute`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaKernelInfo {
    /// The kernel family (module) it belongs to.
    pub module: &'static str,
    /// The kernel's symbol.
    pub symbol: &'static str,
    /// Which image the family was loaded from.
    pub image: ImageKind,
    /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub registers: i32,
    /// Local memory per thread in bytes, spills included (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`).
    pub local_bytes: i32,
    /// Static shared memory per block in bytes (`CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`).
    pub static_smem_bytes: i32,
    /// Most threads a block of it may have (`CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`).
    pub max_threads_per_block: i32,
}

/// Checks that a driver library exists and reports a device, without creating a context.
pub(crate) fn probe() -> Result<()> {
    // Linked rather than loaded (the feature off), the driver library is there if the program
    // started.
    #[cfg(feature = "cuda-dynamic-loading")]
    // SAFETY: is_culib_present only tries to dlopen the driver library; it has no
    // preconditions. cudarc panics on any other driver call when the library is missing,
    // which is why every path into the CUDA target starts here.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::CudaUnavailable(
            "no CUDA driver library (libcuda.so) on this machine; using the emulated target".into(),
        ));
    }
    let n = CudaContext::device_count().map_err(|e| Error::CudaUnavailable(format!("cuInit/device count: {e}")))?;
    if n < 1 {
        return Err(Error::CudaUnavailable("the CUDA driver reports no device".into()));
    }
    Ok(())
}

/// State shared by every device (stream) of one CUDA context.
pub(crate) struct CudaShared {
    pub ctx: Arc<CudaContext>,
    pub arch: &'static str,
    pub sm_count: usize,
    pub counters: Counters,
    name: String,
    cc: (i32, i32),
    pub(crate) max_optin_smem: usize,
    pub(crate) max_sm_smem: usize,
    modules: Mutex<HashMap<&'static str, (Arc<CudaModule>, ImageKind)>>,
    /// Loaded kernels, with the dynamic shared memory they were opted in to.
    functions: Mutex<HashMap<KernelRef, (CudaFunction, u32)>>,
}

/// One `CudaShared` per live context, so that devices built from an engine's streams share the
/// loaded images.
fn shared_for(ctx: &Arc<CudaContext>) -> Result<Arc<CudaShared>> {
    static REGISTRY: OnceLock<Mutex<Vec<(usize, Weak<CudaShared>)>>> = OnceLock::new();
    let mut reg = REGISTRY.get_or_init(|| Mutex::new(Vec::new())).lock().unwrap_or_else(|p| p.into_inner());
    reg.retain(|(_, w)| w.strong_count() > 0);
    let key = ctx.cu_ctx() as usize;
    if let Some(s) = reg.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade()) {
        return Ok(s);
    }
    let s = Arc::new(CudaShared::new(ctx.clone())?);
    reg.push((key, Arc::downgrade(&s)));
    Ok(s)
}

impl CudaShared {
    fn new(ctx: Arc<CudaContext>) -> Result<Self> {
        let cc = ctx.compute_capability()?;
        let arch = match cc {
            (major, _) if major >= 9 => "sm_90",
            (8, _) => "sm_80",
            (major, minor) => {
                return Err(Error::CudaUnavailable(format!(
                    "compute capability {major}.{minor} is below 8.0 (the kernels need bf16 mma.sync)"
                )));
            }
        };
        let sm_count = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as usize;
        let max_optin_smem =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as usize;
        let max_sm_smem = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?
            .max(0) as usize;
        let name = ctx.name()?;
        Ok(CudaShared {
            ctx,
            arch,
            sm_count,
            counters: Counters::default(),
            name,
            cc,
            max_optin_smem,
            max_sm_smem,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The GPU's compute capability (major, minor).
    pub(crate) fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    fn module(&self, name: &'static str) -> Result<(Arc<CudaModule>, ImageKind)> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = modules.get(name) {
            return Ok(m.clone());
        }
        let src: &ModuleSource = MODULES
            .iter()
            .find(|m| m.name == name)
            .ok_or(Error::KernelNotFound { module: name, symbol: "<module>" })?;
        // Embedded, or (a build with external device code) read from LLK_DEVICE_CODE_DIR and checked.
        let src = src.files()?;
        let cubin = match self.cc.0 {
            9 => Some(("sm_90", src.cubin_sm90)),
            8 => Some(("sm_80", src.cubin_sm80)),
            _ => None,
        };
        let loaded = match cubin {
            Some((arch, bytes)) if !bytes.is_empty() => {
                match self.ctx.load_module(Ptx::from_binary(bytes.to_vec())) {
                    Ok(m) => Some((m, ImageKind::Cubin(arch))),
                    Err(_) => None, // fall back to PTX below
                }
            }
            _ => None,
        };
        let entry = match loaded {
            Some(e) => e,
            None => {
                let ptx = if self.arch == "sm_90" { src.ptx_sm90 } else { src.ptx_sm80 };
                (self.ctx.load_module(Ptx::from_src(ptx))?, ImageKind::PtxJit(self.arch))
            }
        };
        modules.insert(name, entry.clone());
        Ok(entry)
    }

    fn function(&self, kernel: KernelRef, dyn_smem: u32) -> Result<CudaFunction> {
        let mut functions = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        let entry = match functions.get_mut(&kernel) {
            Some(e) => e,
            None => {
                // cuModuleGetFunction and cuFuncSetAttribute act on the current context, which
                // a thread that never used this context does not have: bind it first (cudarc
                // binds only in its own calls that need it, such as module loading).
                self.ctx.bind_to_thread()?;
                let f = self
                    .module(kernel.module)?
                    .0
                    .load_function(kernel.symbol)
                    .map_err(|_| Error::KernelNotFound { module: kernel.module, symbol: kernel.symbol })?;
                functions.entry(kernel).or_insert((f, 48 * 1024))
            }
        };
        // Above 48 KiB, dynamic shared memory needs an opt-in, once per size increase.
        if dyn_smem > entry.1 {
            if dyn_smem as usize > self.max_optin_smem {
                return Err(Error::invalid(
                    kernel.symbol,
                    "dynamic shared memory",
                    dyn_smem,
                    format!("exceeds the device's {} bytes per block", self.max_optin_smem),
                ));
            }
            self.ctx.bind_to_thread()?;
            entry.0.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dyn_smem as i32,
            )?;
            // Prefer the largest shared-memory carveout (100%: 228 KB per SM on Hopper), so that
            // two attention blocks of ~96 KB fit on one SM next to each other.
            entry.0.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)?;
            entry.1 = dyn_smem;
        }
        Ok(entry.0.clone())
    }

    pub fn kernel_info(&self, kernel: KernelRef) -> Result<CudaKernelInfo> {
        let f = self.function(kernel, 0)?;
        let image = self.module(kernel.module)?.1;
        self.ctx.bind_to_thread()?;
        let attr = |a| f.get_attribute(a);
        Ok(CudaKernelInfo {
            module: kernel.module,
            symbol: kernel.symbol,
            image,
            registers: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            static_smem_bytes: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            max_threads_per_block: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        })
    }

    /// Blocks of `threads` threads and `dyn_smem` bytes of dynamic shared memory that fit on one
    /// SM at once, as the driver computes it (`cuOccupancyMaxActiveBlocksPerMultiprocessor`),
    /// after the same opt-in and carveout a launch sets.
    pub fn blocks_per_sm(&self, kernel: KernelRef, threads: u32, dyn_smem: u32) -> Result<u32> {
        let f = self.function(kernel, dyn_smem)?;
        self.ctx.bind_to_thread()?;
        Ok(f.occupancy_max_active_blocks_per_multiprocessor(threads, dyn_smem as usize, None)?)
    }

    pub fn loaded_kernels(&self) -> Vec<CudaKernelInfo> {
        let kernels: Vec<KernelRef> = {
            let functions = self.functions.lock().unwrap_or_else(|p| p.into_inner());
            let mut v: Vec<KernelRef> = functions.keys().copied().collect();
            v.sort();
            v
        };
        kernels.into_iter().filter_map(|kernel| self.kernel_info(kernel).ok()).collect()
    }
}

thread_local! {
    /// The stream last queued on from this thread (its address) and its context's shared state.
    static LAST_QUEUE: std::cell::RefCell<Option<(usize, Weak<CudaShared>)>> = const { std::cell::RefCell::new(None) };
}

/// One stream of a context.
pub(crate) struct CudaDevice {
    pub shared: Arc<CudaShared>,
    pub stream: Arc<CudaStream>,
}

impl CudaDevice {
    pub fn new(ordinal: usize) -> Result<Self> {
        probe()?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| Error::CudaUnavailable(format!("cannot create a context on device {ordinal}: {e}")))?;
        // A non-blocking stream of our own, never the legacy null stream: it does not serialize
        // with other streams, and it can be captured into a CUDA graph.
        let stream = ctx.new_stream()?;
        Self::on_stream(stream)
    }

    /// A device that queues every launch and copy on `stream` (an engine's own stream).
    pub fn on_stream(stream: Arc<CudaStream>) -> Result<Self> {
        probe()?;
        let shared = shared_for(stream.context())?;
        Ok(CudaDevice { shared, stream })
    }

    /// [`CudaDevice::on_stream`] for a queue: the last stream queued on from this thread keeps
    /// its context's shared state, so a launch on an engine's `Arc<CudaStream>` makes no driver
    /// call and takes no global lock (the first call per stream and thread does both).
    pub fn for_queue(stream: &Arc<CudaStream>) -> Result<Self> {
        let ptr = Arc::as_ptr(stream) as usize;
        let hit = LAST_QUEUE
            .with(|last| last.borrow().as_ref().filter(|(p, _)| *p == ptr).and_then(|(_, shared)| shared.upgrade()));
        // A freed stream's address may be reused by one of another context: compare the context.
        if let Some(shared) = hit.filter(|s| s.ctx.cu_ctx() == stream.context().cu_ctx()) {
            return Ok(CudaDevice { shared, stream: stream.clone() });
        }
        let device = Self::on_stream(stream.clone())?;
        LAST_QUEUE.with(|last| *last.borrow_mut() = Some((ptr, Arc::downgrade(&device.shared))));
        Ok(device)
    }

    pub fn description(&self) -> String {
        let s = &self.shared;
        format!("{} (compute capability {}.{}, {} SMs, {} images)", s.name, s.cc.0, s.cc.1, s.sm_count, s.arch)
    }

    pub fn launch<P: KernelParams>(&self, kernel: KernelRef, dims: LaunchShape, params: &P) -> Result<()> {
        let func = self.shared.function(kernel, dims.dyn_smem)?;
        let cfg = LaunchConfig { grid_dim: dims.grid, block_dim: dims.block, shared_mem_bytes: dims.dyn_smem };
        let mut builder = self.stream.launch_builder(&func);
        builder.arg(params);
        // SAFETY: `kernel.symbol` is declared `extern "C" __global__ void name(const Params p)` by
        // LLK_EXPORT_KERNELS with P as its only parameter, so the one by-value argument matches
        // the kernel signature. Every device address inside `params` came from `KernelArgs` for
        // memory of this context whose guard (and lock) outlives this call, and the op validated
        // the extents the kernel reads and writes.
        unsafe { builder.launch(cfg) }?;
        Ok(())
    }

    /// Total event time of `iters` calls of `f`, each timed alone with `between` (not timed)
    /// queued before it.
    pub fn time_each_with_events<E: From<Error>>(
        &self,
        iters: usize,
        between: &mut dyn FnMut() -> Result<(), E>,
        f: &mut dyn FnMut() -> Result<(), E>,
    ) -> Result<f64, E> {
        let ctx = &self.shared.ctx;
        let driver = |e: cudarc::driver::DriverError| E::from(Error::from(e));
        let mut events = Vec::with_capacity(iters);
        for _ in 0..iters {
            between()?;
            let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver)?;
            start.record(&self.stream).map_err(driver)?;
            f()?;
            let stop = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver)?;
            stop.record(&self.stream).map_err(driver)?;
            events.push((start, stop));
        }
        self.shared.counters.add(Count::Synchronization);
        self.stream.synchronize().map_err(driver)?;
        let mut total = 0.0;
        for (a, b) in &events {
            total += f64::from(a.elapsed_ms(b).map_err(driver)?);
        }
        Ok(total)
    }

    pub fn time_with_events<E: From<Error>>(
        &self,
        iters: usize,
        f: &mut dyn FnMut() -> Result<(), E>,
    ) -> Result<f64, E> {
        let ctx = &self.shared.ctx;
        let driver = |e: cudarc::driver::DriverError| E::from(Error::from(e));
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver)?;
        let stop = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver)?;
        start.record(&self.stream).map_err(driver)?;
        for _ in 0..iters {
            f()?;
        }
        stop.record(&self.stream).map_err(driver)?;
        self.shared.counters.add(Count::Synchronization);
        stop.synchronize().map_err(driver)?;
        Ok(f64::from(start.elapsed_ms(&stop).map_err(driver)?))
    }
}
