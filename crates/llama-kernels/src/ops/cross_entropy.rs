//! Softmax cross-entropy over rows of logits, with its gradient (kernels/cross_entropy.cu), and
//! the same fused with the LM head so that the `[tokens, vocab]` logits never exist in full
//! ([`FusedLinearCrossEntropy`]).
//!
//! ```text
//! loss_t = logsumexp(x_t) - x_t[y_t]                 rows with y_t != ignore_index
//! loss   = sum_t loss_t / n   (Mean; n = counted rows)   or   sum_t loss_t   (Sum)
//! dx_t   = (softmax(x_t) - onehot(y_t)) * grad_scale / n  (Mean)  or  * grad_scale  (Sum)
//! ```
//!
//! PyTorch's `F.cross_entropy(logits.float(), labels, ignore_index=-100)`, which is Hugging
//! Face's causal-LM loss once the caller has shifted the labels by one. The logits are read in
//! their dtype and every step is f32 (the gradient rounded once to its dtype); the reduced loss
//! is summed in f64 in a fixed order. `grad_scale` is the upstream gradient of the loss: 1, a
//! loss scale for f16 training, or `1 / accumulation steps`. For gradient accumulation over
//! micro-batches with Hugging Face's `num_items_in_batch`, use [`Reduction::Sum`] and a
//! `grad_scale` of `1 / items`.
//!
//! Nothing is synchronized: `n` is counted on the device, and the loss is a device scalar.
//! Every reduction runs in a fixed order (no atomics), so the same inputs give the same bits on
//! every run. A mean over zero counted rows is NaN, as in PyTorch (and the gradient is zero). A
//! label outside `[0, vocab)` that is not `ignore_index` makes its row's loss (and so the loss)
//! NaN, zeroes its gradient row and raises a device error flag that
//! [`CrossEntropy::check_labels`] reads. A NaN logit makes its row's loss NaN.
//!
//! ```
//! use llama_kernels::ops::cross_entropy::{CrossEntropy, CrossEntropyOptions};
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! // Two rows over a 4-word vocabulary; the second row's label is ignored.
//! let logits = Tensor::from_f64(&device, DType::F32, &[0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0], &[2, 4])?;
//! let labels = Tensor::from_slice(&device, &[1i32, -100], &[2])?;
//! let (loss, grad) = (Tensor::zeros(&device, DType::F32, &[1])?, Tensor::zeros(&device, DType::F32, &[2, 4])?);
//! let ce = CrossEntropy::new(&device, 2)?;
//! ce.forward(&logits, &labels, &loss, Some(&grad), &CrossEntropyOptions::default())?;
//! assert!((loss.to_f64_vec()?[0] - 4f64.ln()).abs() < 1e-6);
//! assert_eq!(&grad.to_f64_vec()?[..2], &[0.25, -0.75]);
//! # Ok(())
//! # }
//! ```

use crate::backend::{Device, LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{CrossEntropyParams, LLK_CE_REDUCE_THREADS, LLK_CE_THREADS, LlkIndexType, LlkLossReduction};
use crate::kernels::Access;
use crate::kernels::cross_entropy::{COUNT, REDUCE, ROWS};
use crate::launch::{KernelArgs, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::ops::ErrorFlag;
use crate::ops::error_flag::{BAD_LABEL, Meanings, check_flag};
use crate::ops::linear::linear_on;
use crate::ops::linear_backward::{linear_backward_input_on, linear_backward_weight_on};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

const OP: &str = "cross_entropy";

/// PyTorch's and Hugging Face's label of a position without a loss.
pub const IGNORE_INDEX: i64 = -100;

/// How the per-row losses become the loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The sum over the counted rows divided by their number (PyTorch's default).
    #[default]
    Mean,
    /// The sum over the counted rows.
    Sum,
}

/// The loss's options: PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyOptions {
    /// Rows with this label add no loss and get a zero gradient (-100).
    pub ignore_index: i64,
    /// Mean or sum over the counted rows.
    pub reduction: Reduction,
    /// The gradient of whatever follows with respect to the loss (1).
    pub grad_scale: f32,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions { ignore_index: IGNORE_INDEX, reduction: Reduction::Mean, grad_scale: 1.0 }
    }
}

/// The loss's device scratch, planned once for up to `max_rows` rows: the per-row losses, the
/// count of labelled rows and the label error flag.
#[derive(Debug)]
pub struct CrossEntropy {
    row_loss: Tensor,
    count: Tensor,
    flag: ErrorFlag,
}

