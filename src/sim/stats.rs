//! `trace-stats`: how experts are reused within and across requests (MoE-Infinity §4.1–4.2).
//!
//! * **Coverage** – share of a MoE layer's experts activated at least once, averaged over the
//!   layers a request used; per request (mean) and pooled over all requests. MoE-Infinity's
//!   observation is a small per-request share and a large pooled one.
//! * **Gini** – skew of a layer's activation counts (0 uniform, → 1 concentrated), averaged over
//!   layers; per request (mean) and pooled.
//! * **Working set** – distinct (layer, expert) pairs a request activates.
//! * **Reuse distance** – LRU stack distance over the access sequence of
//!   [`access_sequence`]: distinct other experts accessed since an expert's previous access
//!   (an LRU cache of `C` slots hits roughly when it is below `C`), histogrammed in powers of two.
//!
//! Prefill and decode are reported separately: a long prompt touches most experts, while decode
//! reuse is what a cache lives on.

use std::fmt::Write;

use serde::Serialize;

use crate::experts::policy::Phase;
use crate::experts::trace::{Trace, TraceEvent};
use crate::sim::replay::access_sequence;

/// Reuse figures of one phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReuseStats {
    /// Requests with activations in this phase.
    pub requests: usize,
    /// Mean over requests of the share of a layer's experts the request activates.
    pub mean_request_coverage: f64,
    /// The same share with all requests pooled.
    pub pooled_coverage: f64,
    /// Mean over requests of the per-layer Gini coefficient of activation counts.
    pub mean_request_gini: f64,
    /// The Gini coefficient with all requests pooled.
    pub pooled_gini: f64,
    /// Mean distinct (layer, expert) pairs per request.
    pub mean_working_set: f64,
    /// Smallest per-request working set.
    pub min_working_set: usize,
    /// Largest per-request working set.
    pub max_working_set: usize,
}

/// Histogram of LRU stack distances.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReuseHistogram {
    /// Exclusive upper bound of each bucket: 1, 2, 4, 8, … (bucket 0 holds distance 0).
    pub upper_bounds: Vec<u64>,
    /// Accesses per bucket.
    pub counts: Vec<u64>,
    /// First accesses (no previous use).
    pub cold: u64,
}

/// Everything `trace-stats` reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceStats {
    /// Model layers.
    pub layers: usize,
    /// Experts per MoE layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// MoE layers.
    pub moe_layers: usize,
    /// Requests.
    pub requests: usize,
    /// Steps.
    pub steps: usize,
    /// Prompt tokens.
    pub prefill_tokens: u64,
    /// Generated tokens.
    pub decode_tokens: u64,
    /// Reuse during prefill.
    pub prefill: ReuseStats,
    /// Reuse during decode.
    pub decode: ReuseStats,
    /// LRU stack distances of all accesses.
    pub reuse_distance: ReuseHistogram,
    /// Activation counts (both phases) per MoE layer: (layer, counts per expert).
    #[serde(skip)]
    pub activations: Vec<(u32, Vec<u64>)>,
}

/// Per-phase accumulator.
struct PhaseAcc {
    experts: usize,
    moe_layers: Vec<usize>,
    current: Vec<u64>,
    pooled: Vec<u64>,
    stats: ReuseStats,
    working_sets: Vec<usize>,
}

impl PhaseAcc {
    fn new(layers: usize, experts: usize, moe_layers: Vec<usize>) -> PhaseAcc {
        PhaseAcc {
            experts,
            moe_layers,
            current: vec![0; layers * experts],
            pooled: vec![0; layers * experts],
            stats: ReuseStats::default(),
            working_sets: Vec::new(),
        }
    }

    /// Mean (coverage, Gini) over the MoE layers with activations.
    fn shape(&self, counts: &[u64]) -> (f64, f64) {
        let (mut cov, mut gini, mut n) = (0.0, 0.0, 0);
        for &l in &self.moe_layers {
            let row = &counts[l * self.experts..(l + 1) * self.experts];
            if row.iter().all(|&c| c == 0) {
                continue;
            }
            cov += row.iter().filter(|&&c| c > 0).count() as f64 / self.experts as f64;
            gini += gini_coefficient(row);
            n += 1;
        }
        if n == 0 {
            (0.0, 0.0)
        } else {
            (cov / n as f64, gini / n as f64)
        }
    }

    fn end_request(&mut self) {
        let ws = self.current.iter().filter(|&&c| c > 0).count();
        if ws == 0 {
            return;
        }
        let (cov, gini) = self.shape(&self.current);
        self.stats.mean_request_coverage += cov;
        self.stats.mean_request_gini += gini;
        self.working_sets.push(ws);
        for (p, c) in self.pooled.iter_mut().zip(&mut self.current) {
            *p += std::mem::take(c);
        }
    }

    fn finish(mut self) -> ReuseStats {
        let n = self.working_sets.len();
        let (cov, gini) = self.shape(&self.pooled);
        let s = &mut self.stats;
        s.requests = n;
        s.pooled_coverage = cov;
        s.pooled_gini = gini;
        if n > 0 {
            s.mean_request_coverage /= n as f64;
            s.mean_request_gini /= n as f64;
            s.mean_working_set = self.working_sets.iter().sum::<usize>() as f64 / n as f64;
            s.min_working_set = self.working_sets.iter().copied().min().unwrap_or(0);
            s.max_working_set = self.working_sets.iter().copied().max().unwrap_or(0);
        }
        self.stats
    }
}

