//! Replaying a trace through the [`CacheModel`] under a policy, capacity and prefetcher.

use serde::Serialize;

use crate::experts::cache_model::{CacheModel, CacheStats, Wave};
use crate::experts::eam::{EamTracker, DEFAULT_MATCHES};
use crate::experts::policy::{Belady, CachePolicy, ExpertId, PolicyKind};
use crate::experts::predictor::{PredictedRouting, PrefetchKind};
use crate::experts::trace::{Trace, TraceEvent};

/// One simulated configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Expert slots.
    pub slots: usize,
    /// Replacement policy.
    pub policy: PolicyKind,
    /// Prefetcher (ignored for Belady, which is demand-only; the prerouter ones replay the
    /// trace's `predicted` lines).
    pub prefetch: PrefetchKind,
    /// EAM collection capacity (for the EAMC policy or prefetcher).
    pub eamc_capacity: usize,
}

/// The outcome of one configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimResult {
    /// Policy name.
    pub policy: String,
    /// Prefetcher name.
    pub prefetch: String,
    /// Expert slots.
    pub slots: usize,
    /// Distinct (layer, expert) needs per step found resident.
    pub hits: u64,
    /// Distinct (layer, expert) needs per step loaded on demand.
    pub misses: u64,
    /// `hits / (hits + misses)`.
    pub hit_rate: f64,
    /// Bytes read from the store: (misses + prefetch loads) × expert bytes.
    pub bytes_read: u64,
    /// Prefetch loads.
    pub prefetch_issued: u64,
    /// Prefetched experts hit before eviction.
    pub prefetch_used: u64,
    /// Prefetched experts never used.
    pub prefetch_wasted: u64,
}

/// Every access the cache makes, in replay order: per step, per routed layer, its distinct
/// experts in ascending order. This is the future Belady's MIN is built from.
pub fn access_sequence(trace: &Trace) -> Vec<ExpertId> {
    let mut out = Vec::new();
    let mut seen = vec![false; trace.header.experts];
    for event in &trace.events {
        let TraceEvent::Step(step) = event else {
            continue;
        };
        for (layer, ids) in &step.layers {
            seen.fill(false);
            for &e in ids {
                seen[e as usize] = true;
            }
            out.extend((0..seen.len()).filter(|&e| seen[e]).map(|e| ExpertId::new(*layer as usize, e)));
        }
    }
    out
}

/// The cache model for `config` (Belady gets its future from `trace`, and no prefetcher); a
/// prerouter prefetcher reads `predicted`.
fn build(trace: &Trace, config: SimConfig, predicted: &PredictedRouting) -> crate::Result<CacheModel> {
    if config.slots == 0 {
        return Err(crate::Error::InvalidArgument("a simulated cache needs at least one slot".into()));
    }
    let h = &trace.header;
    let policy: Box<dyn CachePolicy> = match config.policy {
        PolicyKind::Belady => Box::new(Belady::new(&access_sequence(trace), h.experts)),
        online => online.build(config.slots)?,
    };
    let prefetch = effective_prefetch(config);
    let eamc =
        config.policy == PolicyKind::Eamc || matches!(prefetch, PrefetchKind::Eamc | PrefetchKind::PrerouterEamc);
    let capacity = if eamc { config.eamc_capacity } else { 0 };
    let tracker = EamTracker::new(h.layers, h.experts, capacity, DEFAULT_MATCHES);
    Ok(CacheModel::new(config.slots, h.layers, h.experts, policy, prefetch.build_with(predicted), tracker))
}

fn effective_prefetch(config: SimConfig) -> PrefetchKind {
    match config.policy {
        PolicyKind::Belady => PrefetchKind::None,
        _ => config.prefetch,
    }
}

/// What a replay shows its observer after each routed layer.
pub struct LayerReplayed<'a> {
    /// The cache after the layer's waves and prefetch.
    pub cache: &'a CacheModel,
    /// The layer.
    pub layer: usize,
    /// The layer's residency plans, in order.
    pub waves: &'a [Wave],
    /// The prefetch loads that followed them.
    pub prefetched: &'a [(ExpertId, u32)],
}

