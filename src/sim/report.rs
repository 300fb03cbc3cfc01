//! Text and JSON renderings of simulation results.

use std::fmt::Write;

use crate::sim::replay::SimResult;

/// A fixed-width table, one row per result.
pub fn results_table(results: &[SimResult]) -> String {
    let mut out = format!(
        "{:<8} {:<8} {:>7} {:>8} {:>10} {:>10} {:>12} {:>9} {:>9} {:>9}\n",
        "policy", "prefetch", "slots", "hit rate", "hits", "misses", "MiB read", "pf issued", "pf used", "pf wasted"
    );
    for r in results {
        let _ = writeln!(
            out,
            "{:<8} {:<8} {:>7} {:>7.2}% {:>10} {:>10} {:>12.1} {:>9} {:>9} {:>9}",
            r.policy,
            r.prefetch,
            r.slots,
            100.0 * r.hit_rate,
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

/// `{"results":[...]}`, pretty-printed.
pub fn results_json(results: &[SimResult]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({ "results": results })).expect("results serialise")
}
