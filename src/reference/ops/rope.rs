//! Rotary position embedding as a [`RopeSpec`] describes it: partial rotary width, rotate-half
//! or interleaved pairs, scaled frequencies and YaRN's cos/sin factor.

use crate::model::RopeSpec;

/// Rotates `n_heads` consecutive heads of `head_dim` values in `x` to position `pos`.
///
/// The first `spec.rotary_dim` values of each head rotate (the rest pass through). Pair `i`
/// (`spec.pair(i)`: `(i, i + rotary_dim/2)`, or `(2i, 2i+1)` when interleaved) rotates by
/// `angle = pos * inv_freq[i]` (f32): `a' = a cos - b sin`, `b' = b cos + a sin`, with cos and
/// sin times the YaRN attention factor, as transformers applies them.
pub fn rope(x: &mut [f32], n_heads: usize, head_dim: usize, pos: usize, spec: &RopeSpec) {
    assert_eq!(x.len(), n_heads * head_dim, "rope: length != n_heads * head_dim");
    assert!(spec.rotary_dim <= head_dim && spec.rotary_dim.is_multiple_of(2), "rope: rotary_dim");
    let scale = spec.attention_factor();
    let (cos, sin): (Vec<f32>, Vec<f32>) = spec
        .inv_freq()
        .into_iter()
        .map(|f| {
            let angle = (pos as f32 * f) as f64;
            (angle.cos() as f32 * scale, angle.sin() as f32 * scale)
        })
        .unzip();
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..spec.rotary_dim / 2 {
            let (a, b) = spec.pair(i);
            let (x1, x2) = (head[a], head[b]);
            head[a] = x1 * cos[i] - x2 * sin[i];
            head[b] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity() {
        let mut x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let orig = x;
        rope(&mut x, 2, 4, 0, &RopeSpec::plain(10000.0, 4));
        assert_eq!(x, orig);
    }

    #[test]
    fn rotation_preserves_pair_norms_and_angle() {
        // head_dim 2: one pair rotated by pos * 1.0 radians.
        let mut x = [1.0f32, 0.0];
        rope(&mut x, 1, 2, 1, &RopeSpec::plain(10000.0, 2));
        assert!((x[0] - 1.0f32.cos()).abs() < 1e-6);
        assert!((x[1] - 1.0f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn interleaved_equals_half_split_on_permuted_dims_and_partial_passes_through() {
        let x: Vec<f32> = (0..8).map(|i| i as f32 * 0.3 - 1.0).collect();
        let half = RopeSpec::plain(100.0, 4);
        let inter = RopeSpec { interleaved: true, ..half.clone() };
        // Interleaved dims (0,1,2,3) hold half-split dims (0,2,1,3).
        let perm = [0, 2, 1, 3, 4, 5, 6, 7];
        let mut a: Vec<f32> = perm.iter().map(|&p| x[p]).collect();
        let mut b = x.clone();
        rope(&mut a, 1, 8, 5, &inter);
        rope(&mut b, 1, 8, 5, &half);
        for (i, &p) in perm.iter().enumerate() {
            assert!((a[i] - b[p]).abs() < 1e-6);
        }
        assert_eq!(&b[4..], &x[4..]);
    }
}
