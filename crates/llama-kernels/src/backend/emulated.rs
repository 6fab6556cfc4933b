//! The emulated target: kernels compiled for the host, run by the fiber emulator.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Mutex, OnceLock};

use super::counters::Counters;
use super::kernel::{KernelParams, KernelRef, LaunchShape, SharedMemory};
use super::modules::MODULES;
use crate::error::{Error, Result};
use crate::ffi::emu_abi::{
    LlkEmuCpAsyncTiming, LlkEmuKernel, LlkEmuLaunch, LlkEmuReport, LlkEmuSchedule, LlkEmuStatus, LlkSmemRule,
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

/// The GPU architecture the emulator holds launches to: its per-block shared-memory limit
/// (static + dynamic, with the opt-in attribute: sm_90 227 KiB, sm_80 163 KiB, sm_86 and sm_89
/// 99 KiB) and the kernels' static shared memory as ptxas reports it for that architecture (the
/// sm_80 build for every 8.x). A launch over the limit fails with the status
/// `"shared memory limit"`, as it would fail to launch on that GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum EmuArch {
    /// Ampere data center (A100): 163 KiB per block.
    Sm80,
    /// Ampere consumer (RTX 30xx, A10, A40): 99 KiB per block.
    Sm86,
    /// Ada (RTX 40xx, L4, L40): 99 KiB per block.
    Sm89,
    /// Hopper (H100, H200): 227 KiB per block.
    #[default]
    Sm90,
}

impl EmuArch {
    /// The compute capability times ten (80, 86, 89, 90).
    pub fn compute_capability(self) -> u32 {
        match self {
            EmuArch::Sm80 => 80,
            EmuArch::Sm86 => 86,
            EmuArch::Sm89 => 89,
            EmuArch::Sm90 => 90,
        }
    }
    /// The shared memory of one SM, in bytes (164 KiB on 8.0, 100 KiB on 8.6 and 8.9, 228 KiB on
    /// 9.0): with [`RESERVED_SMEM_PER_BLOCK`](super::RESERVED_SMEM_PER_BLOCK), how many blocks of a size fit on an SM.
    pub const fn max_shared_memory_per_sm(self) -> usize {
        match self {
            EmuArch::Sm80 => 164 * 1024,
            EmuArch::Sm86 | EmuArch::Sm89 => 100 * 1024,
            EmuArch::Sm90 => 228 * 1024,
        }
    }
    /// The most shared memory (static + dynamic) one block may use on this architecture, in
    /// bytes. The emulation runtime enforces the same table (kernels/emu/emu_runtime.h).
    pub const fn max_shared_memory_per_block(self) -> usize {
        match self {
            EmuArch::Sm80 => 163 * 1024,
            EmuArch::Sm86 | EmuArch::Sm89 => 99 * 1024,
            EmuArch::Sm90 => 227 * 1024,
        }
    }
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
    /// The architecture whose shared-memory limit launches are checked against (default
    /// [`EmuArch::Sm90`]).
    pub arch: EmuArch,
}

impl Default for EmuOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        EmuOptions {
            schedule: Schedule::Forward,
            cp_async: CpAsyncTiming::AtWait,
            os_threads: cores.min(64) as u32,
            stack_bytes: 64 * 1024,
            arch: EmuArch::Sm90,
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
    /// The kernel's `__launch_bounds__` (max threads per block), as the host table records it.
    max_threads: u32,
    /// Static shared memory bytes from the ptxas reports: sm_90, sm_80.
    static_smem: [u32; 2],
    /// Its declared dynamic shared memory (its row's `LLK_SMEM_*`).
    smem: SharedMemory,
}