impl CrossEntropy {
    /// Scratch for up to `max_rows` rows on `device`.
    pub fn new(device: &Device, max_rows: usize) -> Result<CrossEntropy> {
        if max_rows >= 1 << 24 {
            return Err(Error::invalid(OP, "max_rows", max_rows, "must be < 2^24 (the count is an exact f32)"));
        }
        Ok(CrossEntropy {
            row_loss: Tensor::zeros(device, DType::F32, &[max_rows.max(1)])?,
            count: Tensor::zeros(device, DType::F32, &[1])?,
            flag: ErrorFlag::new(device)?,
        })
    }

    /// The most rows one call takes.
    pub fn max_rows(&self) -> usize {
        self.row_loss.shape()[0]
    }

    /// The loss of `logits` `[rows, vocab]` (f32, f16, bf16; rows any stride) at `labels`
    /// (`[rows]` i32 or i64, contiguous) into `loss` (`[1]` f32), and when asked its gradient
    /// `grad` (`[rows, vocab]`, the logits' dtype; may be `logits` itself, in place).
    pub fn forward(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        loss: &Tensor,
        grad: Option<&Tensor>,
        options: &CrossEntropyOptions,
    ) -> Result<()> {
        let labels = labels.view();
        let rows = self.check_labels_shape(&labels)?;
        let device = logits.device();
        self.count(device, &labels, options)?;
        self.rows(device, logits, &labels, &self.row_loss.narrow(0, 0, rows)?, grad, options)?;
        self.reduce(device, rows, &mut TensorViewMut::of_tensor(loss), options)
    }

    /// The per-row losses of the last call's first `rows` rows (`[rows]` f32; 0 where ignored).
    pub fn row_losses(&self, rows: usize) -> Result<Tensor> {
        self.row_loss.narrow(0, 0, rows)
    }

    /// Reads and clears the label error flag (waits for the device).
    pub fn check_labels(&self) -> Result<()> {
        check_flag(OP, self.flag.tensor(), LABELS)
    }

    fn check_labels_shape(&self, labels: &TensorView<'_>) -> Result<usize> {
        label_type(labels.dtype())?;
        if labels.shape().len() != 1 || !labels.dims().is_contiguous() {
            return Err(Error::shape(OP, "labels", labels.shape().to_vec(), "contiguous [rows]"));
        }
        let rows = labels.shape()[0];
        if rows > self.max_rows() {
            return Err(Error::invalid(OP, "rows", rows, format!("more than the {} planned", self.max_rows())));
        }
        Ok(rows)
    }

    /// The count of labelled rows into the scratch (one block).
    fn count(&self, device: &Device, labels: &TensorView<'_>, options: &CrossEntropyOptions) -> Result<()> {
        let mut args = KernelArgs::new(OP, device);
        let lb = args.read("labels", labels)?.addr;
        let cb = args.write_tensor("count", &self.count)?;
        let params = CrossEntropyParams {
            labels: lb,
            count: cb,
            rows: to_i64(OP, "rows", labels.shape()[0])?,
            ..params(labels.dtype(), options)?
        };
        args.launch(COUNT, one_block(LLK_CE_REDUCE_THREADS), &params)
    }

