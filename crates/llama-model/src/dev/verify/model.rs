//! A whole model against the f64 reference: every layer stage-local (the reference layer fed
//! the device's own input to that layer, with a reference KV cache built from those inputs) and
//! the logits end to end (the reference chain from the token ids alone), as the KL divergence
//! between the two next-token distributions and the agreement of their most likely tokens.

use crate::error::Result;
use crate::model::{HostModel, Logits, Model, ModelPlan};
use llama_kernels::backend::Device;
use llama_kernels::dev::testing::{Comparison, Tolerance, compare};
use llama_kernels::dtype::DType;
use llama_kernels::reference::block::{RefCache, forward};
use llama_kernels::reference::{linear::linear, rms_norm::rms_norm};

use super::block::{StepReferences, e2e_tolerance, step_values};

/// The outcome of [`check_model`].
#[derive(Clone, Debug)]
pub struct ModelReport {
    /// Per layer, its worst stage-local output comparison over the steps.
    pub layers: Vec<(Comparison, Tolerance)>,
    /// Largest and mean KL divergence `KL(reference || device)` of the next-token
    /// distributions over every position of every step.
    pub kl_max: f64,
    pub kl_mean: f64,
    /// Positions whose most likely token agrees, and positions compared.
    pub top1: (usize, usize),
    /// The KL limit for the run dtype.
    pub kl_limit: f64,
    /// Largest activation (|hidden|) at each layer's output, next to the dtype's range.
    pub max_activation: Vec<f64>,
    /// The first layer whose output was not finite (an overflow of the run dtype), if any.
    pub first_overflow: Option<usize>,
    pub pass: bool,
}

/// The largest finite value of a float dtype (f16 65504; bf16 and f32 about 3.4e38).
pub fn dtype_max(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 65504.0,
        DType::BF16 => 3.3895313892515355e38,
        _ => f64::from(f32::MAX),
    }
}

/// Largest KL divergence of the next-token distribution allowed for `dtype` (f32 agrees with
/// f64 to rounding; 16-bit runs drift through 30 layers of rounding).
pub fn kl_limit(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-2,
        _ => 5e-2,
    }
}

fn log_softmax(x: &[f64]) -> Vec<f64> {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let z = x.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|v| v - z).collect()
}

fn argmax(x: &[f64]) -> usize {
    x.iter().enumerate().fold(0, |best, (i, &v)| if v > x[best] { i } else { best })
}

