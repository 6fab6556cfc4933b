//! What this build of the crate found, for the tools that read its device code (the static
//! checks and the performance report of `llama-kernels-inspect`).

/// The folder of the CUDA tools the build used or found (`nvcc`, `ptxas`, `cuobjdump`,
/// `nvdisasm`): the project toolchain of `scripts/setup.sh`, a CUDA install, or empty when the
/// build found none.
pub const CUDA_BIN: &str = env!("LLK_CUDA_BIN");

/// The build's device-code folder (`sm_90/<family>.ptx`, `.cubin`, `.ptxas.txt`, and the same
/// under `sm_80/`): compiled here, or copied from the prebuilt code.
pub const KERNEL_BUILD_DIR: &str = env!("LLK_KERNEL_BUILD_DIR");

/// The nvcc version (`nvcc --version`'s last line) that compiled the device code, or empty when
/// the build used the prebuilt code.
pub const NVCC_VERSION: &str = env!("LLK_NVCC_VERSION");