    /// The per-row kernel over `logits` (labels and row losses of the same rows).
    fn rows(
        &self,
        device: &Device,
        logits: &Tensor,
        labels: &TensorView<'_>,
        row_loss: &Tensor,
        grad: Option<&Tensor>,
        options: &CrossEntropyOptions,
    ) -> Result<()> {
        let dtype = logits.dtype();
        check_float(OP, "logits", dtype)?;
        let [rows, vocab] = *logits.shape() else {
            return Err(Error::shape(OP, "logits", logits.shape().to_vec(), "[rows, vocab]"));
        };
        if labels.shape() != [rows] {
            return Err(Error::shape(
                OP,
                "labels",
                labels.shape().to_vec(),
                format!("[{rows}] (one per row of logits)"),
            ));
        }
        if vocab == 0 {
            return Err(Error::invalid(OP, "vocab", 0, "must be > 0"));
        }
        if let Some(g) = grad {
            check_dtype(OP, "grad", g.dtype(), dtype)?;
            if g.shape() != logits.shape() {
                return Err(Error::shape(OP, "grad", g.shape().to_vec(), format!("{:?} like logits", logits.shape())));
            }
        }
        if !options.grad_scale.is_finite() {
            return Err(Error::invalid(OP, "grad_scale", options.grad_scale, "must be finite"));
        }
        if rows == 0 {
            return Ok(());
        }
        let in_place = grad
            .is_some_and(|g| g.shares_storage(logits) && g.dims() == logits.dims() && g.offset() == logits.offset());
        let xv = logits.view();
        let mut gv = grad.map(TensorViewMut::of_tensor);
        let mut args = KernelArgs::new(OP, device);
        let gb = gv.as_mut().map(|g| args.write("grad", g)).transpose()?;
        let xb = match gb {
            Some(g) if in_place => g,
            _ => args.read("logits", &xv)?,
        };
        let xr = Rows::of(OP, "logits", &xb, 1)?;
        let gr = gb.as_ref().map(|g| Rows::of(OP, "grad", g, 1)).transpose()?;
        let lb = args.read("labels", labels)?.addr;
        let rb = args.write_tensor("row losses", row_loss)?;
        let cb = args.read_tensor("count", &self.count)?;
        let fb = args.write_tensor("error flag", self.flag.tensor())?;
        if let Some(gr) = gr {
            if !in_place {
                check_disjoint(OP, ("grad", gr), ("logits", xr))?;
            }
        }
        let v = dtype.vec16();
        let aligned = |r: &Rows| r.addr % 16 == 0 && (r.rows <= 1 || r.row_stride % v == 0);
        let vectorized = vocab % v == 0 && aligned(&xr) && gr.as_ref().is_none_or(aligned);
        let params = CrossEntropyParams {
            logits: xr.addr,
            labels: lb,
            grad: gr.map_or(0, |g| g.addr),
            row_loss: rb,
            count: cb,
            error_flag: fb,
            rows: to_i64(OP, "rows", rows)?,
            vocab: to_i64(OP, "vocab", vocab)?,
            logits_stride: to_i64(OP, "logits row stride", xr.row_stride)?,
            grad_stride: to_i64(OP, "grad row stride", gr.map_or(0, |g| g.row_stride))?,
            ..params(labels.dtype(), options)?
        };
        let dims = LaunchDims { grid: (grid_x(OP, rows)?, 1, 1), block: (LLK_CE_THREADS, 1, 1), smem_at_launch: 0 };
        args.launch(ROWS.find(OP, "logits", (Access::of(vectorized), dtype))?, dims, &params)
    }

    /// The reduced loss of the first `rows` row losses into `loss` (one block).
    fn reduce(
        &self,
        device: &Device,
        rows: usize,
        loss: &mut TensorViewMut<'_>,
        options: &CrossEntropyOptions,
    ) -> Result<()> {
        check_dtype(OP, "loss", loss.dtype(), DType::F32)?;
        if loss.shape().iter().product::<usize>() != 1 {
            return Err(Error::shape(OP, "loss", loss.shape().to_vec(), "one f32 ([1] or [])"));
        }
        let row_loss = self.row_loss.narrow(0, 0, rows)?;
        let mut args = KernelArgs::new(OP, device);
        let rb = args.read_tensor("row losses", &row_loss)?;
        let cb = args.read_tensor("count", &self.count)?;
        let ob = args.write("loss", loss)?.addr;
        let params = CrossEntropyParams {
            row_loss: rb,
            count: cb,
            loss: ob,
            rows: to_i64(OP, "rows", rows)?,
            ..params(DType::I32, options)?
        };
        args.launch(REDUCE, one_block(LLK_CE_REDUCE_THREADS), &params)
    }
}

/// [`LmHeadGrads`] as borrowed views, for [`FusedLinearCrossEntropy::forward_on`].
#[derive(Debug, Default)]
pub struct LmHeadGradsView<'r, 'a> {
    /// `[tokens, hidden]`, the hidden states' dtype or f32: overwritten with d loss / d hidden.
    pub d_hidden: Option<&'r mut TensorViewMut<'a>>,
    /// `[vocab, hidden]`, the weight's dtype or f32: overwritten or (with `accumulate_weight`)
    /// added to.
    pub d_weight: Option<&'r mut TensorViewMut<'a>>,
    /// `d_weight += ...`.
    pub accumulate_weight: bool,
}

/// Where [`FusedLinearCrossEntropy::forward`] writes the gradients (each optional).
#[derive(Clone, Copy, Debug, Default)]
pub struct LmHeadGrads<'a> {
    /// `[tokens, hidden]`, the hidden states' dtype or f32: overwritten with d loss / d hidden.
    pub d_hidden: Option<&'a Tensor>,
    /// `[vocab, hidden]`, the weight's dtype or f32 (f32 recommended: it is summed chunk by
    /// chunk): d loss / d weight, overwritten or (with `accumulate_weight`) added to.
    pub d_weight: Option<&'a Tensor>,
    /// `d_weight += ...` (gradient accumulation over micro-batches).
    pub accumulate_weight: bool,
}