/// Static shared memory per kernel in a `ptxas -v` report: the `N bytes smem` of the `Used ...`
/// line that follows each `Compiling entry function 'name'` (no such field: 0).
fn static_smem_by_kernel(report: &'static str) -> HashMap<&'static str, u32> {
    let mut out = HashMap::new();
    let mut current: Option<&'static str> = None;
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = rest.split('\'').next();
            if let Some(name) = current {
                out.insert(name, 0);
            }
        } else if let (Some(name), Some(at)) = (current, line.find(" bytes smem")) {
            // `Used 30 registers, used 1 barriers, 128 bytes smem, ...`: the number just before.
            let bytes = line[..at].rsplit([' ', ',']).next().and_then(|n| n.parse::<u32>().ok()).unwrap_or(0);
            out.insert(name, bytes);
        }
    }
    out
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
            // Static shared memory from the ptxas reports. With external device code whose
            // folder is not set (LLK_DEVICE_CODE_DIR), the reports are unavailable and the
            // emulator checks the dynamic part of a launch alone.
            let (smem90, smem80) = match m.files() {
                Ok(f) => (static_smem_by_kernel(f.ptxas_sm90), static_smem_by_kernel(f.ptxas_sm80)),
                Err(_) => Default::default(),
            };
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
                    let static_smem = [smem90.get(name).copied().unwrap_or(0), smem80.get(name).copied().unwrap_or(0)];
                    let entry = Entry {
                        module: m.name,
                        params_size: k.params_size,
                        launch,
                        max_threads: k.max_threads,
                        static_smem,
                        smem: match k.smem_rule {
                            LlkSmemRule::LLK_SMEM_RULE_NONE => SharedMemory::None,
                            LlkSmemRule::LLK_SMEM_RULE_FIXED => SharedMemory::Fixed(k.smem_bytes),
                            LlkSmemRule::LLK_SMEM_RULE_AT_LAUNCH => SharedMemory::AtLaunch,
                        },
                    };
                    by_symbol.insert(name, entry);
                }
            }
        }
        Registry { by_symbol, by_module }
    }
    pub(crate) fn names(&self, module: &str) -> Vec<&'static str> {
        self.by_module.get(module).cloned().unwrap_or_default()
    }
    /// The declared dynamic shared memory of `symbol`, if a family lists it.
    pub(crate) fn shared_memory(&self, symbol: &str) -> Option<SharedMemory> {
        self.by_symbol.get(symbol).map(|e| e.smem)
    }
    fn entry(&self, symbol: &str) -> Option<&Entry> {
        self.by_symbol.get(symbol)
    }
}

impl KernelRef {
    /// The kernel's declared dynamic shared memory (its row's `LLK_SMEM_*`, read from the
    /// registry of the host build, which every build links). An error only for a symbol no
    /// family lists (a build problem, never a user error).
    pub fn shared_memory(self) -> Result<SharedMemory> {
        declared_shared_memory(self.symbol).ok_or(Error::KernelNotFound { module: self.module, symbol: self.symbol })
    }
}

/// The declared dynamic shared memory of the kernel named `symbol` in any family, if one lists it.
pub fn declared_shared_memory(symbol: &str) -> Option<SharedMemory> {
    registry().shared_memory(symbol)
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
    /// The architecture this device emulates.
    pub fn arch(&self) -> EmuArch {
        self.options.arch
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
        format!(
            "CPU emulation ({sched} schedule, {copies}, sm_{} limits, {} OS threads)",
            self.options.arch.compute_capability(),
            self.options.os_threads
        )
    }

    pub fn launch<P: KernelParams>(&self, kernel: KernelRef, dims: LaunchShape, params: &P) -> Result<()> {
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
            arch: self.options.arch.compute_capability(),
            static_smem_bytes: match self.options.arch {
                EmuArch::Sm90 => entry.static_smem[0],
                EmuArch::Sm80 | EmuArch::Sm86 | EmuArch::Sm89 => entry.static_smem[1],
            },
        };
        let mut report = LlkEmuReport::default();
        let _stream = self.stream.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // SAFETY: `entry.launch` is `llk_emu::launch_entry<P, kernel, bound>` for the kernel named
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
        LlkEmuStatus::LLK_EMU_LAUNCH_BOUNDS => "launch bounds exceeded",
        LlkEmuStatus::LLK_EMU_SHARED_MEMORY_LIMIT => "shared memory limit",
        LlkEmuStatus::LLK_EMU_MISALIGNED => "misaligned access",
        LlkEmuStatus::LLK_EMU_PARAMS_OVERRUN => "params overrun",
        LlkEmuStatus::LLK_EMU_INDEX_OUT_OF_BOUNDS => "index out of bounds",
        LlkEmuStatus::LLK_EMU_SHARED_MEMORY_DECLARATION => "shared memory declaration",
    }
}

/// The names of all kernels in the emulated registry of `family`, in table order.
#[doc(hidden)]
pub fn emulated_kernel_names(family: &str) -> Vec<&'static str> {
    registry().names(family)
}

/// What the emulated registry knows of one kernel beyond its name: its `__launch_bounds__` and its
/// static shared memory (from the ptxas reports), for the static checks against the PTX.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmulatedKernelInfo {
    /// Max threads per block the emulator allows (the kernel's first launch bound).
    pub max_threads: u32,
    /// Static shared memory in bytes, sm_90 build.
    pub static_smem_sm90: u32,
    /// Static shared memory in bytes, sm_80 build.
    pub static_smem_sm80: u32,
}

/// The emulated registry's record of `symbol` (None if it has none).
#[doc(hidden)]
pub fn emulated_kernel_info(symbol: &str) -> Option<EmulatedKernelInfo> {
    registry().entry(symbol).map(|e| EmulatedKernelInfo {
        max_threads: e.max_threads,
        static_smem_sm90: e.static_smem[0],
        static_smem_sm80: e.static_smem[1],
    })
}
