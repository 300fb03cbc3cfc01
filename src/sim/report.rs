//! Text and JSON renderings of simulation results.

use std::fmt::Write;

use crate::sim::replay::SimResult;

/// `r`'s hit rate as a share of Belady's optimum at the same slot count, when `results` holds a
/// Belady run at that count with a non-zero hit rate.
pub fn vs_belady(results: &[SimResult], r: &SimResult) -> Option<f64> {
    results
        .iter()
        .find(|b| b.policy == "belady" && b.slots == r.slots && b.hit_rate > 0.0)
        .map(|b| r.hit_rate / b.hit_rate)
}

/// A fixed-width table, one row per result.
pub fn results_table(results: &[SimResult]) -> String {
    let mut out = format!(
        "{:<8} {:<8} {:>7} {:>8} {:>8} {:>10} {:>10} {:>12} {:>9} {:>9} {:>9}\n",
        "policy",
        "prefetch",
        "slots",
        "hit rate",
        "÷ belady",
        "hits",
        "misses",
        "MiB read",
        "pf issued",
        "pf used",
        "pf wasted"
    );
    for r in results {
        let ratio = vs_belady(results, r).map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
        let _ = writeln!(
            out,
            "{:<8} {:<8} {:>7} {:>7.2}% {:>8} {:>10} {:>10} {:>12.1} {:>9} {:>9} {:>9}",
            r.policy,
            r.prefetch,
            r.slots,
            100.0 * r.hit_rate,
            ratio,
            r.hits,
            r.misses,
            r.bytes_read as f64 / (1024.0 * 1024.0),
            r.prefetch_issued,
            r.prefetch_used,
            r.prefetch_wasted
        );
    }
    out
}

/// `{"results":[...]}`, pretty-printed; each result also carries `vs_belady` (its hit rate ÷
/// Belady's at the same slots, or null).
pub fn results_json(results: &[SimResult]) -> String {
    let rows: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).expect("results serialise");
            v["vs_belady"] = serde_json::json!(vs_belady(results, r));
            v
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({ "results": rows })).expect("results serialise")
}
