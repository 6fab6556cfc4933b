//! The emulated target: kernels compiled for the host, run by the fiber emulator.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Mutex, OnceLock};

use super::counters::Counters;
use super::kernel::{KernelParams, KernelRef, LaunchDims};
use super::modules::MODULES;
use crate::error::{Error, Result};
use crate::ffi::emu_abi::{
    LlkEmuCpAsyncTiming, LlkEmuKernel, LlkEmuLaunch, LlkEmuReport, LlkEmuSchedule, LlkEmuStatus,
};

/// Order in which the emulator runs the threads of a block between two barriers.
///
/// A correct kernel gives bit-identical results under every schedule; a race between barrier
/// intervals shows up as a difference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Thread 0 first.
    Forward,
    /// The last thread first.
    Reverse,
    /// A seeded random permutation at every round.
    Random {
        /// Seeds the permutations: one seed, one schedule.
        seed: u64,
    },
    /// One warp at a time (lowest first, or highest first when `reverse`), each running until
    /// all its threads wait at `__syncthreads`: the largest skew between warps a barrier allows.
    WarpByWarp {
        /// The highest warp first instead of the lowest.
        reverse: bool,
    },
}

/// When the emulator completes `cp.async` copies. A correct kernel gives the same result under
/// both; the difference exposes a read before `cp.async.wait_group` (`AtWait`) or a shared-memory
/// stage refilled while another warp still reads it (`AtIssue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CpAsyncTiming {
    /// At the wait: the latest moment the PTX ISA allows.
    #[default]
    AtWait,
    /// At the copy instruction: the earliest.
    AtIssue,
}

/// Options of the emulated target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmuOptions {
    /// Order of a block's threads between barriers (default [`Schedule::Forward`]).
    pub schedule: Schedule,
    /// When `cp.async` copies complete (default [`CpAsyncTiming::AtWait`]).
    pub cp_async: CpAsyncTiming,
    /// OS threads that run blocks concurrently (default: the machine's cores).
    pub os_threads: u32,
    /// Stack bytes per emulated CUDA thread (default 64 KiB).
    pub stack_bytes: u32,
}

impl Default for EmuOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        EmuOptions {
            schedule: Schedule::Forward,
            cp_async: CpAsyncTiming::AtWait,
            os_threads: cores.min(64) as u32,
            stack_bytes: 64 * 1024,
        }
    }
}

impl EmuOptions {
    /// Default options with another schedule.
    pub fn with_schedule(schedule: Schedule) -> Self {
        EmuOptions { schedule, ..Self::default() }
    }
}

#[derive(Clone, Copy)]
struct Entry {
    module: &'static str,
    params_size: u64,
    launch: unsafe extern "C" fn(*const std::ffi::c_void, *const LlkEmuLaunch, *mut LlkEmuReport) -> LlkEmuStatus,
}

/// Every emulated kernel, by symbol, read once from the per-family tables that
/// `LLK_EXPORT_KERNELS` emits.
pub(crate) struct Registry {
    by_symbol: HashMap<&'static str, Entry>,
    by_module: HashMap<&'static str, Vec<&'static str>>,
}

impl Registry {
    fn build() -> Registry {
        let mut by_symbol = HashMap::new();
        let mut by_module: HashMap<&'static str, Vec<&'static str>> = HashMap::new();
        for m in MODULES {
            let mut count = 0u64;
            // SAFETY: `emu_table` is `llk_emu_kernels_<family>` from kernels/<family>.cu (generated
            // by LLK_EXPORT_KERNELS): it writes the table length and returns a pointer to a
            // static array of that many entries, valid for the life of the program.
            let table: &'static [LlkEmuKernel] = unsafe {
                let ptr = (m.emu_table)(&mut count);
                if ptr.is_null() { &[] } else { std::slice::from_raw_parts(ptr, count as usize) }
            };
            for k in table {
                // SAFETY: each name is a string literal (`#name` in the macro): NUL-terminated, static.
                let name = unsafe { CStr::from_ptr(k.name) }.to_str().unwrap_or("<non-utf8 kernel name>");
                by_module.entry(m.name).or_default().push(name);
                if let Some(launch) = k.launch {
                    by_symbol.insert(name, Entry { module: m.name, params_size: k.params_size, launch });
                }
            }
        }
        Registry { by_symbol, by_module }
    }
    pub(crate) fn names(&self, module: &str) -> Vec<&'static str> {
        self.by_module.get(module).cloned().unwrap_or_default()
    }
}

pub(crate) fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::build)
}

pub(crate) struct EmuBackend {
    options: EmuOptions,
    pub(crate) counters: Counters,
    /// Serializes launches and host copies, like a CUDA stream: host memory of this device is
    /// only touched while it is held.
    pub(crate) stream: Mutex<()>,
}

