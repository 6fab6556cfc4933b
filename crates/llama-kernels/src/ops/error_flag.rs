//! The device-side error flag: one i32 that kernels raise (an `atomicOr` of
//! `LlkDeviceError` bits) on invalid device-resident input, read and cleared on the host.

use crate::backend::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::LlkDeviceError;
use crate::tensor::Tensor;

/// A device-side error flag (one i32) that kernels raise on invalid device-resident input (page
/// ids, slots, sequence lengths). Allocated once; [`ErrorFlag::check`] reads and clears it.
#[derive(Debug)]
pub struct ErrorFlag {
    flag: Tensor,
}

impl ErrorFlag {
    /// A cleared flag on `device`.
    pub fn new(device: &Device) -> Result<ErrorFlag> {
        Ok(ErrorFlag { flag: Tensor::zeros(device, DType::I32, &[1])? })
    }
    /// The device whose memory holds the flag.
    pub fn device(&self) -> &Device {
        self.flag.device()
    }
    pub(crate) fn tensor(&self) -> &Tensor {
        &self.flag
    }
    /// Reads and clears the flag (waits for the device): `Err` names what the kernels found.
    pub fn check(&self, op: &'static str) -> Result<()> {
        check_flag(op, &self.flag, ALL)
    }
    /// [`ErrorFlag::check`] for a flag [`crate::ops::sampling`] raised: names its bits.
    pub fn check_sampling(&self) -> Result<()> {
        check_flag("sample", &self.flag, SAMPLING)
    }
}

/// What each bit means to an op, in the words of its inputs.
pub(crate) type Meanings = [(LlkDeviceError, &'static str)];

/// The paged cache's meanings (append and decode).
pub(crate) const PAGED: &Meanings = &[
    (
        LlkDeviceError::LLK_DEVICE_BAD_SEQLENS,
        "sequence lengths or offsets (negative, decreasing, or past the block table)",
    ),
    (LlkDeviceError::LLK_DEVICE_BAD_PAGE, "a page id or slot outside the page pool (its keys were skipped)"),
];

/// Token sampling's meanings.
pub(crate) const SAMPLING: &Meanings = &[
    (
        LlkDeviceError::LLK_DEVICE_BAD_SAMPLING_PARAMS,
        "bad sampling parameters (temperature negative, NaN or inf; top_k < 0; top_p or min_p outside [0, 1]): token -1",
    ),
    (LlkDeviceError::LLK_DEVICE_NO_CANDIDATE, "a row of logits all -inf or NaN: token -1"),
];

/// The MoE permutation's meaning of its bit.
pub(crate) const BAD_EXPERT: (LlkDeviceError, &str) =
    (LlkDeviceError::LLK_DEVICE_BAD_EXPERT_ID, "an expert id outside [0, experts) (its slot was dropped)");

/// Cross-entropy's meaning of its bit.
pub(crate) const BAD_LABEL: (LlkDeviceError, &str) =
    (LlkDeviceError::LLK_DEVICE_BAD_LABEL, "a label outside [0, vocab) that is not ignore_index (its loss is NaN)");

/// Every bit, for a flag several ops may share.
const ALL: &Meanings = &[
    PAGED[0],
    PAGED[1],
    BAD_EXPERT,
    (LlkDeviceError::LLK_DEVICE_BAD_TOKEN_ID, "a token id outside [0, vocab) (its embedding row is zeros)"),
    SAMPLING[0],
    SAMPLING[1],
    BAD_LABEL,
];

/// Reads and clears an i32 error flag (waits for the device), naming its bits by `meanings`.
pub(crate) fn check_flag(op: &'static str, flag: &Tensor, meanings: &Meanings) -> Result<()> {
    let bits = flag.to_vec::<i32>()?[0];
    if bits == 0 {
        return Ok(());
    }
    flag.copy_from_slice(&[0i32])?;
    let mut what: Vec<&str> =
        meanings.iter().filter(|(bit, _)| bits & *bit as i32 != 0).map(|(_, meaning)| *meaning).collect();
    if what.is_empty() {
        what.push("unknown error bits");
    }
    Err(Error::DeviceReported { op, what: format!("{} [flag {bits:#x}]", what.join("; ")) })
}
