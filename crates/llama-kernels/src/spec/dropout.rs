//! Dropout: a probability and the `(seed, stream)` pair that names one reproducible mask
//! ([`crate::reference::dropout::keeps`] states which elements a mask keeps). The same pair
//! regenerates the same mask, so a backward pass never stores it.

use crate::error::{Error, Result};

/// One dropout mask: drop each element with probability `p`, the rest scaled by `1 / (1 - p)`
/// (`torch.nn.functional.dropout` in training mode).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// The drop probability, in `[0, 1)`; `0` keeps every element.
    pub p: f64,
    /// The generator's key (a training run's seed).
    pub seed: u64,
    /// The counter space of this mask: distinct call sites (layers, projections, steps) use
    /// distinct streams under one seed.
    pub stream: u64,
}

impl Dropout {
    /// No dropout: every element kept, scale 1.
    pub const NONE: Dropout = Dropout { p: 0.0, seed: 0, stream: 0 };

    /// Fails unless `p` is in `[0, 1)` (`p = 1` would drop everything and scale by infinity).
    pub fn check(&self, op: &'static str) -> Result<()> {
        if !(self.p.is_finite() && (0.0..1.0).contains(&self.p)) {
            return Err(Error::invalid(op, "dropout p", self.p, "must be in [0, 1)"));
        }
        Ok(())
    }

    /// An element drops when its 32-bit Philox word is below this: `round(p 2^32)`, so it drops
    /// with probability `p` to within `2^-33`.
    pub fn drop_threshold(&self) -> u32 {
        (self.p * 4_294_967_296.0).round().clamp(0.0, f64::from(u32::MAX)) as u32
    }

    /// The factor of a kept element, `1 / (1 - p)`.
    pub fn keep_scale(&self) -> f64 {
        1.0 / (1.0 - self.p)
    }
}
