//! Dense matrix-vector products (`nn.Linear` without and with bias).

/// Dot product of two equal-length slices, accumulated in eight independent f32 lanes (so the
/// compiler vectorises it) and summed at the end.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `out = W x` with `W` row-major `[rows, cols]`, `x` of length `cols`, `out` of length `rows`
/// (PyTorch's `F.linear(x, W)`).
pub fn matvec(w: &[f32], rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
    assert_eq!(w.len(), rows * cols, "matvec: weight is not [rows, cols]");
    assert_eq!(x.len(), cols, "matvec: input length != cols");
    assert_eq!(out.len(), rows, "matvec: output length != rows");
    if cols == 0 {
        out.fill(0.0);
        return;
    }
    for (o, row) in out.iter_mut().zip(w.chunks_exact(cols)) {
        *o = dot(row, x);
    }
}

/// Adds `bias` to `out` element-wise (the bias half of `F.linear(x, W, b)`).
pub fn add_bias(out: &mut [f32], bias: &[f32]) {
    assert_eq!(out.len(), bias.len(), "add_bias: length mismatch");
    for (o, b) in out.iter_mut().zip(bias) {
        *o += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matvec_small() {
        // [[1,2,3],[4,5,6]] · [1,0,-1] = [-2,-2]
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut out = [0.0; 2];
        matvec(&w, 2, 3, &[1.0, 0.0, -1.0], &mut out);
        assert_eq!(out, [-2.0, -2.0]);
        add_bias(&mut out, &[0.5, 1.0]);
        assert_eq!(out, [-1.5, -1.0]);
    }

    #[test]
    fn dot_odd_length_matches_naive() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let naive: f64 = a.iter().zip(&b).map(|(x, y)| (*x as f64) * (*y as f64)).sum();
        assert!((dot(&a, &b) as f64 - naive).abs() < 1e-5);
    }
}
