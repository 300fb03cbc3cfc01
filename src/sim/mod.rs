//! Offline study of routing traces (see [`crate::experts::trace`]): replay a trace through the
//! engine's own [`CacheModel`](crate::experts::cache_model::CacheModel) under any policy and
//! capacity (`moestream simulate`), and summarise expert reuse (`moestream trace-stats`).

pub mod capacity;
pub mod heatmap;
pub mod plot;
pub mod replay;
pub mod report;
pub mod shift;
pub mod stats;
mod svg;

pub use capacity::parse_capacities;
pub use heatmap::heatmap_svg;
pub use plot::plot_svg;
pub use replay::{
    access_sequence, per_request_hit_rates, replay_observed, simulate, LayerReplayed, SimConfig, SimResult,
};
pub use report::{results_json, results_table, vs_belady};
pub use shift::{shift_recovery, workload_shift, ShiftRecovery};
pub use stats::{trace_stats, ReuseHistogram, ReuseStats, TraceStats};