/// Replays `trace` as [`simulate`] does, showing `on_layer` every layer's plans (tests check the
/// cache's invariants this way); returns the final stats.
pub fn replay_observed(
    trace: &Trace,
    config: SimConfig,
    on_layer: impl FnMut(LayerReplayed<'_>),
) -> crate::Result<CacheStats> {
    replay_with(trace, config, on_layer, |_| {})
}

/// Replays `trace`; `request_done` sees the cumulative stats after each request.
fn replay(trace: &Trace, config: SimConfig, request_done: impl FnMut(CacheStats)) -> crate::Result<CacheStats> {
    replay_with(trace, config, |_| {}, request_done)
}

fn replay_with(
    trace: &Trace,
    config: SimConfig,
    mut on_layer: impl FnMut(LayerReplayed<'_>),
    mut request_done: impl FnMut(CacheStats),
) -> crate::Result<CacheStats> {
    let predicted = PredictedRouting::default();
    let mut cache = build(trace, config, &predicted)?;
    let replays_predictions = effective_prefetch(config).uses_prerouter();
    let mut open = false;
    for event in &trace.events {
        match event {
            TraceEvent::Request(_) => {
                if open {
                    cache.end_request();
                    request_done(cache.stats());
                }
                cache.begin_request();
                open = true;
            }
            TraceEvent::Step(step) => {
                if !open {
                    cache.begin_request();
                    open = true;
                }
                cache.begin_step(step.phase, step.tokens);
                for (layer, ids) in &step.layers {
                    let layer = *layer as usize;
                    let waves = cache.route(layer, ids);
                    let prefetched = cache.prefetch(layer);
                    on_layer(LayerReplayed { cache: &cache, layer, waves: &waves, prefetched: &prefetched });
                }
            }
            // The recorded run handed the cache this prediction between two steps.
            TraceEvent::Predicted(layers) if replays_predictions => {
                for (layer, ids) in layers {
                    predicted.set(*layer as usize, ids.iter().copied());
                }
                cache.prefetch_next_token();
            }
            TraceEvent::Predicted(_) => {}
        }
    }
    if open {
        cache.end_request();
        request_done(cache.stats());
    }
    Ok(cache.stats())
}

/// Replays `trace` once per policy × capacity (results: policies outer, capacities inner),
/// running configurations on parallel threads.
pub fn simulate(
    trace: &Trace,
    slots: &[usize],
    policies: &[PolicyKind],
    prefetch: PrefetchKind,
    eamc_capacity: usize,
) -> crate::Result<Vec<SimResult>> {
    if prefetch.uses_prerouter() && !trace.events.iter().any(|e| matches!(e, TraceEvent::Predicted(_))) {
        return Err(crate::Error::InvalidArgument(format!(
            "--prefetch {prefetch} replays the prerouter's predictions, and this trace holds none: record it with \
             --prefetch prerouter and --trace (heads attached)"
        )));
    }
    let configs: Vec<SimConfig> = policies
        .iter()
        .flat_map(|&policy| slots.iter().map(move |&s| SimConfig { slots: s, policy, prefetch, eamc_capacity }))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(configs.len()).max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, crate::Result<SimResult>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&config) = configs.get(i) else {
                            return mine;
                        };
                        mine.push((i, run(trace, config)));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("simulation thread panicked")).collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// One configuration's result.
fn run(trace: &Trace, config: SimConfig) -> crate::Result<SimResult> {
    let stats = replay(trace, config, |_| {})?;
    Ok(SimResult {
        policy: config.policy.name().into(),
        prefetch: effective_prefetch(config).name().into(),
        slots: config.slots,
        hits: stats.hits,
        misses: stats.misses,
        hit_rate: stats.hit_rate(),
        bytes_read: stats.loads * trace.header.expert_bytes,
        prefetch_issued: stats.prefetch_issued,
        prefetch_used: stats.prefetch_used,
        prefetch_wasted: stats.prefetch_wasted(),
    })
}

/// Hit rate of each request in turn under `config` (0 for a request without accesses).
pub fn per_request_hit_rates(trace: &Trace, config: SimConfig) -> crate::Result<Vec<f64>> {
    let mut rates = Vec::new();
    let mut before = CacheStats::default();
    replay(trace, config, |now| {
        let hits = now.hits - before.hits;
        let total = hits + now.misses - before.misses;
        rates.push(if total == 0 { 0.0 } else { hits as f64 / total as f64 });
        before = now;
    })?;
    Ok(rates)
}
