//! Run statistics reported with `--json` and in the text summary.

use serde::Serialize;

/// Speed and memory figures of one request.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    /// Prompt tokens processed per second.
    pub prefill_tokens_per_s: f64,
    /// Generated tokens per second.
    pub decode_tokens_per_s: f64,
    /// Peak resident set size of the process, in bytes.
    pub peak_rss_bytes: u64,
    /// GPU buffer bytes allocated.
    pub gpu_bytes: u64,
    /// Expert cache figures (hits, misses, prefetches, bytes read, stall time).
    #[serde(flatten)]
    pub experts: crate::experts::residency::ExpertStats,
}

/// The process's peak resident set size (Linux `VmHWM`; 0 where unavailable).
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