impl EmuBackend {
    pub fn new(options: EmuOptions) -> Self {
        EmuBackend { options, counters: Counters::default(), stream: Mutex::new(()) }
    }
    pub fn description(&self) -> String {
        let sched = match self.options.schedule {
            Schedule::Forward => "forward".to_string(),
            Schedule::Reverse => "reverse".to_string(),
            Schedule::Random { seed } => format!("random(seed {seed})"),
            Schedule::WarpByWarp { reverse: false } => "warp-by-warp".to_string(),
            Schedule::WarpByWarp { reverse: true } => "warp-by-warp (last warp first)".to_string(),
        };
        let copies = match self.options.cp_async {
            CpAsyncTiming::AtWait => "cp.async at wait",
            CpAsyncTiming::AtIssue => "cp.async at issue",
        };
        format!("CPU emulation ({sched} schedule, {copies}, {} OS threads)", self.options.os_threads)
    }

    pub fn launch<P: KernelParams>(&self, kernel: KernelRef, dims: LaunchDims, params: &P) -> Result<()> {
        let entry = registry()
            .by_symbol
            .get(kernel.symbol)
            .filter(|e| e.module == kernel.module)
            .copied()
            .ok_or(Error::KernelNotFound { module: kernel.module, symbol: kernel.symbol })?;
        if entry.params_size != std::mem::size_of::<P>() as u64 {
            return Err(Error::Emulation {
                kernel: kernel.symbol,
                status: "bad launch",
                message: format!(
                    "params struct is {} bytes in Rust but {} bytes in C: regenerate src/ffi/params.rs",
                    std::mem::size_of::<P>(),
                    entry.params_size
                ),
            });
        }
        let (schedule, seed) = match self.options.schedule {
            Schedule::Forward => (LlkEmuSchedule::LLK_EMU_FORWARD, 0),
            Schedule::Reverse => (LlkEmuSchedule::LLK_EMU_REVERSE, 0),
            Schedule::Random { seed } => (LlkEmuSchedule::LLK_EMU_RANDOM, seed),
            Schedule::WarpByWarp { reverse: false } => (LlkEmuSchedule::LLK_EMU_WARP_SERIAL, 0),
            Schedule::WarpByWarp { reverse: true } => (LlkEmuSchedule::LLK_EMU_WARP_SERIAL_REVERSE, 0),
        };
        let cfg = LlkEmuLaunch {
            grid: [dims.grid.0, dims.grid.1, dims.grid.2],
            block: [dims.block.0, dims.block.1, dims.block.2],
            dyn_smem_bytes: u64::from(dims.dyn_smem),
            schedule,
            seed,
            os_threads: self.options.os_threads.max(1),
            stack_bytes: self.options.stack_bytes,
            cp_async_timing: match self.options.cp_async {
                CpAsyncTiming::AtWait => LlkEmuCpAsyncTiming::LLK_EMU_CP_ASYNC_AT_WAIT,
                CpAsyncTiming::AtIssue => LlkEmuCpAsyncTiming::LLK_EMU_CP_ASYNC_AT_ISSUE,
            },
        };
        let mut report = LlkEmuReport::default();
        let _stream = self.stream.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // SAFETY: `entry.launch` is `llk_emu::launch_entry<P, kernel>` for the kernel named
        // `kernel.symbol`, whose params struct has the size just checked; it copies `params`
        // before running. Every pointer inside `params` was produced by `KernelArgs::ptr` from a
        // live tensor of this device (host memory), borrowed for the duration of this call, and
        // the ops validated the extents the kernel will touch. The stream lock is held, so no
        // other launch or copy touches this device's memory concurrently.
        let status = unsafe { (entry.launch)((params as *const P).cast(), &cfg, &mut report) };
        if status == LlkEmuStatus::LLK_EMU_OK {
            return Ok(());
        }
        // SAFETY: the runtime always NUL-terminates `message` (snprintf into the fixed array).
        let message = unsafe { CStr::from_ptr(report.message.as_ptr()) }.to_string_lossy().into_owned();
        Err(Error::Emulation { kernel: kernel.symbol, status: status_name(status), message })
    }
}

fn status_name(s: LlkEmuStatus) -> &'static str {
    match s {
        LlkEmuStatus::LLK_EMU_OK => "ok",
        LlkEmuStatus::LLK_EMU_BAD_LAUNCH => "bad launch",
        LlkEmuStatus::LLK_EMU_DEADLOCK => "deadlock",
        LlkEmuStatus::LLK_EMU_DIVERGENT_BARRIER => "divergent barrier",
        LlkEmuStatus::LLK_EMU_UNSUPPORTED => "unsupported operation",
        LlkEmuStatus::LLK_EMU_KERNEL_TRAP => "kernel trap",
        LlkEmuStatus::LLK_EMU_MEMORY_FAULT => "memory fault",
    }
}

/// The names of all kernels in the emulated registry of `family`, in table order.
#[doc(hidden)]
pub fn emulated_kernel_names(family: &str) -> Vec<&'static str> {
    registry().names(family)
}
