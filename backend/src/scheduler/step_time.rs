//! A step-time target (`max_step_secs`): each step's token budget sized so the step is expected
//! to finish within it, from a running least-squares fit of step time against the step's
//! tokens (`secs ≈ fixed + per_token · tokens`, older steps weighing less). While a long prompt
//! prefills, the decodes sharing its steps and any request that arrives meanwhile wait at most
//! about one target for the step in flight — the bound Sarathi-Serve sets with its token budget,
//! measured here instead of guessed, so it holds for any model on any device (on the CPU a
//! 2,048-token step of a 135M model takes seconds).

/// How much each recorded step's weight decays per later step.
const DECAY: f64 = 0.95;
/// Steps recorded before the fit is used.
const MIN_STEPS: f64 = 4.0;

#[derive(Debug, Clone, Default)]
pub struct StepTimeFit {
    /// Decayed sums: weight, tokens, seconds, tokens², tokens · seconds.
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    steps: f64,
}

impl StepTimeFit {
    /// Records a step of `tokens` scheduled tokens that took `secs`.
    pub fn record(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || !secs.is_finite() || secs < 0.0 {
            return;
        }
        let x = tokens as f64;
        for s in [
            &mut self.w,
            &mut self.x,
            &mut self.y,
            &mut self.xx,
            &mut self.xy,
        ] {
            *s *= DECAY;
        }
        self.w += 1.0;
        self.x += x;
        self.y += secs;
        self.xx += x * x;
        self.xy += x * secs;
        self.steps += 1.0;
    }

    /// (fixed seconds, seconds per token) of a step, once enough steps were seen. Where the
    /// recorded steps are all about one size (decodes only) the fixed part cannot be told
    /// apart, and all of the time is charged per token — more than a prompt token costs, so the
    /// budget errs short.
    pub fn model(&self) -> Option<(f64, f64)> {
        if self.steps < MIN_STEPS || self.w <= 0.0 {
            return None;
        }
        let (mx, my) = (self.x / self.w, self.y / self.w);
        let var = self.xx / self.w - mx * mx;
        let cov = self.xy / self.w - mx * my;
        if var > 0.01 * mx * mx {
            let slope = cov / var;
            let fixed = my - slope * mx;
            if slope > 0.0 && fixed >= 0.0 {
                return Some((fixed, slope));
            }
        }
        (mx > 0.0 && my > 0.0).then(|| (0.0, my / mx))
    }

    /// Tokens a step may hold to finish within `target` seconds, if the fit knows.
    pub fn budget(&self, target: f64) -> Option<usize> {
        let (fixed, per_token) = self.model()?;
        // (A hair over, so that a budget the fit puts at a whole number of tokens is not one short.)
        Some(((target - fixed).max(0.0) / per_token + 1e-6) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_linear_step_cost_and_sizes_the_budget_from_it() {
        let mut f = StepTimeFit::default();
        assert_eq!(f.budget(0.25), None, "no steps seen");
        // 20 ms a step plus 1 ms a token, steps of 16 to 2,000 tokens.
        for t in [16usize, 2000, 40, 700, 16, 1500, 300, 16] {
            f.record(t, 0.02 + 0.001 * t as f64);
        }
        let (fixed, per) = f.model().unwrap();
        assert!((fixed - 0.02).abs() < 1e-9 && (per - 0.001).abs() < 1e-12);
        assert_eq!(f.budget(0.25), Some(230));
        assert_eq!(
            f.budget(0.01),
            Some(0),
            "a target below the fixed cost allows nothing"
        );
    }

    #[test]
    fn steps_of_one_size_charge_everything_per_token_and_old_steps_fade() {
        let mut f = StepTimeFit::default();
        for _ in 0..10 {
            f.record(16, 0.08);
        }
        // 5 ms a token: 50 tokens in a quarter of a second — fewer than the true cost allows.
        assert_eq!(f.model(), Some((0.0, 0.005)));
        assert_eq!(f.budget(0.25), Some(50));
        // The device got twice as fast: the fit follows within a few dozen steps.
        for t in (0..60).map(|i| 16 + 40 * (i % 8)) {
            f.record(t, 0.01 + 0.0005 * t as f64);
        }
        let (fixed, per) = f.model().unwrap();
        assert!(
            (per - 0.0005).abs() < 1e-4 && (fixed - 0.01).abs() < 0.01,
            "{fixed} {per}"
        );
    }
}
