//! LoRA (Hu et al., 2021) as peft defines it: a frozen base `W` plus a rank-`r` update,
//! `y = x Wᵀ + scaling · dropout(x) Aᵀ Bᵀ`, with `A` `[r, in]` and `B` `[out, r]`,
//! `scaling = alpha / r` (rsLoRA: `alpha / sqrt(r)`), and the dropout on the adapter's input only.

use crate::error::{Error, Result};

/// The hyper-parameters of one adapter (peft's `LoraConfig` names).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraConfig {
    /// The rank, > 0.
    pub r: usize,
    /// `lora_alpha`, finite.
    pub alpha: f64,
    /// `lora_dropout`, in `[0, 1)`.
    pub dropout: f64,
    /// `use_rslora`: scale by `alpha / sqrt(r)` instead of `alpha / r`.
    pub rslora: bool,
}

impl LoraConfig {
    /// peft's QLoRA recipe: `r = 16`, `lora_alpha = 32`, `lora_dropout = 0.05`.
    pub const QLORA: LoraConfig = LoraConfig { r: 16, alpha: 32.0, dropout: 0.05, rslora: false };

    /// Fails on `r = 0`, a non-finite `alpha` or a dropout outside `[0, 1)`.
    pub fn check(&self, op: &'static str) -> Result<()> {
        if self.r == 0 {
            return Err(Error::invalid(op, "lora r", self.r, "must be at least 1"));
        }
        if !self.alpha.is_finite() {
            return Err(Error::invalid(op, "lora alpha", self.alpha, "must be finite"));
        }
        if !(self.dropout.is_finite() && (0.0..1.0).contains(&self.dropout)) {
            return Err(Error::invalid(op, "lora dropout", self.dropout, "must be in [0, 1)"));
        }
        Ok(())
    }

    /// The factor of the adapter's output: `alpha / r`, or `alpha / sqrt(r)` with rsLoRA.
    pub fn scaling(&self) -> f64 {
        let r = self.r as f64;
        if self.rslora { self.alpha / r.sqrt() } else { self.alpha / r }
    }

    /// The bound of peft's initialization of `A`, `kaiming_uniform_(a = sqrt(5))` over `in`
    /// inputs: `U(-1/sqrt(in), 1/sqrt(in))` (`B` starts at zero, so the adapter starts as a no-op).
    pub fn a_init_bound(d_in: usize) -> f64 {
        1.0 / (d_in.max(1) as f64).sqrt()
    }
}
