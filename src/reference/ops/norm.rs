//! RMSNorm over one row.

/// RMSNorm of one row, as Hugging Face computes it in f32:
/// `variance = mean(x^2)`, `out = weight * (x * rsqrt(variance + eps))`.
///
/// The mean of squares is accumulated in f64 (at least as accurate as torch's f32 reduction).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    assert_eq!(x.len(), weight.len(), "rms_norm: weight length != row length");
    assert_eq!(x.len(), out.len(), "rms_norm: output length != row length");
    if x.is_empty() {
        return;
    }
    let sum_sq: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let variance = (sum_sq / x.len() as f64) as f32;
    let inv = 1.0 / (variance + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rms_row_is_unchanged_by_unit_weight() {
        let x = [1.0f32, -1.0, 1.0, -1.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        assert_eq!(out, x);
        rms_norm(&x, &[2.0; 4], 0.0, &mut out);
        assert_eq!(out, [2.0, -2.0, 2.0, -2.0]);
    }
}
