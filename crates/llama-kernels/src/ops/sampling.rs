//! Token sampling on the device (kernels/sampling.cu): one launch turns `[batch, vocab]` logits
//! into one i32 token id per row, with per-row temperature, top-k, top-p, min-p and a seeded
//! counter-based RNG.
//!
//! ```
//! use llama_kernels::ops::sampling::{SamplingBatch, sample};
//! use llama_kernels::ops::ErrorFlag;
//! use llama_kernels::spec::sampling::SamplingConfig;
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let logits = Tensor::from_slice(&device, &[0.5f32, 2.0, -1.0, 2.0, 0.0, 1.0], &[2, 3])?;
//! let cfg = SamplingConfig { temperature: 0.7, top_k: 50, top_p: 0.9, min_p: 0.0 };
//! // Planned once per batch shape; `set` refreshes it (seeds, offsets: the step) between steps.
//! let params = SamplingBatch::new(&device, &[SamplingConfig::GREEDY, cfg], &[0, 42], &[0, 7])?;
//! let tokens = Tensor::zeros(&device, DType::I32, &[2])?;
//! let errors = ErrorFlag::new(&device)?;
//! sample(&logits, &params.tensors(), &tokens, &errors)?;
//! assert_eq!(tokens.to_vec::<i32>()?[0], 1); // greedy: the first of the tied maxima
//! errors.check_sampling()?;
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! Those of Hugging Face transformers' logits warpers in generation order (temperature, top-k,
//! top-p, min-p) followed by a multinomial draw, with every tie defined; the f64 statement is
//! [`crate::reference::sampling`]:
//!
//! * `temperature == 0` is greedy: the argmax, ties to the lowest index (the other parameters
//!   and the RNG are not used). Otherwise scores are `logits / temperature` and the sorted order
//!   is score descending, ties by lower index first.
//! * top-k (`0 < k < vocab`; 0 is off): keep scores `>=` the k-th largest (ties kept, as
//!   `TopKLogitsWarper`'s `scores < topk_values[..., -1]` removal keeps them).
//! * top-p (`< 1`; 1 is off): on the softmax of what top-k kept, keep the smallest prefix of the
//!   sorted order whose cumulative probability reaches `top_p` (a token is kept when the
//!   probability before it is `< top_p`; at least one; a tie group at the boundary is cut in index
//!   order).
//! * min-p (`> 0`; 0 is off): remove tokens with probability `< min_p *` the largest (on the
//!   distribution after the filters above; the largest is always kept).
//! * Then sample from the renormalized remaining distribution by inverse CDF in index order with
//!   one 64-bit uniform word: Philox-4x32-10 keyed by the row's `seed` at counter
//!   `{offset lo, offset hi, 0, 0}` (the first two output words). Same seed and offset, same
//!   logits and parameters: same token, whatever the batch around the row. Advance the offset
//!   every step (the op reads it; it never writes it).
//!
//! NaN logits count as `-inf`; `+inf` logits share all the mass. A row whose logits are all
//! `-inf`/NaN gets token `-1` and raises "no candidate" on the error flag; a row whose parameters
//! are out of their domain (temperature negative, NaN or infinite; top-k negative; top-p or min-p
//! outside `[0, 1]`) gets `-1` and raises "bad sampling parameters". The host validates what it
//! can without reading device memory (dtypes, shapes, layouts, counts); the values are checked on
//! the device, so the launch needs no host sync. [`ErrorFlag::check_sampling`] reads the flag.
//!
//! # Precision
//!
//! f32 math: weights `exp((x - max) / T)` with `exp2f` (a relative error of about
//! `|x - max| / T * 2^-23 + 2^-22`), summed exactly as 40-bit fixed point, so every filter
//! boundary and the draw are decided on integers and the result is the same under every
//! schedule and block size. A token whose weight is below `2^-40` of the largest is never drawn;
//! the draw itself has `2^-64` resolution. A boundary that rounding decides (a weight within an
//! ulp of `min_p`, a cumulative mass within about `vocab * 2^-40` of `top_p`) may fall either
//! way compared with the f64 reference.
//!
//! # Cost
//!
//! One block per row (up to 1024 threads). Greedy reads the row once; sampling reads it 2 times
//! (temperature only) up to 11 times (top-k and top-p both on: 4 radix passes each), the last
//! pass on average half a row. No sort and no workspace.

