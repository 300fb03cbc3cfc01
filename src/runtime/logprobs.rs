//! Log-probabilities of generated tokens as the OpenAI API reports them: the chosen token's
//! under the model's distribution (the logits' log-softmax, before penalties, temperature and
//! truncation) and the most likely tokens' with theirs.

use serde::Serialize;

/// Most alternatives a token reports (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One generated token's log-probability and the most likely alternatives'.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprob {
    /// The token.
    pub id: u32,
    /// `log p(id)` under the model's distribution.
    pub logprob: f32,
    /// The most likely tokens, most likely first (ties: lower id first), with their
    /// log-probabilities.
    pub top: Vec<(u32, f32)>,
}

/// `id`'s log-probability in `logits` and the `top` most likely tokens'.
pub fn token_logprob(logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |l: f32| (l as f64 - log_z) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    for (i, &l) in logits.iter().enumerate() {
        if best.len() == top && best.last().is_none_or(|&(_, b)| l <= b) {
            continue;
        }
        let at = best.partition_point(|&(_, b)| b >= l);
        best.insert(at, (i as u32, l));
        best.truncate(top);
    }
    TokenLogprob { id, logprob: lp(logits[id as usize]), top: best.into_iter().map(|(t, l)| (t, lp(l))).collect() }
}

#[cfg(test)]
mod tests {
    use super::token_logprob;

    #[test]
    fn logprobs_are_the_log_softmax_and_the_top_in_order() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let t = token_logprob(&logits, 4, 3);
        assert!((t.logprob as f64 - (0.5 - z.ln())).abs() < 1e-6);
        let ids: Vec<u32> = t.top.iter().map(|x| x.0).collect();
        assert_eq!(ids, vec![1, 3, 0], "ties keep the lower id first");
        assert!((t.top[0].1 as f64 - (3.0 - z.ln())).abs() < 1e-6);
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
        let total: f64 = token_logprob(&logits, 0, 5).top.iter().map(|x| (x.1 as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
