//! Capacity specs: `"10%,25%,64"` → slot counts.

/// Parses a comma-separated list of capacities: `N%` is that share of `total_experts` (routed
/// experts over all MoE layers), rounded, and at least `top_k`; a plain `N` is `N` slots (≥ 1).
pub fn parse_capacities(spec: &str, total_experts: usize, top_k: usize) -> crate::Result<Vec<usize>> {
    let bad = |part: &str, why: &str| crate::Error::InvalidArgument(format!("capacity {part:?} in {spec:?}: {why}"));
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim) {
        if let Some(pct) = part.strip_suffix('%') {
            let p: f64 = pct.trim().parse().map_err(|_| bad(part, "expected a percentage like 10%"))?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(bad(part, "a percentage must be in (0, 100]"));
            }
            let slots = (total_experts as f64 * p / 100.0).round() as usize;
            out.push(slots.max(top_k).max(1));
        } else {
            let n: usize = part.parse().map_err(|_| bad(part, "expected a slot count or a percentage"))?;
            if n == 0 {
                return Err(bad(part, "at least one slot is needed"));
            }
            out.push(n);
        }
    }
    Ok(out)
}
