//! Op verification: run every op on a device and check it against the reference.
//!
//! Each case builds seeded random inputs, poisons its outputs (0xFF bytes: NaN), runs the kernel
//! through the public API, and compares every output with the f64 reference under a per-dtype
//! tolerance. Strided cases put the rows inside a wider poisoned buffer and also check that the
//! gaps between rows were not written. The same case functions back the test suite.

pub(crate) mod attention;
pub(crate) mod attention_backward;
pub(crate) mod backward;
pub(crate) mod common;
pub(crate) mod elementwise;
pub(crate) mod embedding;
pub(crate) mod lora;
pub(crate) mod moe;
pub(crate) mod paged;
pub(crate) mod qlinear;
pub(crate) mod sampling;

pub use attention::*;
pub use attention_backward::*;
pub use backward::*;
pub use common::{CaseResult, Outcome, gaps_poisoned, rows_tensor, table};
pub use elementwise::*;
pub use embedding::*;
pub use lora::*;
pub use moe::*;
pub use paged::*;
pub use qlinear::*;
pub use sampling::*;

use crate::backend::Device;
use common::outcome;

/// Runs every case on `device`. Errors (a failed launch) become failing rows, not aborts.
pub fn run_all(device: &Device, quick: bool) -> Vec<Outcome> {
    let mut out: Vec<Outcome> =
        rms_norm_cases(quick).into_iter().map(|c| outcome(c, rms_norm_case(device, c))).collect();
    out.extend(rms_norm_backward_cases(quick).into_iter().map(|c| outcome(c, rms_norm_backward_case(device, c))));
    out.extend(rope_cases(quick).into_iter().map(|c| outcome(c, rope_case(device, c))));
    out.extend(swiglu_cases(quick).into_iter().map(|c| outcome(c, swiglu_case(device, c))));
    out.extend(swiglu_backward_cases(quick).into_iter().map(|c| outcome(c, swiglu_backward_case(device, c))));
    out.extend(cross_entropy_cases(quick).into_iter().map(|c| outcome(c, cross_entropy_case(device, c))));
    out.extend(linear_backward_cases(quick).into_iter().map(|c| outcome(c, linear_backward_case(device, c))));
    out.extend(embedding_backward_cases(quick).into_iter().map(|c| outcome(c, embedding_backward_case(device, c))));
    out.extend(adamw_cases(quick).into_iter().map(|c| outcome(c, adamw_case(device, c))));
    out.extend(dropout_cases(quick).into_iter().map(|c| outcome(c, dropout_case(device, c))));
    out.extend(lora_cases(quick).into_iter().map(|c| outcome(c, lora_case(device, c))));
    out.extend(embedding_cases(quick).into_iter().map(|c| outcome(c, embedding_case(device, c))));
    out.extend(
        attention_cases(quick).into_iter().map(|c| attention_case(device, &c).map_err(|e| (format!("{c:?}"), e))),
    );
    out.extend(attention_backward_cases(quick).into_iter().map(|c| {
        let r = attention_backward_case(device, &c);
        r.map_err(|e| (format!("{c:?}"), e))
    }));
    // On the emulator standing for sm_90, whose bf16/f16 prefill runs the Hopper kernel, the
    // mma.sync kernel too: the same cases on an emulated A100.
    if device.target() == crate::backend::Target::Emulated && device.has_sm90a_features() {
        let a100 = Device::emulated_with(crate::backend::EmuOptions {
            arch: crate::backend::EmuArch::Sm80,
            ..crate::backend::EmuOptions::default()
        });
        out.extend(
            attention_cases(quick)
                .into_iter()
                .filter(|c| c.dtype != crate::dtype::DType::F32 && c.paged.is_none())
                .map(|c| attention_case(&a100, &c).map_err(|e| (format!("{c:?} on sm_80"), e))),
        );
    }
    let (append, decode) = paged_cases(quick);
    out.extend(append.into_iter().map(|c| kv_append_case(device, &c).map_err(|e| (format!("{c:?}"), e))));
    out.extend(decode.into_iter().map(|c| paged_decode_case(device, &c).map_err(|e| (format!("{c:?}"), e))));
    out.extend(moe_cases(device, quick));
    out.extend(sample_cases(quick).into_iter().map(|c| outcome(c, sample_case(device, c))));
    out.extend(qlinear_cases(quick).into_iter().map(|c| outcome(c, qlinear_case(device, c))));
    out.extend(
        qlinear_backward_input_cases(quick).into_iter().map(|c| outcome(c, qlinear_backward_input_case(device, c))),
    );
    out.extend(
        crate::spec::quant::QuantFormat::ALL
            .into_iter()
            .map(|f| qdequant_case(device, f, 67, 512).map_err(|e| (format!("dequantize {f}"), e))),
    );
    out
}
