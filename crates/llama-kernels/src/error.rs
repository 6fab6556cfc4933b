//! The crate's error type: every failure is named and carries the numbers that explain it.

use std::path::PathBuf;

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
    Emulation {
        /// The kernel's symbol.
        kernel: &'static str,
        /// What the emulator detected (`deadlock`, `divergent barrier`, `memory fault`, ...).
        status: &'static str,
        /// The emulator's report (a memory fault names the buffer nearest the faulting address).
        message: String,
    },

    /// This build reads its device code at run time (`LLK_DEVICE_CODE_LOCATION=external`), and
    /// the folder named by `LLK_DEVICE_CODE_DIR` is not set, lacks a file or holds another one.
    #[error("device code unavailable: {0}")]
    DeviceCode(#[from] DeviceCodeError),

    /// A kernel symbol is missing from its module (a build problem, never a user error).
    #[error("kernel `{symbol}` not found in module `{module}`")]
    KernelNotFound {
        /// The kernel family (module) searched.
        module: &'static str,
        /// The symbol that is missing (`<module>` when the module itself is).
        symbol: &'static str,
    },

    /// Two tensors that must share a dtype do not.
    #[error("{op}: {what} has dtype {got}, expected {expected}")]
    DTypeMismatch {
        /// The operation that rejected the call.
        op: &'static str,
        /// The argument, as named in the op's docs.
        what: &'static str,
        /// The dtype it has.
        got: DType,
        /// The dtype it must have.
        expected: DType,
    },

    /// A dtype the operation does not implement.
    #[error("{op}: {what} has unsupported dtype {dtype} (supported: {supported})")]
    UnsupportedDType {
        /// The operation that rejected the call.
        op: &'static str,
        /// The argument, as named in the op's docs.
        what: &'static str,
        /// The dtype it has.
        dtype: DType,
        /// The dtypes the op implements for it.
        supported: String,
    },

    /// A shape that does not fit the operation.
    #[error("{op}: {what} has shape {got:?}, expected {expected}")]
    ShapeMismatch {
        /// The operation that rejected the call.
        op: &'static str,
        /// The argument, as named in the op's docs.
        what: &'static str,
        /// The shape it has.
        got: Vec<usize>,
        /// The shape (or rule) it must satisfy.
        expected: String,
    },

    /// A memory layout the kernels cannot address (the innermost dimension must be contiguous).
    #[error("{op}: {what} has strides {strides:?} for shape {shape:?}: {why}")]
    BadLayout {
        /// The operation that rejected the call.
        op: &'static str,
        /// The argument, as named in the op's docs.
        what: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// Its strides, in elements.
        strides: Vec<usize>,
        /// Which rule the layout breaks.
        why: &'static str,
    },

    /// An output overlaps an input (or another output) in memory.
    #[error("{op}: {a} and {b} overlap in memory")]
    Overlap {
        /// The operation that rejected the call.
        op: &'static str,
        /// One argument, as named in the op's docs.
        a: &'static str,
        /// The argument it overlaps, as named in the op's docs.
        b: &'static str,
    },

    /// A scalar argument out of its domain.
    #[error("{op}: invalid {name} = {value}: {why}")]
    InvalidArgument {
        /// The operation that rejected the call.
        op: &'static str,
        /// The argument, as named in the op's docs.
        name: &'static str,
        /// The value given, formatted.
        value: String,
        /// The domain it must lie in.
        why: String,
    },

    /// Tensors from different devices (CUDA contexts, or emulated devices) were passed to one call.
    #[error("{op}: {what} lives on a different device")]
    DeviceMismatch {
        /// The operation that rejected the call.
        op: &'static str,
        /// The argument, as named in the op's docs.
        what: &'static str,
    },

    /// A shape whose element or byte count does not fit in memory addresses.
    #[error("{what}: shape {shape:?} is too large (its size overflows)")]
    TooLarge {
        /// The call or argument whose size overflowed.
        what: &'static str,
        /// The shape, in elements per dimension.
        shape: Vec<usize>,
    },

    /// A host slice whose length does not match the tensor it is copied to or from.
    #[error("{what}: {got} elements given, {expected} expected")]
    LengthMismatch {
        /// The call that copies (`Tensor::from_slice`, `copy_from_slice`, ...).
        what: &'static str,
        /// Elements of the tensor.
        expected: usize,
        /// Elements of the host slice.
        got: usize,
    },

    /// A view (narrow, reshape, as_strided, a borrowed buffer) that does not fit its memory.
    #[error("{what}: {why}")]
    InvalidView {
        /// The call that built or used the view.
        what: &'static str,
        /// Why it does not fit.
        why: String,
    },

    /// Allocating device (or, on the emulated target, guarded host) memory failed.
    #[error("out of memory allocating {bytes} bytes on the {target} target{detail}")]
    OutOfMemory {
        /// Bytes requested.
        bytes: usize,
        /// The target allocated on.
        target: Target,
        /// The system's reason, as ` (...)`, or empty.
        detail: String,
    },

    /// A call that needs one target was given a tensor or device of another.
    #[error("{what} needs the {expected} target, got {got}")]
    WrongTarget {
        /// The call that needs the target.
        what: &'static str,
        /// The target it needs.
        expected: Target,
        /// The target it was given.
        got: Target,
    },

    /// The buffer behind a tensor is borrowed mutably (for example through
    /// [`Tensor::cuda_buffer`](crate::Tensor::cuda_buffer)) on this thread while an op
    /// tries to use it.
    #[error("{op}: the buffer of {what} is borrowed mutably elsewhere on this thread")]
    StorageBusy {
        /// The operation that rejected the call.
        op: &'static str,
        /// The argument, as named in the op's docs.
        what: &'static str,
    },

    /// A tensor has more dimensions than any op supports.
    #[error("{what}: rank {rank} exceeds the maximum of {max}")]
    RankTooLarge {
        /// The call that built the view.
        what: &'static str,
        /// The rank asked for.
        rank: usize,
        /// The most dimensions supported ([`MAX_RANK`](crate::tensor::MAX_RANK)).
        max: usize,
    },

    /// A kernel found invalid device-resident input (a page id outside the pool, bad sequence
    /// offsets) and raised the workspace's error flag; see the op's docs for what it skipped.
    #[error("{op}: the device reported invalid input: {what}")]
    DeviceReported {
        /// The operation that rejected the call.
        op: &'static str,
        /// What the raised error bits mean for the op's inputs, and the raw flag.
        what: String,
    },

    /// A cuBLAS call failed (dense matrix products on the CUDA target).
    #[error("cuBLAS error: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),

    /// Something this build cannot do yet, named (`MoE feed-forward on the device (needs the MoE
    /// ops)`): returned before anything is launched, never a silent stub.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What is not supported, named.
        what: String,
    },

    /// A layer's host weight tensor is missing or has a shape that disagrees with the layer's
    /// spec (named as in a Hugging Face checkpoint).
    #[error("checkpoint tensor `{tensor}`: {why}")]
    Checkpoint {
        /// The tensor's name (full, or relative to its layer's prefix).
        tensor: String,
        /// What is wrong with it.
        why: String,
    },

    /// The f64 reference was given inconsistent inputs (a bug in the caller of the reference).
    #[error("reference {what}: {why}")]
    Reference {
        /// The reference function or input that was inconsistent.
        what: &'static str,
        /// The inconsistency.
        why: String,
    },
}

