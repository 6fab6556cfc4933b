//! Devices: where tensors live and kernels run.
//!
//! A [`Device`] is one of two targets that run the *same* kernel sources (`kernels/*.cu`):
//!
//! * [`Target::Cuda`]: a CUDA context and one stream of it. Kernel images (the cubin built for
//!   the GPU's architecture, else PTX for the driver to JIT) are loaded lazily, once per context
//!   and family, and shared by every `Device` on that context.
//! * [`Target::Emulated`]: the kernels compiled for the host and run by the fiber emulator
//!   (`kernels/emu/`). Launches are serialized like a stream, and every kernel is found by the
//!   same symbol name as in the PTX.
//!
//! Both launch a kernel with its one params struct (`kernels/params.h`), so they cannot drift.
//!
//! Two `Device`s on the same context and stream are the same device. A call may also run on
//! another stream of the same context ([`Device::with_stream`]): tensors and views only have to
//! belong to the same context as the launching device. cudarc's event tracking orders the
//! accesses across streams: inputs are taken with read intent, outputs with write intent.

pub(crate) mod borrowed;
mod counters;
mod cuda;
mod device;
mod emulated;
mod kernel;
mod modules;
mod staging;
pub(crate) mod storage;

pub use crate::error::DeviceCodeError;
pub use crate::target::Target;
pub(crate) use counters::Count;
pub use counters::DeviceCounters;
pub use cuda::{CudaKernelInfo, ImageKind};
pub use device::{Device, Queue, RESERVED_SMEM_PER_BLOCK, Selection, blocks_per_sm_by_smem};
pub use emulated::declared_shared_memory;
pub use emulated::{
    CpAsyncTiming, EmuArch, EmuOptions, EmulatedKernelInfo, Schedule, emulated_kernel_info, emulated_kernel_names,
};
pub use kernel::KernelRef;
pub use kernel::SharedMemory;
pub(crate) use kernel::{KernelParams, LaunchDims, LaunchShape};
pub use modules::{DEVICE_CODE_DIR_VAR, DEVICE_CODE_EXTERNAL, DEVICE_CODE_ORIGIN, KernelModuleInfo, kernel_modules};
pub use staging::PinnedStaging;
