//! Learning-rate schedules, as Hugging Face's `transformers.get_scheduler` defines them: a linear
//! warm-up from 0 over `warmup` steps, then constant, linear decay to 0 at `total`, or a half
//! cosine to 0 at `total`. Step `k` (0-based) is the `k`-th optimizer step; with a warm-up, the
//! first step's rate is 0, as in transformers.

/// The shape after the warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Schedule {
    /// `constant_with_warmup` (`constant` with no warm-up).
    Constant,
    /// `linear`: down to 0 at the last step.
    Linear,
    /// `cosine`: half a cosine period down to 0 at the last step.
    #[default]
    Cosine,
}

/// A learning rate for every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    /// The rate after the warm-up.
    pub peak: f32,
    /// Warm-up steps.
    pub warmup: usize,
    /// Steps of the whole run.
    pub total: usize,
    /// The shape after the warm-up.
    pub kind: Schedule,
}

impl LrSchedule {
    /// The rate of optimizer step `step`.
    pub fn lr(&self, step: usize) -> f32 {
        let peak = f64::from(self.peak);
        if step < self.warmup {
            return (peak * step as f64 / self.warmup.max(1) as f64) as f32;
        }
        let progress = (step - self.warmup) as f64 / (self.total.saturating_sub(self.warmup)).max(1) as f64;
        let factor = match self.kind {
            Schedule::Constant => 1.0,
            Schedule::Linear => (1.0 - progress).max(0.0),
            Schedule::Cosine => (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0),
        };
        (peak * factor) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_follow_transformers() {
        let s = |kind| LrSchedule { peak: 1.0, warmup: 2, total: 10, kind };
        // Warm-up: 0, 1/2, then the peak.
        assert_eq!([s(Schedule::Linear).lr(0), s(Schedule::Linear).lr(1), s(Schedule::Linear).lr(2)], [0.0, 0.5, 1.0]);
        assert_eq!(s(Schedule::Constant).lr(9), 1.0);
        assert!((s(Schedule::Linear).lr(6) - 0.5).abs() < 1e-7);
        assert!((s(Schedule::Cosine).lr(6) - 0.5).abs() < 1e-7);
        assert!(s(Schedule::Cosine).lr(10).abs() < 1e-7 && s(Schedule::Linear).lr(12) == 0.0);
        let none = LrSchedule { peak: 2e-4, warmup: 0, total: 1, kind: Schedule::Constant };
        assert_eq!(none.lr(0), 2e-4);
    }
}