impl Error {
    /// [`Error::InvalidArgument`]: `name` of `op` is `value`, which is wrong because of `why`.
    pub fn invalid(
        op: &'static str,
        name: &'static str,
        value: impl std::fmt::Display,
        why: impl Into<String>,
    ) -> Self {
        Error::InvalidArgument { op, name, value: value.to_string(), why: why.into() }
    }

    /// [`Error::ShapeMismatch`]: `what` of `op` has shape `got`, and `expected` says what fits.
    pub fn shape(op: &'static str, what: &'static str, got: Vec<usize>, expected: impl Into<String>) -> Self {
        Error::ShapeMismatch { op, what, got, expected: expected.into() }
    }
}

/// Why external device code cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceCodeError {
    /// The build reads its device code at run time, and `LLK_DEVICE_CODE_DIR` ([`DEVICE_CODE_DIR_VAR`](crate::backend::DEVICE_CODE_DIR_VAR)) is not set.
    #[error(
        "this build of llama-kernels reads its device code at run time (LLK_DEVICE_CODE_LOCATION=external), \
         and LLK_DEVICE_CODE_DIR is not set: point it at the folder with sm_90/ and sm_80/"
    )]
    DirUnset,
    /// A file the build expects does not exist.
    #[error("{}: missing (expected {bytes} bytes, sha256 {sha256})", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
        /// Its expected size.
        bytes: u64,
        /// Its expected SHA-256.
        sha256: &'static str,
    },
    /// A file exists but cannot be read.
    #[error("{}: cannot read: {reason}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// A file is not the one this build was made with.
    #[error(
        "{}: not the file this build was made with ({found_bytes} bytes, sha256 {found_sha256}; \
         expected {expected_bytes} bytes, sha256 {expected_sha256})",
        path.display()
    )]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// Its expected size.
        expected_bytes: u64,
        /// Its size.
        found_bytes: u64,
        /// Its expected SHA-256.
        expected_sha256: &'static str,
        /// Its SHA-256.
        found_sha256: String,
    },
    /// A PTX file or ptxas report that is not UTF-8 (only possible if the build's own copy was not).
    #[error("{}: not UTF-8 text", path.display())]
    NotText {
        /// The file.
        path: PathBuf,
    },
}
