//! The crate's error type: every failure is named and carries the numbers that explain it.

use crate::dtype::DType;
use crate::target::Target;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, from validation to the driver.
///
/// Validation errors name the operation and the offending argument, so that
/// `head_dim 96 unsupported (supported: 64, 128)` reads as a sentence. Every variant is
/// structured: a caller can match on it instead of parsing a message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The CUDA target was asked for but cannot be used here (no driver library, no device).
    #[error("CUDA target unavailable: {0}")]
    CudaUnavailable(String),

    /// The CUDA driver returned an error.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),

    /// An emulated launch failed: deadlock, divergent barrier, out-of-bounds access, ...
    #[error("emulated kernel `{kernel}` failed ({status}): {message}")]
    Emulation { kernel: &'static str, status: &'static str, message: String },

    /// A kernel symbol is missing from its module (a build problem, never a user error).
    #[error("kernel `{symbol}` not found in module `{module}`")]
    KernelNotFound { module: &'static str, symbol: &'static str },

    /// Two tensors that must share a dtype do not.
    #[error("{op}: {what} has dtype {got}, expected {expected}")]
    DTypeMismatch { op: &'static str, what: &'static str, got: DType, expected: DType },

    /// A dtype the operation does not implement.
    #[error("{op}: {what} has unsupported dtype {dtype} (supported: {supported})")]
    UnsupportedDType { op: &'static str, what: &'static str, dtype: DType, supported: &'static str },

    /// A shape that does not fit the operation.
    #[error("{op}: {what} has shape {got:?}, expected {expected}")]
    ShapeMismatch { op: &'static str, what: &'static str, got: Vec<usize>, expected: String },

    /// A memory layout the kernels cannot address (the innermost dimension must be contiguous).
    #[error("{op}: {what} has strides {strides:?} for shape {shape:?}: {why}")]
    BadLayout { op: &'static str, what: &'static str, shape: Vec<usize>, strides: Vec<usize>, why: &'static str },

    /// An output overlaps an input (or another output) in memory.
    #[error("{op}: {a} and {b} overlap in memory")]
    Overlap { op: &'static str, a: &'static str, b: &'static str },

    /// A scalar argument out of its domain.
    #[error("{op}: invalid {name} = {value}: {why}")]
    InvalidArgument { op: &'static str, name: &'static str, value: String, why: String },

    /// Tensors from different devices (CUDA contexts, or emulated devices) were passed to one call.
    #[error("{op}: {what} lives on a different device")]
    DeviceMismatch { op: &'static str, what: &'static str },

    /// A shape whose element or byte count does not fit in memory addresses.
    #[error("{what}: shape {shape:?} is too large (its size overflows)")]
    TooLarge { what: &'static str, shape: Vec<usize> },

    /// A host slice whose length does not match the tensor it is copied to or from.
    #[error("{what}: {got} elements given, {expected} expected")]
    LengthMismatch { what: &'static str, expected: usize, got: usize },

    /// A view (narrow, reshape, as_strided, a borrowed buffer) that does not fit its memory.
    #[error("{what}: {why}")]
    InvalidView { what: &'static str, why: String },

    /// Allocating device (or, on the emulated target, guarded host) memory failed.
    #[error("out of memory allocating {bytes} bytes on the {target} target{detail}")]
    OutOfMemory { bytes: usize, target: Target, detail: String },

    /// A call that needs one target was given a tensor or device of another.
    #[error("{what} needs the {expected} target, got {got}")]
    WrongTarget { what: &'static str, expected: Target, got: Target },

    /// The buffer behind a tensor is borrowed mutably (for example through
    /// [`Tensor::cuda_buffer`](crate::Tensor::cuda_buffer)) on this thread while an op
    /// tries to use it.
    #[error("{op}: the buffer of {what} is borrowed mutably elsewhere on this thread")]
    StorageBusy { op: &'static str, what: &'static str },

    /// A tensor has more dimensions than any op supports.
    #[error("{what}: rank {rank} exceeds the maximum of {max}")]
    RankTooLarge { what: &'static str, rank: usize, max: usize },

    /// A kernel found invalid device-resident input (a page id outside the pool, bad sequence
    /// offsets) and raised the workspace's error flag; see the op's docs for what it skipped.
    #[error("{op}: the device reported invalid input: {what}")]
    DeviceReported { op: &'static str, what: String },

    /// A cuBLAS call failed (dense matrix products on the CUDA target).
    #[error("cuBLAS error: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),

    /// Something this build cannot do yet, named (`MoE feed-forward on the device (needs the MoE
    /// ops)`): returned before anything is launched, never a silent stub.
    #[error("unsupported: {what}")]
    Unsupported { what: String },

    /// A Hugging Face `config.json` field is missing, malformed or has an unsupported value.
    #[error("config field `{field}`: {why}")]
    Config { field: String, why: String },

    /// A checkpoint tensor is missing, has a shape that disagrees with the config, or a dtype
    /// that cannot be converted to the run dtype.
    #[error("checkpoint tensor `{tensor}`: {why}")]
    Checkpoint { tensor: String, why: String },

    /// A file could not be read (a checkpoint's config, index or safetensors file).
    #[error("{path}: {why}")]
    Io { path: String, why: String },

    /// The f64 reference was given inconsistent inputs (a bug in the caller of the reference).
    #[error("reference {what}: {why}")]
    Reference { what: &'static str, why: String },
}

impl Error {
    pub(crate) fn invalid(
        op: &'static str,
        name: &'static str,
        value: impl std::fmt::Display,
        why: impl Into<String>,
    ) -> Self {
        Error::InvalidArgument { op, name, value: value.to_string(), why: why.into() }
    }

    /// [`Error::ShapeMismatch`]: `what` of `op` has shape `got`, and `expected` says what fits.
    pub(crate) fn shape(op: &'static str, what: &'static str, got: Vec<usize>, expected: impl Into<String>) -> Self {
        Error::ShapeMismatch { op, what, got, expected: expected.into() }
    }
}
