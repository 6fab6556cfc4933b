//! Micro-batches: examples packed end to end with no padding, each keeping its own positions and
//! attention (the varlen offsets), and Hugging Face's labels shifted by one token.

use crate::error::{Error, Result};

/// The label of a token that adds no loss (PyTorch's `ignore_index`).
pub const IGNORE: i32 = -100;

/// One training example as Hugging Face's data collators give it: token ids and labels of the
/// same length, `labels[t]` the id the model should see at `t` or [`IGNORE`] (a prompt token, a
/// user turn). The model predicts `labels[t + 1]` from the tokens up to `t`, as
/// `LlamaForCausalLM` shifts them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Unshifted labels, one per id.
    pub labels: Vec<i32>,
}

impl Example {
    /// Every token trained (causal language modelling on plain text).
    pub fn text(ids: Vec<u32>) -> Example {
        let labels = ids.iter().map(|&i| i as i32).collect();
        Example { ids, labels }
    }
}

/// Examples packed into one micro-batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Every example's ids, one after another.
    pub ids: Vec<i32>,
    /// The shifted labels: `labels[t]` is the next token's label within its example, [`IGNORE`]
    /// at each example's last token.
    pub labels: Vec<i32>,
    /// Each example's length.
    pub seq_lens: Vec<usize>,
}

impl Batch {
    /// Packs `examples` (each non-empty, labels as long as its ids, ids below `vocab`).
    pub fn pack(examples: &[Example], vocab: usize) -> Result<Batch> {
        const OP: &str = "Batch::pack";
        let mut b = Batch { ids: Vec::new(), labels: Vec::new(), seq_lens: Vec::with_capacity(examples.len()) };
        for (e, ex) in examples.iter().enumerate() {
            if ex.ids.is_empty() || ex.labels.len() != ex.ids.len() {
                return Err(Error::invalid(
                    OP,
                    "example",
                    e,
                    format!("{} ids and {} labels (non-empty, one label per id)", ex.ids.len(), ex.labels.len()),
                ));
            }
            for (&id, &label) in ex.ids.iter().zip(&ex.labels) {
                if id as usize >= vocab || (label != IGNORE && (label < 0 || label as usize >= vocab)) {
                    return Err(Error::invalid(
                        OP,
                        "example",
                        e,
                        format!("id {id} / label {label} outside the vocabulary of {vocab}"),
                    ));
                }
            }
            b.ids.extend(ex.ids.iter().map(|&i| i as i32));
            b.labels.extend(ex.labels[1..].iter().copied().chain([IGNORE]));
            b.seq_lens.push(ex.ids.len());
        }
        Ok(b)
    }

    /// Tokens in the batch.
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// Each token's position in its example.
    pub fn positions(&self) -> Vec<i32> {
        self.seq_lens.iter().flat_map(|&n| 0..n as i32).collect()
    }

    /// The examples' offsets: `[0, len0, len0 + len1, ...]`.
    pub fn cu_seqlens(&self) -> Vec<i32> {
        std::iter::once(0)
            .chain(self.seq_lens.iter().scan(0i32, |acc, &n| {
                *acc += n as i32;
                Some(*acc)
            }))
            .collect()
    }

    /// Tokens that add to the loss.
    pub fn labelled(&self) -> usize {
        self.labels.iter().filter(|&&l| l != IGNORE).count()
    }
}