/// The LM head and the loss fused by chunks of tokens (Liger Kernel's fused linear
/// cross-entropy): for each chunk, the logits `hidden_c Wᵀ` (rounded to the dtype, as Hugging
/// Face computes them before `.float()`), the loss and its gradient written over those logits,
/// then `d_hidden_c = dlogits_c W` and `d_weight += dlogits_cᵀ hidden_c`. Only `chunk_rows x
/// vocab` logits exist at a time: at Llama 3's 128256-word vocabulary and 8192 tokens the full
/// bf16 logits take 2.1 GB (4.2 GB more as f32), a 256-row chunk 66 MB. The products are
/// [`linear`](super::linear())'s (cuBLAS, or the CPU GEMM on the emulated target); nothing is
/// synchronized.
///
/// The loss and `d_hidden` are the plain composition's (logits by [`linear`](super::linear()),
/// then [`CrossEntropy::forward`], then [`linear_backward_input`](super::linear_backward_input()))
/// row for row; `d_weight` is
/// summed over chunks instead of in one product.
#[derive(Debug)]
pub struct FusedLinearCrossEntropy {
    ce: CrossEntropy,
    /// `[chunk_rows, vocab]` in the dtype: one chunk's logits, then its gradient.
    logits: Tensor,
}

impl FusedLinearCrossEntropy {
    /// Planned once for up to `max_tokens` tokens of `dtype` over a `vocab`-word head, with
    /// `chunk_rows` tokens per chunk (see [`FusedLinearCrossEntropy::chunk_rows_for`]).
    pub fn new(
        device: &Device,
        dtype: DType,
        vocab: usize,
        max_tokens: usize,
        chunk_rows: usize,
    ) -> Result<FusedLinearCrossEntropy> {
        check_float(OP, "dtype", dtype)?;
        if vocab == 0 {
            return Err(Error::invalid(OP, "vocab", vocab, "must be > 0"));
        }
        if chunk_rows == 0 {
            return Err(Error::invalid(OP, "chunk_rows", chunk_rows, "must be > 0"));
        }
        let logits = Tensor::zeros(device, dtype, &[chunk_rows, vocab])?;
        Ok(FusedLinearCrossEntropy { ce: CrossEntropy::new(device, max_tokens)?, logits })
    }

    /// Rows per chunk whose logits take about `bytes` (a power of two, at least 1): Liger sizes
    /// the chunk so that its logits are about as large as the hidden states; 64 MiB is a good
    /// start on a GPU.
    pub fn chunk_rows_for(vocab: usize, dtype: DType, bytes: usize) -> usize {
        let rows = bytes / vocab.max(1) / dtype.size();
        if rows <= 1 { 1 } else { 1 << rows.ilog2() }
    }

    /// The tokens per chunk.
    pub fn chunk_rows(&self) -> usize {
        self.logits.shape()[0]
    }

    /// The loss of `hidden` `[tokens, hidden_size]` through the LM head `weight` `[vocab,
    /// hidden_size]` (same dtype, rows any stride) at `labels` (`[tokens]` i32 or i64) into
    /// `loss` (`[1]` f32), and the gradients `grads` asks for.
    pub fn forward(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        labels: &Tensor,
        loss: &Tensor,
        grads: LmHeadGrads<'_>,
        options: &CrossEntropyOptions,
    ) -> Result<()> {
        let mut dh = grads.d_hidden.map(TensorViewMut::of_tensor);
        let mut dw = grads.d_weight.map(TensorViewMut::of_tensor);
        let grads = LmHeadGradsView {
            d_hidden: dh.as_mut(),
            d_weight: dw.as_mut(),
            accumulate_weight: grads.accumulate_weight,
        };
        let (h, w, l) = (hidden.view(), weight.view(), labels.view());
        self.forward_on(hidden.device(), &h, &w, &l, &mut TensorViewMut::of_tensor(loss), grads, options)
    }

