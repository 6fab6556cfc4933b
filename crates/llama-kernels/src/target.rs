//! The two ways this crate runs a kernel (the third, the f64 specification, is
//! [`crate::reference`]).

/// Which implementation runs the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
    /// The same kernels on the CPU, through the fiber emulator.
    Emulated,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Target::Cuda => "cuda",
            Target::Emulated => "emulated",
        })
    }
}
