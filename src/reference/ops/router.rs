//! Top-k expert selection from router logits.

use super::activation::softmax;

/// Softmax over all expert logits (f32), then the `top_k` largest probabilities, largest
/// first, with ties broken towards the lower expert index; renormalised to sum to one when
/// `norm_topk_prob`. Returns `(expert, weight)` pairs.
///
/// This matches Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE in transformers (Mixtral's
/// softmax→top-k→renormalise equals its top-k→softmax).
pub fn router_topk(logits: &[f32], top_k: usize, norm_topk_prob: bool) -> Vec<(usize, f32)> {
    let mut probs = logits.to_vec();
    softmax(&mut probs);
    let mut order: Vec<usize> = (0..probs.len()).collect();
    // Stable sort: equal probabilities keep ascending index order.
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    order.truncate(top_k);
    weigh(&probs, &order, norm_topk_prob)
}

/// The router's weights for experts chosen elsewhere (the prerouter's prediction-as-routing):
/// each expert's softmax probability over all logits, renormalised over `chosen` when
/// `norm_topk_prob`. Returns `(expert, weight)` pairs in the order of `chosen`.
pub fn router_forced(logits: &[f32], chosen: &[usize], norm_topk_prob: bool) -> Vec<(usize, f32)> {
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