    /// [`FusedLinearCrossEntropy::forward`] on borrowed views, queued on `queue` (of the context
    /// this was planned on).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_on(
        &self,
        queue: &impl Queue,
        hidden: &TensorView<'_>,
        weight: &TensorView<'_>,
        labels: &TensorView<'_>,
        loss: &mut TensorViewMut<'_>,
        grads: LmHeadGradsView<'_, '_>,
        options: &CrossEntropyOptions,
    ) -> Result<()> {
        let (chunk, vocab) = (self.logits.shape()[0], self.logits.shape()[1]);
        // Every launch goes on the caller's queue (the planned scratch is of the same context).
        let device = queue.queue_device()?;
        if !device.same_context(self.logits.device()) {
            return Err(Error::DeviceMismatch { op: OP, what: "the planned scratch" });
        }
        check_dtype(OP, "hidden", hidden.dtype(), self.logits.dtype())?;
        check_dtype(OP, "weight", weight.dtype(), self.logits.dtype())?;
        let [tokens, width] = *hidden.shape() else {
            return Err(Error::shape(OP, "hidden", hidden.shape().to_vec(), "[tokens, hidden]"));
        };
        if weight.shape() != [vocab, width] {
            return Err(Error::shape(
                OP,
                "weight",
                weight.shape().to_vec(),
                format!("[{vocab}, {width}] (vocab, hidden)"),
            ));
        }
        if labels.shape() != [tokens] {
            return Err(Error::shape(OP, "labels", labels.shape().to_vec(), format!("[{tokens}] (one per token)")));
        }
        let LmHeadGradsView { mut d_hidden, mut d_weight, accumulate_weight } = grads;
        for (what, shape, want) in [
            ("d_hidden", d_hidden.as_ref().map(|t| t.shape().to_vec()), [tokens, width]),
            ("d_weight", d_weight.as_ref().map(|t| t.shape().to_vec()), [vocab, width]),
        ] {
            if let Some(shape) = shape {
                if shape != want {
                    return Err(Error::shape(OP, what, shape, format!("{want:?}")));
                }
            }
        }
        let wants_grad = d_hidden.is_some() || d_weight.is_some();
        self.ce.check_labels_shape(labels)?;
        self.ce.count(&device, labels, options)?;
        if tokens == 0 {
            if let (Some(dw), false) = (d_weight.as_mut(), accumulate_weight) {
                let none = self.logits.narrow(0, 0, 0)?;
                linear_backward_weight_on(&device, &none.view(), &hidden.narrow_rows("hidden", 0, 0)?, dw, false)?;
            }
        }
        for r0 in (0..tokens).step_by(chunk) {
            let n = chunk.min(tokens - r0);
            let (h, logits) = (hidden.narrow_rows("hidden", r0, n)?, self.logits.narrow(0, 0, n)?);
            linear_on(&device, &h, weight, None, &mut TensorViewMut::of_tensor(&logits))?;
            let row_loss = self.ce.row_loss.narrow(0, r0, n)?;
            let chunk_labels = labels.narrow_rows("labels", r0, n)?;
            self.ce.rows(&device, &logits, &chunk_labels, &row_loss, wants_grad.then_some(&logits), options)?;
            let lv = logits.view();
            if let Some(dh) = d_hidden.as_mut() {
                linear_backward_input_on(&device, &lv, weight, &mut dh.narrow_rows("d_hidden", r0, n)?, false)?;
            }
            if let Some(dw) = d_weight.as_mut() {
                linear_backward_weight_on(&device, &lv, &h, dw, accumulate_weight || r0 > 0)?;
            }
        }
        self.ce.reduce(&device, tokens, loss, options)
    }

    /// The per-row losses of the last call's first `tokens` tokens.
    pub fn row_losses(&self, tokens: usize) -> Result<Tensor> {
        self.ce.row_losses(tokens)
    }

    /// Reads and clears the label error flag (waits for the device).
    pub fn check_labels(&self) -> Result<()> {
        self.ce.check_labels()
    }
}

/// The label error flag's meaning.
const LABELS: &Meanings = &[BAD_LABEL];

/// The index type of `labels`.
fn label_type(dtype: DType) -> Result<LlkIndexType> {
    match dtype {
        DType::I32 => Ok(LlkIndexType::LLK_INDEX_I32),
        DType::I64 => Ok(LlkIndexType::LLK_INDEX_I64),
        other => Err(Error::UnsupportedDType { op: OP, what: "labels", dtype: other, supported: "i32, i64".into() }),
    }
}

/// The options' part of the params (addresses and sizes zero).
fn params(labels: DType, options: &CrossEntropyOptions) -> Result<CrossEntropyParams> {
    Ok(CrossEntropyParams {
        logits: 0,
        labels: 0,
        grad: 0,
        row_loss: 0,
        count: 0,
        loss: 0,
        error_flag: 0,
        rows: 0,
        vocab: 0,
        logits_stride: 0,
        grad_stride: 0,
        ignore_index: options.ignore_index,
        label_type: label_type(labels)?,
        reduction: match options.reduction {
            Reduction::Mean => LlkLossReduction::LLK_LOSS_MEAN,
            Reduction::Sum => LlkLossReduction::LLK_LOSS_SUM,
        },
        grad_scale: options.grad_scale,
    })
}

fn one_block(threads: u32) -> LaunchDims {
    LaunchDims { grid: (1, 1, 1), block: (threads, 1, 1), smem_at_launch: 0 }
}
