//! Workload shift (MoE-Infinity Table 3): how fast a policy recovers after the task changes.

use serde::Serialize;

use crate::experts::trace::Trace;
use crate::sim::replay::{per_request_hit_rates, SimConfig};

/// Recovery after a workload shift.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ShiftRecovery {
    /// Mean per-request hit rate over the last half of the new task's requests.
    pub steady_state: f64,
    /// New-task requests served before the hit rate is back within tolerance (`None`: never).
    pub requests: Option<usize>,
}

/// From the per-request hit rates of the requests after a shift: the first `i` such that the mean
/// of `rates[i..i + window]` (clipped at the end) is at least `steady_state · (1 − tolerance)`
/// (MoE-Infinity uses a 5% tolerance). A window of several requests smooths per-request noise.
pub fn shift_recovery(rates: &[f64], tolerance: f64, window: usize) -> ShiftRecovery {
    let tail = &rates[rates.len() / 2..];
    let steady_state = if tail.is_empty() { 0.0 } else { tail.iter().sum::<f64>() / tail.len() as f64 };
    let target = steady_state * (1.0 - tolerance);
    let window = window.max(1);
    let requests = (0..rates.len()).find(|&i| {
        let w = &rates[i..(i + window).min(rates.len())];
        w.iter().sum::<f64>() / w.len() as f64 >= target
    });
    ShiftRecovery { steady_state, requests }
}

/// Replays `trace` (task A for the first `shift_at` requests, then task B) under `config` and
/// measures B's recovery with a 5% tolerance over a window of `window` requests.
pub fn workload_shift(
    trace: &Trace,
    shift_at: usize,
    config: SimConfig,
    window: usize,
) -> crate::Result<ShiftRecovery> {
    let rates = per_request_hit_rates(trace, config)?;
    let after = rates.get(shift_at..).ok_or_else(|| {
        crate::Error::InvalidArgument(format!(
            "shift at request {shift_at}, but the trace has {} requests",
            rates.len()
        ))
    })?;
    Ok(shift_recovery(after, 0.05, window))
}
