//! Mixture-of-experts MLPs ([`crate::config::MoeConfig`]): how a token is routed, and the
//! shapes a device's [`super::Device::moe`] works on.
//!
//! Routing is the same on every device and matches transformers' Qwen3-MoE and Mixtral blocks:
//! the router's logits → softmax over every expert (f32) → the `top_k` largest probabilities
//! (ties to the lower expert index) → renormalised to sum to 1 when `norm_topk_prob`. The
//! token's output is Σⱼ wⱼ · downₑ(act(gateₑ·x) · upₑ·x) over its chosen experts eⱼ.

use crate::config::Activation;

/// One mixture-of-experts layer's weights on a device (see [`crate::loader::HostLayer`]).
pub struct MoeWeights<'a, T> {
    /// `[experts, hidden]`
    pub router: &'a T,
    /// `[experts · 2·inter, hidden]`: each expert's gate rows, then its up rows.
    pub gate_up: &'a T,
    /// `[experts · hidden, inter]`
    pub down: &'a T,
}

impl<T> Clone for MoeWeights<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for MoeWeights<'_, T> {}

/// The routing of one layer: how many experts, how many each token takes, their width (on
/// this tensor-parallel rank: its share of every expert's columns) and whether the chosen
/// probabilities are renormalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeParams {
    pub num_experts: usize,
    pub top_k: usize,
    pub inter: usize,
    pub norm_topk_prob: bool,
    pub act: Activation,
}

impl MoeParams {
    /// Whether a layer's weights (`[rows, cols]` each) are this routing's over hidden size `h`:
    /// the router `[E, h]`, gate|up `[E·2·inter, h]`, down `[E·h, inter]`; what is off where
    /// they are not.
    pub fn check_shapes(
        &self,
        h: usize,
        router: (usize, usize),
        gate_up: (usize, usize),
        down: (usize, usize),
    ) -> Result<(), WrongShapes> {
        let (e, i) = (self.num_experts, self.inter);
        if router == (e, h) && gate_up == (e * 2 * i, h) && down == (e * h, i) {
            return Ok(());
        }
        Err(WrongShapes {
            experts: e,
            inter: i,
            hidden: h,
            router,
            gate_up,
            down,
        })
    }
}

/// A mixture-of-experts layer whose weights are not its routing's shapes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{experts} experts of width {inter} over hidden {hidden}: router {}x{}, gate_up {}x{}, down {}x{}", router.0, router.1, gate_up.0, gate_up.1, down.0, down.1)]
pub struct WrongShapes {
    pub experts: usize,
    pub inter: usize,
    pub hidden: usize,
    pub router: (usize, usize),
    pub gate_up: (usize, usize),
    pub down: (usize, usize),
}

/// The experts one token goes to and their weights, largest first: softmax of `logits` (one
/// per expert), its `k` largest (ties to the lower index), renormalised over the k when `norm`.
pub fn route(logits: &[f32], k: usize, norm: bool) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Stable: equal probabilities keep the lower index first.
    order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]));
    let mut chosen: Vec<(usize, f32)> = order
        .into_iter()
        .take(k)
        .map(|e| (e, exp[e] / sum))
        .collect();
    if norm {
        let total: f32 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|c| c.1 /= total);
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn routes_to_the_largest_probabilities_renormalised_or_not() {
        let logits = [0.5f32, 2.0, -1.0, 1.0];
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        let p = |i: usize| logits[i].exp() / z;
        let raw = route(&logits, 2, false);
        assert_eq!(raw.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3]);
        assert!((raw[0].1 - p(1)).abs() < 1e-6 && (raw[1].1 - p(3)).abs() < 1e-6);
        let normed = route(&logits, 2, true);
        let s = p(1) + p(3);
        assert!((normed[0].1 - p(1) / s).abs() < 1e-6);
        assert!((normed[0].1 + normed[1].1 - 1.0).abs() < 1e-6);
        // Ties go to the lower index; k = all experts keeps every one.
        assert_eq!(
            route(&[1.0, 1.0, 1.0], 2, true)
                .iter()
                .map(|c| c.0)
                .collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(route(&logits, 4, false).len(), 4);
    }
}