/// Gini coefficient of non-negative counts (0 for an all-zero row).
fn gini_coefficient(row: &[u64]) -> f64 {
    let mut x = row.to_vec();
    x.sort_unstable();
    let n = x.len() as f64;
    let total: f64 = x.iter().map(|&v| v as f64).sum();
    if total == 0.0 {
        return 0.0;
    }
    let weighted: f64 = x.iter().enumerate().map(|(i, &v)| (2.0 * i as f64 - n + 1.0) * v as f64).sum();
    weighted / (n * total)
}

/// LRU stack distances of `sequence` (dense ids below `ids`), via a Fenwick tree over time.
fn reuse_distances(sequence: &[usize], ids: usize) -> ReuseHistogram {
    let n = sequence.len();
    let mut tree = vec![0i64; n + 1];
    let add = |tree: &mut Vec<i64>, mut i: usize, v: i64| {
        i += 1;
        while i <= n {
            tree[i] += v;
            i += i & i.wrapping_neg();
        }
    };
    let prefix = |tree: &Vec<i64>, mut i: usize| {
        let mut s = 0;
        while i > 0 {
            s += tree[i];
            i -= i & i.wrapping_neg();
        }
        s
    };
    let mut last = vec![usize::MAX; ids];
    let mut hist = ReuseHistogram::default();
    for (t, &id) in sequence.iter().enumerate() {
        if last[id] == usize::MAX {
            hist.cold += 1;
        } else {
            let p = last[id];
            let d = (prefix(&tree, t) - prefix(&tree, p + 1)) as u64;
            let b = (u64::BITS - d.leading_zeros()) as usize;
            if hist.counts.len() <= b {
                hist.counts.resize(b + 1, 0);
            }
            hist.counts[b] += 1;
            add(&mut tree, p, -1);
        }
        add(&mut tree, t, 1);
        last[id] = t;
    }
    hist.upper_bounds = (0..hist.counts.len()).map(|b| 1u64 << b).collect();
    hist
}

/// Computes the statistics of a trace.
pub fn trace_stats(trace: &Trace) -> TraceStats {
    let h = &trace.header;
    let moe: Vec<usize> = h.moe_layers.iter().map(|&l| l as usize).collect();
    let mut prefill = PhaseAcc::new(h.layers, h.experts, moe.clone());
    let mut decode = PhaseAcc::new(h.layers, h.experts, moe);
    let (mut requests, mut steps, mut prefill_tokens, mut decode_tokens) = (0, 0, 0, 0);
    for event in &trace.events {
        match event {
            TraceEvent::Request(_) => {
                if requests > 0 {
                    prefill.end_request();
                    decode.end_request();
                }
                requests += 1;
            }
            TraceEvent::Step(step) => {
                if requests == 0 {
                    requests = 1;
                }
                steps += 1;
                let acc = match step.phase {
                    Phase::Prefill => {
                        prefill_tokens += step.tokens as u64;
                        &mut prefill
                    }
                    Phase::Decode => {
                        decode_tokens += step.tokens as u64;
                        &mut decode
                    }
                };
                for (layer, ids) in &step.layers {
                    for &e in ids {
                        acc.current[*layer as usize * h.experts + e as usize] += 1;
                    }
                }
            }
            // Routing statistics count what tokens routed to, not what was predicted.
            TraceEvent::Predicted(_) => {}
        }
    }
    prefill.end_request();
    decode.end_request();
    let activations = h
        .moe_layers
        .iter()
        .map(|&l| {
            let r = l as usize * h.experts..(l as usize + 1) * h.experts;
            let row = prefill.pooled[r.clone()].iter().zip(&decode.pooled[r]).map(|(a, b)| a + b).collect();
            (l, row)
        })
        .collect();
    let sequence: Vec<usize> =
        access_sequence(trace).iter().map(|id| id.layer as usize * h.experts + id.expert as usize).collect();
    TraceStats {
        layers: h.layers,
        experts: h.experts,
        top_k: h.top_k,
        moe_layers: h.moe_layers.len(),
        requests,
        steps,
        prefill_tokens,
        decode_tokens,
        prefill: prefill.finish(),
        decode: decode.finish(),
        reuse_distance: reuse_distances(&sequence, h.layers * h.experts),
        activations,
    }
}

impl TraceStats {
    /// A human-readable summary.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "{} requests, {} steps ({} prompt + {} generated tokens); {} MoE layers × {} experts, top-{}\n",
            self.requests,
            self.steps,
            self.prefill_tokens,
            self.decode_tokens,
            self.moe_layers,
            self.experts,
            self.top_k
        );
        for (name, s) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            let _ = writeln!(
                out,
                "{name:<8} coverage per request {:5.1}% vs pooled {:5.1}%; Gini per request {:.3} vs pooled {:.3}; \
                 working set {:.1} (min {}, max {}) over {} requests",
                100.0 * s.mean_request_coverage,
                100.0 * s.pooled_coverage,
                s.mean_request_gini,
                s.pooled_gini,
                s.mean_working_set,
                s.min_working_set,
                s.max_working_set,
                s.requests
            );
        }
        let h = &self.reuse_distance;
        let total: u64 = h.counts.iter().sum::<u64>() + h.cold;
        let _ = writeln!(out, "reuse distance (LRU stack distance) of {total} accesses:");
        let _ = writeln!(out, "  {:>12} {:>10}", "first use", h.cold);
        let mut lower = 0;
        for (&upper, &count) in h.upper_bounds.iter().zip(&h.counts) {
            let _ = writeln!(out, "  {:>12} {count:>10}", format!("[{lower}, {upper})"));
            lower = upper;
        }
        out
    }

    /// The statistics as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("trace stats serialise")
    }
}
