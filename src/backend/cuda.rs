//! The CUDA target: one context, one stream, kernel modules loaded lazily from embedded PTX.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::{KernelParams, KernelRef, LaunchDims, MODULES, ModuleSource};
use crate::error::{Error, Result};

pub(crate) struct CudaBackend {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub arch: &'static str,
    pub sm_count: usize,
    name: String,
    cc: (i32, i32),
    max_optin_smem: usize,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Loaded kernels, with the dynamic shared memory they were opted in to.
    functions: Mutex<HashMap<&'static str, (CudaFunction, u32)>>,
}

impl CudaBackend {
    /// Checks that a driver library exists and reports a device, without creating a context.
    pub fn probe() -> Result<()> {
        // SAFETY: is_culib_present only tries to dlopen the driver library; it has no
        // preconditions. cudarc panics on any other driver call when the library is missing,
        // which is why every path into the CUDA target starts here.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::CudaUnavailable(
                "no CUDA driver library (libcuda.so) on this machine; use the emulated target".into(),
            ));
        }
        let n = CudaContext::device_count().map_err(|e| Error::CudaUnavailable(format!("cuInit/device count: {e}")))?;
        if n < 1 {
            return Err(Error::CudaUnavailable("the CUDA driver reports no device".into()));
        }
        Ok(())
    }

    pub fn new(ordinal: usize) -> Result<Self> {
        Self::probe()?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| Error::CudaUnavailable(format!("cannot create a context on device {ordinal}: {e}")))?;
        let stream = ctx.default_stream();
        Self::on_stream(stream)
    }

    /// A backend that queues every launch and copy on `stream` (an engine's own stream).
    pub fn on_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let ctx = stream.context().clone();
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
        let name = ctx.name()?;
        Ok(CudaBackend {
            ctx,
            stream,
            arch,
            sm_count,
            name,
            cc,
            max_optin_smem,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        })
    }

    pub fn description(&self) -> String {
        format!(
            "{} (compute capability {}.{}, {} SMs, PTX {})",
            self.name, self.cc.0, self.cc.1, self.sm_count, self.arch
        )
    }

    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    fn module(&self, name: &'static str) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = modules.get(name) {
            return Ok(m.clone());
        }
        let src: &ModuleSource = MODULES
            .iter()
            .find(|m| m.name == name)
            .ok_or(Error::KernelNotFound { module: name, symbol: "<module>" })?;
        let ptx = if self.arch == "sm_90" { src.ptx_sm90 } else { src.ptx_sm80 };
        let module = self.ctx.load_module(Ptx::from_src(ptx))?;
        modules.insert(name, module.clone());
        Ok(module)
    }

    fn function(&self, kernel: KernelRef, dyn_smem: u32) -> Result<CudaFunction> {
        let mut functions = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        let entry = match functions.get_mut(kernel.symbol) {
            Some(e) => e,
            None => {
                let f = self
                    .module(kernel.module)?
                    .load_function(kernel.symbol)
                    .map_err(|_| Error::KernelNotFound { module: kernel.module, symbol: kernel.symbol })?;
                functions.entry(kernel.symbol).or_insert((f, 48 * 1024))
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
            entry.0.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dyn_smem as i32,
            )?;
            entry.1 = dyn_smem;
        }
        Ok(entry.0.clone())
    }

    pub fn launch<P: KernelParams>(&self, kernel: KernelRef, dims: LaunchDims, params: &P) -> Result<()> {
        let func = self.function(kernel, dims.dyn_smem)?;
        let cfg = LaunchConfig { grid_dim: dims.grid, block_dim: dims.block, shared_mem_bytes: dims.dyn_smem };
        let mut builder = self.stream.launch_builder(&func);
        builder.arg(params);
        // SAFETY: `kernel.symbol` is declared `extern "C" __global__ void name(const Params p)` by
        // LLK_EXPORT_KERNELS with P as its only parameter, so the one by-value argument matches
        // the kernel signature. Every device address inside `params` came from
        // `KernelArgs::ptr` on a live tensor of this device whose guard outlives this call, and
        // the op validated the extents the kernel reads and writes.
        unsafe { builder.launch(cfg) }?;
        Ok(())
    }

    pub fn time_with_events(&self, iters: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let start = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let stop = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(&self.stream)?;
        for _ in 0..iters {
            f()?;
        }
        stop.record(&self.stream)?;
        stop.synchronize()?;
        Ok(f64::from(start.elapsed_ms(&stop)?))
    }
}
