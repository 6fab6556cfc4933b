//! The LM head fused with the cross-entropy loss (Liger Kernel's fused linear cross-entropy):
//! `loss = CE(hidden Wᵀ, labels)` computed chunk by chunk of tokens, so the `[tokens, vocab]`
//! logits never exist in full (at Llama 3's 128256-word vocabulary, 8192 bf16 tokens of logits
//! take 2.1 GB; a 256-token chunk 66 MB).
//!
//! As in Liger, the gradients are computed in the same pass (each chunk's logits are turned
//! into their gradient in place, then into `d_hidden` and `d_weight`) and kept with the op; the
//! backward scales them by the loss's upstream gradient. Only the gradients candle will ask for
//! are computed: none for a frozen weight (LoRA training), none at all in evaluation.
//!
//! PyTorch's `F.cross_entropy(logits.float(), labels, ignore_index=-100)`, the mean over the
//! labelled tokens (or the sum): Hugging Face's causal-LM loss once the labels are shifted.

use candle::{DType, Result, Shape, Tensor};
pub use llama_kernels::ops::cross_entropy::{CrossEntropyOptions, IGNORE_INDEX, Reduction};
use llama_kernels::ops::cross_entropy::{FusedLinearCrossEntropy, LmHeadGradsView};

use crate::bridge::{Input, Kept, Kernel, KernelStorage, arity, custom_op, first, kernel_dtype, kernel_err, tensor_of};

/// Tokens per chunk when none is given: chunks of about 64 MiB of logits.
const CHUNK_BYTES: usize = 64 << 20;

/// The mean (or summed) cross-entropy of the logits `hidden Wᵀ` at `labels`, without
/// materializing the logits: `hidden` `[..., hidden_size]`, `weight` `[vocab, hidden_size]` (one
/// float dtype), `labels` i32 or i64 with one label per token (`ignore_index` rows add nothing).
/// Returns an f32 scalar; differentiable in `hidden` and `weight`. `chunk_rows` sets the tokens
/// per chunk (`None`: about 64 MiB of logits).
pub fn fused_linear_cross_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    labels: &Tensor,
    options: &CrossEntropyOptions,
    chunk_rows: Option<usize>,
) -> Result<Tensor> {
    let width = hidden.dims().last().copied().unwrap_or(0);
    let tokens = hidden.elem_count().checked_div(width).unwrap_or(0);
    let hidden2 = hidden.contiguous()?.reshape((tokens, width))?;
    let labels = labels.contiguous()?.flatten_all()?;
    let op =
        LmHeadLoss { options: *options, chunk_rows, wants: [hidden.track_op(), weight.track_op()], grads: Kept::new() };
    hidden2.apply_op3(&weight.contiguous()?, &labels, op)
}

type Grads = (Option<Tensor>, Option<Tensor>);

/// `[hidden, weight, labels]` to `[loss]`; the gradients asked for (`wants`: d_hidden,
/// d_weight) are kept for the backward.
struct LmHeadLoss {
    options: CrossEntropyOptions,
    chunk_rows: Option<usize>,
    wants: [bool; 2],
    grads: Kept<Grads>,
}

impl Kernel for LmHeadLoss {
    const NAME: &'static str = "llama-kernels/fused_linear_cross_entropy";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [hidden, weight, labels] = arity(Self::NAME, inputs)?;
        let device = hidden.storage.kernel_device()?;
        let dtype = kernel_dtype(Self::NAME, hidden.dtype())?;
        let (tokens, vocab) =
            (hidden.dims().first().copied().unwrap_or(0), weight.dims().first().copied().unwrap_or(0));
        let chunk =
            self.chunk_rows.unwrap_or_else(|| FusedLinearCrossEntropy::chunk_rows_for(vocab, dtype, CHUNK_BYTES));
        let ce = FusedLinearCrossEntropy::new(&device, dtype, vocab, tokens, chunk.max(1)).map_err(kernel_err)?;
        let mut loss = hidden.zeros(&[1], DType::F32)?;
        let mut dh = self.wants[0].then(|| hidden.zeros(hidden.dims(), hidden.dtype())).transpose()?;
        let mut dw = self.wants[1].then(|| weight.zeros(weight.dims(), DType::F32)).transpose()?;
        {
            let (hv, wv, lv) = (hidden.view()?, weight.view()?, labels.view()?);
            let mut dhv = dh.as_mut().map(|s| s.view_mut(hidden.dims())).transpose()?;
            let mut dwv = dw.as_mut().map(|s| s.view_mut(weight.dims())).transpose()?;
            let grads = LmHeadGradsView { d_hidden: dhv.as_mut(), d_weight: dwv.as_mut(), accumulate_weight: false };
            ce.forward_on(&device, &hv, &wv, &lv, &mut loss.view_mut(&[1])?, grads, &self.options)
                .map_err(kernel_err)?;
        }
        // A label outside [0, vocab) (not ignore_index) is an error here, as in PyTorch.
        ce.check_labels().map_err(kernel_err)?;
        let mut outputs = vec![(loss, Shape::from_dims(&[]))];
        outputs.extend(dh.map(|s| (s, hidden.layout.shape().clone())));
        outputs.extend(dw.map(|s| (s, weight.layout.shape().clone())));
        Ok(outputs)
    }
}

impl LmHeadLoss {
    /// The loss, keeping the gradients for the backward.
    fn forward<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<(S, Shape)> {
        let mut outputs = self.run(inputs)?.into_iter();
        let loss = first(outputs.by_ref().take(1).collect(), Self::NAME)?;
        let mut take = |wanted: bool| wanted.then(|| outputs.next().map(|(s, shape)| tensor_of(s, shape))).flatten();
        let grads = (take(self.wants[0]), take(self.wants[1]));
        self.grads.put(Self::NAME, grads)?;
        Ok(loss)
    }

    fn backward(&self, [h, w, _l]: [&Tensor; 3], _loss: &Tensor, d_loss: &Tensor) -> Result<[Option<Tensor>; 3]> {
        let (dh, dw) = self.grads.get(Self::NAME, "gradients")?;
        let scale = |g: Option<Tensor>, dtype: DType| -> Result<Option<Tensor>> {
            g.map(|g| g.broadcast_mul(&d_loss.to_dtype(g.dtype())?)?.to_dtype(dtype)).transpose()
        };
        let dh = scale(dh, h.dtype())?;
        Ok([dh, scale(dw, w.dtype())?, None])
    }
}
custom_op!(CustomOp3 for LmHeadLoss);
