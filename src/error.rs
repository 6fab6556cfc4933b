//! The crate's error type: every failure is named and carries the numbers that explain it.

use crate::dtype::DType;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, from validation to the driver.
///
/// Validation errors name the operation and the offending argument, so that
/// `head_dim 96 unsupported (supported: 64, 128)` reads as a sentence.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The CUDA target was asked for but cannot be used here (no driver library, no device).
    #[error("CUDA target unavailable: {0}")]
    CudaUnavailable(String),

    /// The CUDA driver returned an error.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),

    /// An emulated launch failed: deadlock, divergent barrier, unsupported operation, ...
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

    /// Tensors from different devices were passed to one call.
    #[error("{op}: {what} lives on a different device")]
    DeviceMismatch { op: &'static str, what: &'static str },

    /// A host slice, shape or index does not match the tensor it is used with.
    #[error("{0}")]
    Host(String),
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
}
