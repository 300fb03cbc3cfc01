//! Small timing helpers shared by the benchmarks.

/// `runs` of `a` and `b` in turn (a, b, a, b, ...), each one's results in order: two settings
/// compared in one process, where the adapter's speed drifts between processes and spells.
pub(crate) fn in_turn<T>(
    runs: usize,
    mut a: impl FnMut() -> crate::Result<T>,
    mut b: impl FnMut() -> crate::Result<T>,
) -> crate::Result<(Vec<T>, Vec<T>)> {
    let (mut of_a, mut of_b) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        of_a.push(a()?);
        of_b.push(b()?);
    }
    Ok((of_a, of_b))
}

/// The median of `values` (the mean of the middle two for an even count; 0 when empty).
pub(crate) fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