/// Runs `steps` (token ids of one sequence, step by step: a prompt, then more) through the
/// model on `device` in `dtype`, with logits at every position, and compares with the f64
/// reference of the same host weights.
pub fn check_model(device: &Device, host: &HostModel, dtype: DType, steps: &[Vec<u32>]) -> Result<ModelReport> {
    let total: usize = steps.iter().map(Vec::len).sum();
    let max_tokens = steps.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let plan = ModelPlan { slots: 1, max_len: total.max(1), max_tokens };
    let mut model = Model::new(device, host, dtype, plan)?;
    // Each step's reference multiplies packed projections by what the device does at its rows.
    let mut refs: Vec<StepReferences> = host.layers.iter().map(|_| StepReferences::default()).collect();
    let (hidden, vocab) = (host.hidden(), host.vocab());
    let embed = host.embed.f64();
    let norm = host.norm.f64();
    let dense_head = host.lm_head().f64();
    let mut local_caches: Vec<RefCache> = refs.iter().map(|_| RefCache::new(1)).collect();
    let mut chain_caches: Vec<RefCache> = refs.iter().map(|_| RefCache::new(1)).collect();
    let mut layers: Vec<Option<(Comparison, Tolerance)>> = vec![None; refs.len()];
    let mut max_activation = vec![0f64; refs.len()];
    let (mut kl_max, mut kl_sum, mut agree, mut count) = (0f64, 0f64, 0usize, 0usize);
    for tokens in steps {
        let t = tokens.len();
        let x0: Vec<f64> = tokens.iter().flat_map(|&id| embed[id as usize * hidden..][..hidden].to_vec()).collect();
        // The device, keeping each layer's output.
        let mut outputs: Vec<Vec<f64>> = Vec::with_capacity(refs.len());
        let logits = model.step_observed(&[(0, tokens)], Logits::All, &mut |_, h| {
            outputs.push(h.to_f64_vec()?);
            Ok(())
        })?;
        let got_logits = logits.to_f64_vec()?;
        model.check_errors()?;
        // Stage-local: each reference layer on the device's input to it.
        for (i, (spec, w)) in host.layers.iter().enumerate() {
            let layer = refs[i].get(*spec, w, dtype, t)?;
            let input = if i == 0 { &x0 } else { &outputs[i - 1] };
            let want = forward(layer, &mut local_caches[i], &[(0, t)], input)?;
            let want = want.get("output").unwrap_or_default();
            let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64).sqrt();
            let tol = e2e_tolerance(dtype, rms);
            let c = compare(&outputs[i], want, tol);
            max_activation[i] = outputs[i]
                .iter()
                .fold(max_activation[i], |m, v| if v.is_finite() { m.max(v.abs()) } else { f64::INFINITY });
            let worse = layers[i].as_ref().is_none_or(|(w, _)| c.worst_ratio > w.worst_ratio);
            if worse {
                layers[i] = Some((c, tol));
            }
        }
        // End to end: the reference chain from the token ids alone.
        let mut x = x0;
        for (i, (spec, w)) in host.layers.iter().enumerate() {
            let layer = refs[i].get(*spec, w, dtype, t)?;
            x = forward(layer, &mut chain_caches[i], &[(0, t)], &x)?.get("output").unwrap_or_default().to_vec();
        }
        let step_head;
        let head = match &host.lm_head_packed {
            Some(p) => {
                step_head = step_values(p, dtype, t).of(p, dtype);
                &step_head
            }
            None => &dense_head,
        };
        let want_logits = linear(&rms_norm(&x, &norm, hidden, f64::from(host.eps))?, head, None, hidden, vocab)?;
        for p in 0..t {
            let (g, w) = (&got_logits[p * vocab..][..vocab], &want_logits[p * vocab..][..vocab]);
            let (lg, lw) = (log_softmax(g), log_softmax(w));
            let kl: f64 = lw.iter().zip(&lg).map(|(a, b)| a.exp() * (a - b)).sum();
            kl_max = kl_max.max(kl);
            kl_sum += kl;
            agree += usize::from(argmax(g) == argmax(w));
            count += 1;
        }
    }
    let layers: Vec<(Comparison, Tolerance)> = layers.into_iter().flatten().collect();
    let limit = kl_limit(dtype);
    let first_overflow = max_activation.iter().position(|a| !a.is_finite());
    let pass = layers.iter().all(|(c, _)| c.pass) && kl_max <= limit && kl_max.is_finite() && first_overflow.is_none();
    Ok(ModelReport {
        layers,
        kl_max,
        kl_mean: kl_sum / count.max(1) as f64,
        top1: (agree, count),
        kl_limit: limit,
        max_activation,
        first_overflow,
        pass,
    })
}

impl ModelReport {
    /// A table: one row per layer (worst stage-local error, its tolerance ratio, the largest
    /// activation), then the logits line.
    pub fn describe(&self, dtype: DType) -> String {
        let mut s = format!(
            "{:>5}  {:>10}  {:>10}  {:>8}  {:>12}  (the {dtype} range ends at {:.4e})\n",
            "layer",
            "max abs",
            "max rel",
            "ratio",
            "max |h|",
            dtype_max(dtype)
        );
        for (i, ((c, _), act)) in self.layers.iter().zip(&self.max_activation).enumerate() {
            s += &format!(
                "{i:>5}  {:>10.3e}  {:>10.3e}  {:>8.3}  {:>12.4e}{}\n",
                c.max_abs,
                c.max_rel,
                c.worst_ratio,
                act,
                if c.pass { "" } else { "  FAIL" }
            );
        }
        if let Some(l) = self.first_overflow {
            s += &format!(
                "layer {l} overflowed {dtype} (its output is not finite); bf16 and f32 have the range for it  FAIL\n"
            );
        }
        s += &format!(
            "logits ({dtype}): KL max {:.3e} (limit {:.1e}), mean {:.3e}; top-1 agrees at {}/{} positions{}\n",
            self.kl_max,
            self.kl_limit,
            self.kl_mean,
            self.top1.0,
            self.top1.1,
            if self.pass { "" } else { "  FAIL" }
        );
        s
    }
}