use crate::backend::{Device, LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{LLK_SAMPLE_MAX_THREADS, LLK_SAMPLE_MAX_VOCAB, SampleParams};
use crate::kernels::sampling::KERNELS;
use crate::launch::{Arg, KernelArgs, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::spec::sampling::SamplingConfig;
use crate::tensor::{Tensor, TensorView, TensorViewMut};

pub use super::error_flag::ErrorFlag;

const OP: &str = "sample";

/// Largest vocabulary a row may have.
pub const MAX_VOCAB: usize = LLK_SAMPLE_MAX_VOCAB as usize;

/// The per-row parameters as borrowed device arrays, one entry per row, contiguous.
#[derive(Clone, Copy, Debug)]
pub struct SamplingViews<'r, 'a> {
    /// `[batch]` f32: 0 is greedy.
    pub temperature: &'r TensorView<'a>,
    /// `[batch]` i32: 0 is off; `None`: off for every row.
    pub top_k: Option<&'r TensorView<'a>>,
    /// `[batch]` f32: 1 is off; `None`: off.
    pub top_p: Option<&'r TensorView<'a>>,
    /// `[batch]` f32: 0 is off; `None`: off.
    pub min_p: Option<&'r TensorView<'a>>,
    /// `[batch]` i64 (the bits of a u64): the Philox key; `None`: 0.
    pub seeds: Option<&'r TensorView<'a>>,
    /// `[batch]` i64 (the bits of a u64): the Philox counter; `None`: 0.
    pub offsets: Option<&'r TensorView<'a>>,
}

/// The per-row parameters as tensors (see [`SamplingViews`]).
#[derive(Clone, Copy, Debug)]
pub struct SamplingTensors<'a> {
    /// `[batch]` f32: 0 is greedy.
    pub temperature: &'a Tensor,
    /// `[batch]` i32: 0 is off; `None`: off for every row.
    pub top_k: Option<&'a Tensor>,
    /// `[batch]` f32: 1 is off; `None`: off.
    pub top_p: Option<&'a Tensor>,
    /// `[batch]` f32: 0 is off; `None`: off.
    pub min_p: Option<&'a Tensor>,
    /// `[batch]` i64 (u64 bits): the Philox key; `None`: 0.
    pub seeds: Option<&'a Tensor>,
    /// `[batch]` i64 (u64 bits): the Philox counter; `None`: 0.
    pub offsets: Option<&'a Tensor>,
}

/// Device arrays of every per-row parameter for a batch, filled from host values.
#[derive(Debug)]
pub struct SamplingBatch {
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    seeds: Tensor,
    offsets: Tensor,
}

impl SamplingBatch {
    /// Arrays for `configs.len()` rows holding these values (`seeds` and `offsets` as long).
    pub fn new(device: &Device, configs: &[SamplingConfig], seeds: &[u64], offsets: &[u64]) -> Result<SamplingBatch> {
        let n = configs.len();
        let b = SamplingBatch {
            temperature: Tensor::zeros(device, DType::F32, &[n])?,
            top_k: Tensor::zeros(device, DType::I32, &[n])?,
            top_p: Tensor::zeros(device, DType::F32, &[n])?,
            min_p: Tensor::zeros(device, DType::F32, &[n])?,
            seeds: Tensor::zeros(device, DType::I64, &[n])?,
            offsets: Tensor::zeros(device, DType::I64, &[n])?,
        };
        b.set(configs, seeds, offsets)?;
        Ok(b)
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.temperature.numel()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies new values in (the same row count). Values are not validated here: the kernel
    /// flags a row whose parameters are out of their domain.
    pub fn set(&self, configs: &[SamplingConfig], seeds: &[u64], offsets: &[u64]) -> Result<()> {
        let n = self.len();
        for (what, len) in [("configs", configs.len()), ("seeds", seeds.len()), ("offsets", offsets.len())] {
            if len != n {
                return Err(Error::invalid(OP, what, len, format!("must have one entry per row ({n})")));
            }
        }
        let f = |g: fn(&SamplingConfig) -> f32| configs.iter().map(g).collect::<Vec<f32>>();
        self.temperature.copy_from_slice(&f(|c| c.temperature))?;
        self.top_k.copy_from_slice(&configs.iter().map(|c| c.top_k).collect::<Vec<i32>>())?;
        self.top_p.copy_from_slice(&f(|c| c.top_p))?;
        self.min_p.copy_from_slice(&f(|c| c.min_p))?;
        self.seeds.copy_from_slice(&seeds.iter().map(|&s| s as i64).collect::<Vec<i64>>())?;
        self.offsets.copy_from_slice(&offsets.iter().map(|&s| s as i64).collect::<Vec<i64>>())?;
        Ok(())
    }

    /// The arrays, for [`sample`].
    pub fn tensors(&self) -> SamplingTensors<'_> {
        SamplingTensors {
            temperature: &self.temperature,
            top_k: Some(&self.top_k),
            top_p: Some(&self.top_p),
            min_p: Some(&self.min_p),
            seeds: Some(&self.seeds),
            offsets: Some(&self.offsets),
        }
    }
}

/// Threads per block for a row of `vocab`: about 32 elements per thread, a multiple of 32 up to
/// LLK_SAMPLE_MAX_THREADS.
fn block_threads(vocab: usize) -> usize {
    (vocab.div_ceil(32).div_ceil(32) * 32).clamp(32, LLK_SAMPLE_MAX_THREADS as usize)
}

/// A `[batch]` contiguous array of `dtype`.
fn row_array(what: &'static str, b: &Arg, dtype: DType, batch: usize) -> Result<Rows> {
    check_dtype(OP, what, b.dtype, dtype)?;
    if b.shape() != [batch] {
        return Err(Error::shape(OP, what, b.shape().to_vec(), format!("[{batch}] (one per row of logits)")));
    }
    if batch > 1 && b.strides()[0] != 1 {
        return Err(Error::BadLayout {
            op: OP,
            what,
            shape: b.shape().to_vec(),
            strides: b.strides().to_vec(),
            why: "must be contiguous",
        });
    }
    Ok(Rows { addr: b.addr, elem: dtype.size(), rows: 1, cols: batch, row_stride: batch })
}

/// Registers an optional per-row array (0 when absent) and checks it against `tokens`.
fn read_array<'a>(
    args: &mut KernelArgs<'a>,
    what: &'static str,
    v: Option<&'a TensorView<'_>>,
    dtype: DType,
    batch: usize,
    tokens: Rows,
) -> Result<u64> {
    let Some(v) = v else { return Ok(0) };
    let b = args.read(what, v)?;
    let r = row_array(what, &b, dtype, batch)?;
    check_disjoint(OP, ("tokens", tokens), (what, r))?;
    Ok(b.addr)
}

