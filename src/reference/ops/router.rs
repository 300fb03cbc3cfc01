//! Top-k expert selection from router logits, for every [`RoutingKind`].

use super::activation::{sigmoid, softmax};
use crate::model::{MoeSpec, RoutingKind};

/// The routing of one token as `moe` defines it: `(expert, weight)` pairs, best first.
///
/// Scores are the softmax (or, for [`RoutingKind::SigmoidBiased`], the sigmoid) of the logits.
/// Experts are chosen by score (plus `bias`, the `e_score_correction_bias`, for sigmoid routing)
/// among the best `topk_group` groups: ranked by their best score (`SoftmaxGroupLimited`) or the
/// sum of their two best biased scores (`SigmoidBiased`), ties to the lower index everywhere.
/// The weights are the unbiased scores, renormalised when `norm_topk_prob`, times
/// `routed_scaling_factor` (DeepSeek-V2/V3 and GLM-4.5 in transformers).
pub fn route(logits: &[f32], moe: &MoeSpec, bias: Option<&[f32]>) -> Vec<(usize, f32)> {
    let n = logits.len();
    let mut scores = logits.to_vec();
    let mut choice = match moe.routing {
        RoutingKind::SigmoidBiased { .. } => {
            scores.iter_mut().for_each(|s| *s = sigmoid(*s));
            let bias = bias.expect("sigmoid routing has a correction bias");
            scores.iter().zip(bias).map(|(s, b)| s + b).collect()
        }
        _ => {
            softmax(&mut scores);
            scores.clone()
        }
    };
    let (n_group, topk_group) = moe.routing.groups();
    if n_group > 1 {
        let per = n / n_group;
        let group_score = |g: usize| {
            let mut s: Vec<f32> = choice[g * per..(g + 1) * per].to_vec();
            s.sort_by(|a, b| b.total_cmp(a));
            match moe.routing {
                RoutingKind::SigmoidBiased { .. } => s[0] + s[1],
                _ => s[0],
            }
        };
        let group_scores: Vec<f32> = (0..n_group).map(group_score).collect();
        let kept = top_indices(&group_scores, topk_group);
        for (e, c) in choice.iter_mut().enumerate() {
            if !kept.contains(&(e / per)) {
                *c = f32::NEG_INFINITY;
            }
        }
    }
    let chosen = top_indices(&choice, moe.top_k);
    let mut out = weigh(&scores, &chosen, moe.norm_topk_prob);
    for (_, w) in out.iter_mut() {
        *w *= moe.routed_scaling_factor;
    }
    out
}

/// The indices of the `k` largest values, largest first, ties to the lower index.
fn top_indices(x: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    // Stable sort: equal values keep ascending index order.
    order.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    order.truncate(k);
    order
}

/// Softmax over all expert logits (f32), then the `top_k` largest probabilities, largest
/// first, with ties broken towards the lower expert index; renormalised to sum to one when
/// `norm_topk_prob`. Returns `(expert, weight)` pairs.
///
/// This matches Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE in transformers (Mixtral's
/// softmax→top-k→renormalise equals its top-k→softmax).
pub fn router_topk(logits: &[f32], top_k: usize, norm_topk_prob: bool) -> Vec<(usize, f32)> {
    let mut probs = logits.to_vec();
    softmax(&mut probs);
    let order = top_indices(&probs, top_k);
    weigh(&probs, &order, norm_topk_prob)
}

/// The router's weights for experts chosen elsewhere (the prerouter's prediction-as-routing):
/// each expert's softmax probability over all logits, renormalised over `chosen` when
/// `norm_topk_prob` (then a softmax over the chosen logits alone: the same weights, and no 0/0
/// when every chosen logit is far below the router's best). Returns `(expert, weight)` pairs in
/// the order of `chosen`.
pub fn router_forced(logits: &[f32], chosen: &[usize], norm_topk_prob: bool) -> Vec<(usize, f32)> {
    if norm_topk_prob {
        let mut own: Vec<f32> = chosen.iter().map(|&e| logits[e]).collect();
        softmax(&mut own);
        return chosen.iter().copied().zip(own).collect();
    }
    let mut probs = logits.to_vec();
    softmax(&mut probs);
    weigh(&probs, chosen, norm_topk_prob)
}

fn weigh(probs: &[f32], chosen: &[usize], norm_topk_prob: bool) -> Vec<(usize, f32)> {
    let mut out: Vec<(usize, f32)> = chosen.iter().map(|&e| (e, probs[e])).collect();
    if norm_topk_prob {
        let sum: f32 = out.iter().map(|&(_, w)| w).sum();
        if sum > 0.0 {
            for (_, w) in out.iter_mut() {
                *w /= sum;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_largest_and_renormalises() {
        let r = router_topk(&[0.0, 2.0, 1.0, 2.0], 2, true);
        assert_eq!(r[0].0, 1);
        assert_eq!(r[1].0, 3);
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
    }

    #[test]
    fn unnormalised_weights_are_softmax_probs() {
        let r = router_topk(&[0.0, 0.0], 1, false);
        assert_eq!(r, vec![(0, 0.5)]);
    }
}
