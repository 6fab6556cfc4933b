//! Generation for several sequences at once ([`Model::generate_batch`]): the prompts are
//! prefilled together (packed into steps of up to the planned token budget), then every live
//! sequence decodes one token per step, all of them in one forward and one sampling launch. A
//! sequence that stops leaves the batch and frees its pages; the others go on.
//!
//! Each sequence is sampled from its own logits with its own parameters, seed and token index
//! (the RNG's counter), so its tokens are exactly those [`Model::generate`] gives it alone: the
//! batch composition changes the speed, never the text.

use std::time::Instant;

use crate::error::{Error, Result};
use llama_kernels::dtype::DType;
use llama_kernels::ops::sampling::{SamplingBatch, sample};
use llama_kernels::tensor::Tensor;

use super::generate::{GenerateOptions, Generation, StopReason};
use super::runner::{Logits, Model};

/// One sequence of a [`Model::generate_batch`] call.
#[derive(Clone, Debug)]
pub struct BatchRequest<'a> {
    /// The cache slot (empty at the start, cleared at the end).
    pub slot: usize,
    /// The prompt's token ids (at least one).
    pub prompt: &'a [u32],
    /// Limits, stop ids, sampling and seed.
    pub options: GenerateOptions,
}

impl Model {
    /// Generates a continuation for every request (see the module docs). `on_token(i, id)` is
    /// called with request `i`'s new id as soon as it is chosen (`false` stops that sequence).
    /// Returns one [`Generation`] per request, in request order; every slot is cleared at the end,
    /// whatever the outcome.
    pub fn generate_batch(
        &mut self,
        requests: &[BatchRequest<'_>],
        on_token: &mut dyn FnMut(usize, u32) -> bool,
    ) -> Result<Vec<Generation>> {
        let r = self.generate_batch_in(requests, on_token);
        for q in requests {
            self.clear(q.slot);
        }
        r
    }

    fn generate_batch_in(
        &mut self,
        requests: &[BatchRequest<'_>],
        on_token: &mut dyn FnMut(usize, u32) -> bool,
    ) -> Result<Vec<Generation>> {
        const OP: &str = "Model::generate_batch";
        let plan = self.plan();
        if requests.len() > plan.max_tokens.min(plan.slots) {
            return Err(Error::invalid(
                OP,
                "requests",
                requests.len(),
                format!(
                    "more sequences than the planned slots ({}) or tokens per step ({})",
                    plan.slots, plan.max_tokens
                ),
            ));
        }
        let mut seen = vec![false; plan.slots];
        for q in requests {
            if q.slot >= plan.slots || std::mem::replace(&mut seen[q.slot], true) {
                return Err(Error::invalid(OP, "slot", q.slot, format!("not a distinct slot below {}", plan.slots)));
            }
            if q.prompt.is_empty() || q.prompt.len() >= plan.max_len {
                return Err(Error::invalid(
                    OP,
                    "prompt",
                    q.prompt.len(),
                    format!("must be 1..{} tokens", plan.max_len),
                ));
            }
            if self.len(q.slot) != 0 {
                return Err(Error::invalid(OP, "slot", q.slot, "already holds a sequence (clear it first)"));
            }
            if !q.options.sampling.is_valid() {
                return Err(Error::invalid(
                    OP,
                    "sampling",
                    format!("{:?}", q.options.sampling),
                    "parameters out of their domain",
                ));
            }
        }
        let n = requests.len();
        let start = Instant::now();
        let mut out: Vec<Generation> = requests
            .iter()
            .map(|_| Generation {
                tokens: Vec::new(),
                reason: StopReason::Limit,
                time_to_first_token: Default::default(),
                decode_time: Default::default(),
            })
            .collect();
        // Live sequences in slot order (a step lists its slots in increasing order), which is
        // also the order of their logits rows.
        let mut live: Vec<usize> = (0..n).filter(|&i| requests[i].options.max_new_tokens > 0).collect();
        live.sort_by_key(|&i| requests[i].slot);
        if live.is_empty() {
            return Ok(out);
        }
        let device = self.device().clone();
        // Prefill: each step takes as many prompt tokens as the budget allows, sequence by
        // sequence; a sequence's logits row is kept when its prompt ends in that step.
        let first_logits = Tensor::zeros(&device, self.dtype(), &[live.len(), self.vocab()])?;
        let mut done = vec![0usize; n];
        while live.iter().any(|&i| done[i] < requests[i].prompt.len()) {
            let mut budget = plan.max_tokens;
            let mut batch: Vec<(usize, &[u32])> = Vec::new();
            let mut members = Vec::new();
            for (row, &i) in live.iter().enumerate() {
                let p = requests[i].prompt;
                if done[i] == p.len() || budget == 0 {
                    continue;
                }
                let take = (p.len() - done[i]).min(budget);
                batch.push((requests[i].slot, &p[done[i]..done[i] + take]));
                members.push((row, i, done[i] + take == p.len()));
                done[i] += take;
                budget -= take;
            }
            let logits = self.step(&batch, Logits::Last)?;
            for (b, &(row, _, finished)) in members.iter().enumerate() {
                if finished {
                    first_logits.narrow(0, row, 1)?.copy_from(&logits.narrow(0, b, 1)?)?;
                }
            }
        }
        let mut logits = first_logits;
        let mut decode_start: Vec<Option<Instant>> = vec![None; n];
        // Sampling parameters and outputs per live-batch size, made once per call.
        let mut per_size: Vec<Option<(SamplingBatch, Tensor)>> = (0..=n).map(|_| None).collect();
        loop {
            let m = live.len();
            if self.dtype() == DType::F16 && logits.to_f64_vec()?.iter().any(|v| !v.is_finite()) {
                return Err(Error::from(llama_kernels::Error::DeviceReported {
                    op: OP,
                    what:
                        "non-finite logits in f16: an activation overflowed f16's range (65504); bf16 and f32 do not \
                           overflow there"
                            .into(),
                }));
            }
            let configs: Vec<_> = live.iter().map(|&i| requests[i].options.sampling).collect();
            let seeds: Vec<u64> = live.iter().map(|&i| requests[i].options.seed).collect();
            let offsets: Vec<u64> = live.iter().map(|&i| out[i].tokens.len() as u64).collect();
            let (params, chosen) = match &mut per_size[m] {
                Some(p) => {
                    p.0.set(&configs, &seeds, &offsets)?;
                    &*p
                }
                slot => &*slot.insert((
                    SamplingBatch::new(&device, &configs, &seeds, &offsets)?,
                    Tensor::zeros(&device, DType::I32, &[m])?,
                )),
            };
            sample(&logits, &params.tensors(), chosen, &self.errors)?;
            let ids = chosen.to_vec::<i32>()?;
            let mut next_live = Vec::new();
            let mut next_ids = Vec::new();
            for (&i, &id) in live.iter().zip(&ids) {
                let next = u32::try_from(id).map_err(|_| match self.errors.check_sampling() {
                    Err(e) => Error::from(e),
                    Ok(()) => Error::invalid(OP, "token", id, "the sampler chose no token"),
                })?;
                let g = &mut out[i];
                g.tokens.push(next);
                if decode_start[i].is_none() {
                    let now = Instant::now();
                    g.time_to_first_token = now.duration_since(start);
                    decode_start[i] = Some(now);
                }
                let o = &requests[i].options;
                let reason = if o.stop.contains(&next) {
                    Some(StopReason::Stop(next))
                } else if !on_token(i, next) {
                    Some(StopReason::Caller)
                } else if g.tokens.len() >= o.max_new_tokens {
                    Some(StopReason::Limit)
                } else if self.len(requests[i].slot) + 1 > plan.max_len {
                    Some(StopReason::Context)
                } else {
                    None
                };
                match reason {
                    Some(r) => {
                        g.reason = r;
                        g.decode_time = decode_start[i].map(|t| t.elapsed()).unwrap_or_default();
                        self.clear(requests[i].slot);
                    }
                    None => {
                        next_live.push(i);
                        next_ids.push([next]);
                    }
                }
            }
            live = next_live;
            if live.is_empty() {
                break;
            }
            // One decode step for every live sequence, at most `max_tokens` per step.
            let batch: Vec<(usize, &[u32])> =
                live.iter().zip(&next_ids).map(|(&i, id)| (requests[i].slot, &id[..])).collect();
            logits = self.step(&batch, Logits::Last)?;
        }
        self.check_errors()?;
        Ok(out)
    }
}
