//! Rotary position embedding in the Hugging Face "rotate_half" (GPT-NeoX) layout.

/// The RoPE inverse frequencies `1 / theta^(2i / head_dim)` for `i < head_dim / 2`, computed in
/// f32 as transformers does (`1.0 / base ** (arange(0, d, 2).float() / d)`).
pub fn rope_inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
    (0..head_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32)).collect()
}

/// Rotates `n_heads` consecutive heads of `head_dim` values in `x` to position `pos`.
///
/// For `i < half = head_dim / 2`: `angle = pos * inv_freq[i]` (f32),
/// `out[i] = x[i] cos - x[i+half] sin`, `out[i+half] = x[i+half] cos + x[i] sin`.
pub fn rope(x: &mut [f32], n_heads: usize, head_dim: usize, pos: usize, theta: f32) {
    assert_eq!(x.len(), n_heads * head_dim, "rope: length != n_heads * head_dim");
    assert!(head_dim.is_multiple_of(2), "rope: head_dim must be even");
    if head_dim == 0 {
        return;
    }
    let half = head_dim / 2;
    let (cos, sin): (Vec<f32>, Vec<f32>) = rope_inv_freq(head_dim, theta)
        .into_iter()
        .map(|f| {
            let angle = pos as f32 * f;
            (angle.cos(), angle.sin())
        })
        .unzip();
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (x1, x2) = (head[i], head[i + half]);
            head[i] = x1 * cos[i] - x2 * sin[i];
            head[i + half] = x2 * cos[i] + x1 * sin[i];
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
        rope(&mut x, 2, 4, 0, 10000.0);
        assert_eq!(x, orig);
    }

    #[test]
    fn rotation_preserves_pair_norms_and_angle() {
        // head_dim 2: one pair rotated by pos * 1.0 radians.
        let mut x = [1.0f32, 0.0];
        rope(&mut x, 1, 2, 1, 10000.0);
        assert!((x[0] - 1.0f32.cos()).abs() < 1e-6);
        assert!((x[1] - 1.0f32.sin()).abs() < 1e-6);
    }
}
