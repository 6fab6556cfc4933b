//! Reference AdamW step with global-norm clipping and dynamic loss scaling (the spec of
//! kernels/optimizer.cu), in f64: `torch.nn.utils.clip_grad_norm_` then `torch.optim.AdamW`,
//! with `torch.amp.GradScaler`'s unscaling, skip and scale update.

/// AdamW's hyperparameters and the clipping.
#[derive(Clone, Copy, Debug)]
pub struct AdamWSpec {
    /// The moments' decays.
    pub beta1: f64,
    /// See `beta1`.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// `None`: no clipping.
    pub max_norm: Option<f64>,
}

/// One tensor's state.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    /// The parameter.
    pub param: Vec<f64>,
    /// The first moment.
    pub m: Vec<f64>,
    /// The second moment.
    pub v: Vec<f64>,
}

/// What a step found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOutcome {
    /// The global L2 norm of the unscaled gradients.
    pub grad_norm: f64,
    /// A gradient was inf or NaN: nothing was updated.
    pub found_inf: bool,
}

/// One step: `grads[i]` (multiplied by `loss_scale`) of `slots[i]`, `step` the completed steps
/// before this one.
pub fn adamw_step(
    slots: &mut [Slot],
    grads: &[Vec<f64>],
    loss_scale: f64,
    step: u64,
    lr: f64,
    spec: &AdamWSpec,
) -> StepOutcome {
    let sum: f64 = grads.iter().flatten().map(|g| (g / loss_scale) * (g / loss_scale)).sum();
    let grad_norm = sum.sqrt();
    if !grad_norm.is_finite() {
        return StepOutcome { grad_norm, found_inf: true };
    }
    let clip = spec.max_norm.map_or(1.0, |m| (m / (grad_norm + 1e-6)).min(1.0));
    let t = (step + 1) as f64;
    let (bc1, bc2) = (1.0 - spec.beta1.powf(t), 1.0 - spec.beta2.powf(t));
    for (s, g) in slots.iter_mut().zip(grads) {
        for i in 0..s.param.len() {
            let g = g[i] / loss_scale * clip;
            s.param[i] *= 1.0 - lr * spec.weight_decay;
            s.m[i] = spec.beta1 * s.m[i] + (1.0 - spec.beta1) * g;
            s.v[i] = spec.beta2 * s.v[i] + (1.0 - spec.beta2) * g * g;
            s.param[i] -= lr / bc1 * s.m[i] / (s.v[i].sqrt() / bc2.sqrt() + spec.eps);
        }
    }
    StepOutcome { grad_norm, found_inf: false }
}
