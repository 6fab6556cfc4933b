//! A planned step: which sequences, at which positions ([`LayerWorkspace::begin_step`](super::LayerWorkspace::begin_step)).

/// One sequence of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepSeq {
    /// Its cache slot.
    pub slot: usize,
    /// Tokens already cached (its new tokens sit at positions `start..start + new`).
    pub start: usize,
    /// New tokens in this step.
    pub new: usize,
    /// Row of its first new token in the step's hidden states.
    pub offset: usize,
}

/// A planned step: which sequences, at which positions; its offsets are on the device in the
/// workspace that planned it ([`LayerWorkspace::begin_step`](super::LayerWorkspace::begin_step)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub(crate) workspace: usize,
    pub(crate) generation: u64,
    /// The cache it was planned on: (id, generation).
    pub(crate) cache: (usize, u64),
    /// Every sequence has one new token: attention runs the split-KV decode kernel.
    pub(crate) decode: bool,
    /// Block-table width (the cache's pages per sequence).
    pub(crate) width: usize,
    /// Total new tokens (rows of the hidden states).
    pub tokens: usize,
    /// The step's sequences, in increasing slot order.
    pub seqs: Vec<StepSeq>,
}

impl Step {
    /// The positions of the step's tokens, in row order.
    pub fn positions(&self) -> Vec<i64> {
        self.seqs.iter().flat_map(|s| (s.start..s.start + s.new).map(|p| p as i64)).collect()
    }
}
