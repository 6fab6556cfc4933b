//! Generation: prefill a prompt (in chunks of the planned step size), then decode one token at a
//! time until a stop id, the token limit or the caller stops it; the sequence's pages are freed
//! at the end.
//!
//! Stop ids are a set: a model's `eos_token_id` may be a list (Llama 3.1 lists 128001, 128008
//! and 128009; a chat turn ends with `<|eot_id|>` 128009, not `<|end_of_text|>` 128001), and
//! callers add their own. The stop token is returned with the others but is not text.
//!
//! Tokens are chosen on the device ([`llama_kernels::ops::sampling`]: greedy, temperature, top-k, top-p,
//! min-p, a counter-based RNG keyed by the seed, its counter the token's index), so a step reads
//! back one token id, not the logits. A run is reproducible from its seed. f16 runs also read
//! the logits back to name an overflow (non-finite logits) instead of sampling from it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use llama_kernels::dtype::DType;
use llama_kernels::ops::sampling::{SamplingBatch, sample};
pub use llama_kernels::spec::sampling::SamplingConfig;
use llama_kernels::tensor::Tensor;

use super::runner::{Logits, Model};

/// What [`Model::generate`] is asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// Most tokens to generate (the stop token included).
    pub max_new_tokens: usize,
    /// Token ids that end the sequence (the model's end-of-sequence and end-of-turn ids, plus
    /// the caller's).
    pub stop: BTreeSet<u32>,
    /// How tokens are chosen ([`SamplingConfig::GREEDY`]: the argmax).
    pub sampling: SamplingConfig,
    /// The RNG's key: the same seed, prompt and parameters give the same tokens.
    pub seed: u64,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced this stop id.
    Stop(u32),
    /// `max_new_tokens` were generated.
    Limit,
    /// The callback returned `false`.
    Caller,
    /// The sequence reached the planned `max_len`.
    Context,
}

/// The outcome of [`Model::generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated ids, the stop id included when there was one.
    pub tokens: Vec<u32>,
    /// Why it ended.
    pub reason: StopReason,
    /// Time from the call to the first generated token (the prefill).
    pub time_to_first_token: Duration,
    /// Time of the decode steps after the first token.
    pub decode_time: Duration,
}

impl Model {
    /// Generates a continuation of `prompt` in `slot` (which must be empty), calling `on_token`
    /// with each new id as soon as it is chosen (`false` stops). The slot is cleared at the end,
    /// whatever the outcome.
    pub fn generate(
        &mut self,
        slot: usize,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation> {
        let r = self.generate_in(slot, prompt, opts, on_token);
        self.clear(slot);
        r
    }

    fn generate_in(
        &mut self,
        slot: usize,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation> {
        const OP: &str = "Model::generate";
        if prompt.is_empty() {
            return Err(Error::invalid(OP, "prompt", "[]", "needs at least one token"));
        }
        if self.len(slot) != 0 {
            return Err(Error::invalid(OP, "slot", slot, "already holds a sequence (clear it first)"));
        }
        let plan = self.plan();
        if prompt.len() >= plan.max_len {
            return Err(Error::invalid(
                OP,
                "prompt",
                prompt.len(),
                format!("leaves no room in the planned max_len {}", plan.max_len),
            ));
        }
        let start = Instant::now();
        if opts.max_new_tokens == 0 {
            return Ok(Generation {
                tokens: Vec::new(),
                reason: StopReason::Limit,
                time_to_first_token: Duration::ZERO,
                decode_time: Duration::ZERO,
            });
        }
        if !opts.sampling.is_valid() {
            return Err(Error::invalid(
                OP,
                "sampling",
                format!("{:?}", opts.sampling),
                "parameters out of their domain",
            ));
        }
        let device = self.device().clone();
        let params = SamplingBatch::new(&device, &[opts.sampling], &[opts.seed], &[0])?;
        let chosen = Tensor::zeros(&device, DType::I32, &[1])?;
        let mut logits = None;
        for chunk in prompt.chunks(plan.max_tokens) {
            logits = Some(self.step(&[(slot, chunk)], Logits::Last)?);
        }
        let mut tokens: Vec<u32> = Vec::new();
        let mut first = None;
        let reason = loop {
            let l = logits.as_ref().ok_or_else(|| Error::invalid(OP, "prompt", "[]", "needs at least one token"))?;
            if self.dtype() == DType::F16 && l.to_f64_vec()?.iter().any(|v| !v.is_finite()) {
                return Err(Error::from(llama_kernels::Error::DeviceReported {
                    op: OP,
                    what: format!(
                        "non-finite logits after {} tokens in f16: an activation overflowed f16's range (65504); \
                         bf16 and f32 do not overflow there",
                        self.len(slot)
                    ),
                }));
            }
            params.set(&[opts.sampling], &[opts.seed], &[tokens.len() as u64])?;
            sample(l, &params.tensors(), &chosen, &self.errors)?;
            let id = chosen.to_vec::<i32>()?[0];
            let next = u32::try_from(id).map_err(|_| match self.errors.check_sampling() {
                Err(e) => Error::from(e),
                Ok(()) => Error::invalid(OP, "token", id, "the sampler chose no token"),
            })?;
            tokens.push(next);
            if first.is_none() {
                first = Some(Instant::now());
            }
            if opts.stop.contains(&next) {
                break StopReason::Stop(next);
            }
            if !on_token(next) {
                break StopReason::Caller;
            }
            if tokens.len() >= opts.max_new_tokens {
                break StopReason::Limit;
            }
            if self.len(slot) + 1 > plan.max_len {
                break StopReason::Context;
            }
            logits = Some(self.step(&[(slot, &[next])], Logits::Last)?);
        };
        self.check_errors()?;
        let first = first.unwrap_or_else(Instant::now);
        Ok(Generation {
            tokens,
            reason,
            time_to_first_token: first.duration_since(start),
            decode_time: first.elapsed(),
        })
    }
}
