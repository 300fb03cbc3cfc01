//! Grouped-query attention of one query position over a KV cache.

use super::activation::softmax;
use super::matvec::dot;

/// Attention of one query row over `kv_len` cached positions.
///
/// `q` is `[n_heads * head_dim]`; `k_cache` and `v_cache` are `[kv_len, n_kv_heads * head_dim]`
/// (row-major, at least `kv_len` rows are read); `out` is `[n_heads * head_dim]`. Query head `h`
/// attends with KV head `h / (n_heads / n_kv_heads)` (GQA); scores are scaled by
/// `1 / sqrt(head_dim)` and softmaxed in f32 over all `kv_len` positions (pass
/// `kv_len = pos + 1` for causal decoding).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    kv_len: usize,
    out: &mut [f32],
) {
    let kv_dim = n_kv_heads * head_dim;
    assert!(n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads), "attention: heads not a multiple of kv heads");
    assert_eq!(q.len(), n_heads * head_dim, "attention: q length");
    assert_eq!(out.len(), n_heads * head_dim, "attention: out length");
    assert!(k_cache.len() >= kv_len * kv_dim && v_cache.len() >= kv_len * kv_dim, "attention: cache too short");
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut scores = vec![0.0f32; kv_len];
    for h in 0..n_heads {
        let kvh = h / group;
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        for (t, s) in scores.iter_mut().enumerate() {
            let k = &k_cache[t * kv_dim + kvh * head_dim..t * kv_dim + (kvh + 1) * head_dim];
            *s = dot(qh, k) * scale;
        }
        softmax(&mut scores);
        let oh = &mut out[h * head_dim..(h + 1) * head_dim];
        oh.fill(0.0);
        for (t, &p) in scores.iter().enumerate() {
            let v = &v_cache[t * kv_dim + kvh * head_dim..t * kv_dim + (kvh + 1) * head_dim];
            for (o, &vv) in oh.iter_mut().zip(v) {
                *o += p * vv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_position_returns_its_value() {
        let q = [0.3f32, -0.2, 0.5, 0.1];
        let k = [1.0f32, 2.0];
        let v = [7.0f32, -3.0];
        let mut out = [0.0; 4];
        attention(&q, &k, &v, 2, 1, 2, 1, &mut out);
        assert_eq!(out, [7.0, -3.0, 7.0, -3.0]);
    }

    #[test]
    fn equal_scores_average_values() {
        let q = [0.0f32, 0.0];
        let k = [1.0f32, 0.0, 0.0, 1.0];
        let v = [2.0f32, 0.0, 0.0, 4.0];
        let mut out = [0.0; 2];
        attention(&q, &k, &v, 1, 1, 2, 2, &mut out);
        assert_eq!(out, [1.0, 2.0]);
    }
}
