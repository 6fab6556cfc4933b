//! The device code embedded by `build.rs`: one [`ModuleSource`] per kernel family (PTX and
//! cubins for sm_90 and sm_80, ptxas reports, the emulated registry).

use crate::ffi::emu_abi;

/// One kernel family as built by `build.rs`: its PTX and cubin per architecture, the ptxas
/// reports, and the host registry of its emulated kernels.
pub(crate) struct ModuleSource {
    pub name: &'static str,
    pub ptx_sm90: &'static str,
    pub ptx_sm80: &'static str,
    pub cubin_sm90: &'static [u8],
    pub cubin_sm80: &'static [u8],
    pub ptxas_sm90: &'static str,
    pub ptxas_sm80: &'static str,
    pub emu_table: unsafe extern "C" fn(count: *mut u64) -> *const emu_abi::LlkEmuKernel,
}

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// How `build.rs` obtained the device code embedded in this build: `"source"` (compiled by nvcc
/// here) or `"prebuilt"` (the committed `kernels/prebuilt/` files, whose manifest matched the
/// sources), followed by details.
pub const DEVICE_CODE_ORIGIN: &str = env!("LLK_DEVICE_CODE_ORIGIN");

/// Build artifacts of one kernel family, for inspection (`llama-kernels info`, static checks).
#[derive(Clone, Copy, Debug)]
#[doc(hidden)]
pub struct KernelModuleInfo {
    /// The family name, which is also the `.cu` file stem.
    pub name: &'static str,
    /// PTX for sm_90 and for sm_80, as embedded in the crate.
    pub ptx_sm90: &'static str,
    pub ptx_sm80: &'static str,
    /// Cubins for sm_90 and sm_80, as embedded in the crate.
    pub cubin_sm90: &'static [u8],
    pub cubin_sm80: &'static [u8],
    /// `ptxas -v` output for the two PTX files (registers, spills, shared memory per kernel).
    pub ptxas_sm90: &'static str,
    pub ptxas_sm80: &'static str,
}

/// Every kernel family compiled into this crate.
#[doc(hidden)]
pub fn kernel_modules() -> impl Iterator<Item = KernelModuleInfo> {
    MODULES.iter().map(|m| KernelModuleInfo {
        name: m.name,
        ptx_sm90: m.ptx_sm90,
        ptx_sm80: m.ptx_sm80,
        cubin_sm90: m.cubin_sm90,
        cubin_sm80: m.cubin_sm80,
        ptxas_sm90: m.ptxas_sm90,
        ptxas_sm80: m.ptxas_sm80,
    })
}