/// Samples one token per row of `logits` (`[batch, vocab]` f32/f16/bf16; leading dimensions
/// collapse into the batch; rows may be strided, the last dimension is contiguous) into `tokens`
/// (`[batch]` i32, contiguous), with the per-row `params`. Device-side findings (bad parameter
/// values, rows without a candidate) are raised on `errors`.
pub fn sample_on(
    queue: &impl Queue,
    logits: &TensorView<'_>,
    params: &SamplingViews<'_, '_>,
    tokens: &mut TensorViewMut<'_>,
    errors: &ErrorFlag,
) -> Result<()> {
    let device = queue.queue_device()?;
    if !device.same_context(errors.device()) {
        return Err(Error::DeviceMismatch { op: OP, what: "error flag" });
    }
    let dtype = logits.dtype();
    check_float(OP, "logits", dtype)?;
    check_dtype(OP, "tokens", tokens.dtype(), DType::I32)?;
    let mut args = KernelArgs::new(OP, &device);
    let tb = args.write("tokens", tokens)?;
    let lb = args.read("logits", logits)?;
    let lr = Rows::of(OP, "logits", &lb, 1)?;
    let (batch, vocab) = (lr.rows, lr.cols);
    let tr = row_array("tokens", &tb, DType::I32, batch)?;
    let flag = args.write_tensor("error flag", errors.tensor())?;
    check_disjoint(OP, ("tokens", tr), ("logits", lr))?;
    let mut read = |what, v, dtype| read_array(&mut args, what, v, dtype, batch, tr);
    let temperature = read("temperature", Some(params.temperature), DType::F32)?;
    let top_k = read("top_k", params.top_k, DType::I32)?;
    let top_p = read("top_p", params.top_p, DType::F32)?;
    let min_p = read("min_p", params.min_p, DType::F32)?;
    let seeds = read("seeds", params.seeds, DType::I64)?;
    let offsets = read("offsets", params.offsets, DType::I64)?;
    if batch == 0 {
        return Ok(());
    }
    if vocab == 0 || vocab > MAX_VOCAB {
        return Err(Error::invalid(OP, "vocab", vocab, format!("must be 1..={MAX_VOCAB}")));
    }
    let p = SampleParams {
        logits: lb.addr,
        temperature,
        top_k,
        top_p,
        min_p,
        seeds,
        offsets,
        tokens: tb.addr,
        error_flag: flag,
        batch: to_i64(OP, "batch", batch)?,
        vocab: to_i64(OP, "vocab", vocab)?,
        logits_row_stride: to_i64(OP, "logits row stride", lr.row_stride)?,
    };
    let dims =
        LaunchDims { grid: (grid_x(OP, batch)?, 1, 1), block: (block_threads(vocab) as u32, 1, 1), smem_at_launch: 0 };
    args.launch(KERNELS.find(OP, "logits", dtype)?, dims, &p)
}

/// [`sample_on`] on tensors.
pub fn sample(logits: &Tensor, params: &SamplingTensors<'_>, tokens: &Tensor, errors: &ErrorFlag) -> Result<()> {
    fn views(t: Option<&Tensor>) -> Option<TensorView<'_>> {
        t.map(Tensor::view)
    }
    let temperature = params.temperature.view();
    let (top_k, top_p, min_p) = (views(params.top_k), views(params.top_p), views(params.min_p));
    let (seeds, offsets) = (views(params.seeds), views(params.offsets));
    let v = SamplingViews {
        temperature: &temperature,
        top_k: top_k.as_ref(),
        top_p: top_p.as_ref(),
        min_p: min_p.as_ref(),
        seeds: seeds.as_ref(),
        offsets: offsets.as_ref(),
    };
    sample_on(logits.device(), &logits.view(), &v, &mut TensorViewMut::of_tensor(tokens), errors)
}
