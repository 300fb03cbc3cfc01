//! Attention of one query position over a KV cache: grouped-query heads, and MLA's absorbed
//! form over latent rows.

use super::activation::softmax;
use super::matvec::dot;

/// Head counts and widths of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct HeadShape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (`n_heads` a multiple of it).
    pub n_kv_heads: usize,
    /// Query/key head width.
    pub k_dim: usize,
    /// Value head width.
    pub v_dim: usize,
    /// Logit scale (`1/sqrt(k_dim)` for plain attention).
    pub scale: f32,
    /// Sliding window: only the last `window` positions (the query's own included) are seen;
    /// `None` sees all `kv_len`.
    pub window: Option<usize>,
}

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
    let shape = HeadShape {
        n_heads,
        n_kv_heads,
        k_dim: head_dim,
        v_dim: head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window: None,
    };
    attention_with(q, k_cache, v_cache, shape, kv_len, None, out);
}

/// [`attention`] with key and value widths of their own, a given logit scale and an optional
/// sliding window: `q` is `[n_heads * k_dim]`, `k_cache` `[kv_len, n_kv_heads * k_dim]`,
/// `v_cache` `[kv_len, n_kv_heads * v_dim]`, `out` `[n_heads * v_dim]`. With a window only
/// positions `kv_len - window .. kv_len` are attended. `sinks` (gpt-oss), one logit per query
/// head, joins each head's softmax as one more score with no value, as transformers
/// concatenates it to the scores and drops its column after the softmax.
pub fn attention_with(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    s: HeadShape,
    kv_len: usize,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let (kd, vd) = (s.n_kv_heads * s.k_dim, s.n_kv_heads * s.v_dim);
    assert!(s.n_kv_heads > 0 && s.n_heads.is_multiple_of(s.n_kv_heads), "attention: heads not a multiple of kv heads");
    assert_eq!(q.len(), s.n_heads * s.k_dim, "attention: q length");
    assert_eq!(out.len(), s.n_heads * s.v_dim, "attention: out length");
    assert!(k_cache.len() >= kv_len * kd && v_cache.len() >= kv_len * vd, "attention: cache too short");
    assert!(sinks.is_none_or(|x| x.len() == s.n_heads), "attention: one sink per head");
    let group = s.n_heads / s.n_kv_heads;
    let first = s.window.map_or(0, |w| kv_len.saturating_sub(w));
    let n = kv_len - first;
    let mut scores = vec![0.0f32; n + usize::from(sinks.is_some())];
    for h in 0..s.n_heads {
        let kvh = h / group;
        let qh = &q[h * s.k_dim..(h + 1) * s.k_dim];
        for (t, sc) in (first..).zip(scores.iter_mut().take(n)) {
            let k = &k_cache[t * kd + kvh * s.k_dim..t * kd + (kvh + 1) * s.k_dim];
            *sc = dot(qh, k) * s.scale;
        }
        if let Some(sinks) = sinks {
            scores[n] = sinks[h];
        }
        softmax(&mut scores);
        let oh = &mut out[h * s.v_dim..(h + 1) * s.v_dim];
        oh.fill(0.0);
        for (t, &p) in (first..).zip(&scores[..n]) {
            let v = &v_cache[t * vd + kvh * s.v_dim..t * vd + (kvh + 1) * s.v_dim];
            for (o, &vv) in oh.iter_mut().zip(v) {
                *o += p * vv;
            }
        }
    }
}

/// MLA's shapes for [`mla_absorbed`].
#[derive(Clone, Copy, Debug)]
pub struct MlaShape {
    /// Query heads.
    pub n_heads: usize,
    /// Latent width (`kv_lora_rank`).
    pub rank: usize,
    /// Per-head key width without position.
    pub nope: usize,
    /// Rotary key width (shared by all heads).
    pub rope: usize,
    /// Per-head value width.
    pub v: usize,
    /// Logit scale.
    pub scale: f32,
}

/// MLA decode in the absorbed form, reading only latent rows: for each head, the query's
/// position-free part is folded through its W_UK block (`q_lat = W_UKᵀ q_nope`), scores are
/// `(q_lat · c_t + q_rope · k_rope_t) * scale`, the softmax-weighted latent sum goes through W_UV.
///
/// `q` is `[n_heads, nope + rope]` (rotary part already rotated), `c` `[kv_len, rank]`
/// (normalised latents), `k_rope` `[kv_len, rope]` (the rotated shared keys), `kv_b`
/// `[n_heads * (nope + v), rank]` (per head W_UK rows then W_UV rows); `out` is `[n_heads * v]`.
pub fn mla_absorbed(q: &[f32], c: &[f32], k_rope: &[f32], kv_b: &[f32], s: MlaShape, kv_len: usize, out: &mut [f32]) {
    let (qk, blk) = (s.nope + s.rope, s.nope + s.v);
    assert_eq!(q.len(), s.n_heads * qk, "mla_absorbed: q length");
    assert!(c.len() >= kv_len * s.rank && k_rope.len() >= kv_len * s.rope, "mla_absorbed: latents too short");
    assert_eq!(kv_b.len(), s.n_heads * blk * s.rank, "mla_absorbed: kv_b shape");
    assert_eq!(out.len(), s.n_heads * s.v, "mla_absorbed: out length");
    let mut scores = vec![0.0f32; kv_len];
    for h in 0..s.n_heads {
        let (q_nope, q_rope) = q[h * qk..(h + 1) * qk].split_at(s.nope);
        let w = &kv_b[h * blk * s.rank..(h + 1) * blk * s.rank];
        let mut q_lat = vec![0.0f32; s.rank];
        for (d, &qd) in q_nope.iter().enumerate() {
            for (l, &wv) in q_lat.iter_mut().zip(&w[d * s.rank..(d + 1) * s.rank]) {
                *l += qd * wv;
            }
        }
        for (t, sc) in scores.iter_mut().enumerate() {
            let (ct, kt) = (&c[t * s.rank..(t + 1) * s.rank], &k_rope[t * s.rope..(t + 1) * s.rope]);
            *sc = (dot(&q_lat, ct) + dot(q_rope, kt)) * s.scale;
        }
        softmax(&mut scores);
        let mut o_lat = vec![0.0f32; s.rank];
        for (t, &p) in scores.iter().enumerate() {
            for (o, &ct) in o_lat.iter_mut().zip(&c[t * s.rank..(t + 1) * s.rank]) {
                *o += p * ct;
            }
        }
        for (j, o) in out[h * s.v..(h + 1) * s.v].iter_mut().enumerate() {
            let r = s.nope + j;
            *o = dot(&w[r * s.rank..(r + 1) * s.rank], &o_lat);
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
