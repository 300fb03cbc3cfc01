//! The expert-streaming sweep: the same multi-request workload fully resident, then with a
//! fresh engine for every expert budget × eviction policy × prefetcher, checking that every
//! configuration generates exactly the resident tokens. Every measured engine is freshly
//! loaded and starts cold (only the pipelines are compiled beforehand, by a warm-up engine),
//! so the resident baseline and the streaming runs pay the same first-request costs.

use std::sync::Arc;

use serde::Serialize;

use super::workload::requests;
use crate::error::{Error, Result};
use crate::experts::policy::PolicyKind;
use crate::experts::predictor::PrefetchKind;
use crate::gpu::Gpu;
use crate::model::ArchSpec;
use crate::runtime::{EngineOptions, ExpertBudget, GenerateOptions, Generation, SamplingParams};
use crate::Engine;

/// What to sweep.
#[derive(Clone, Debug)]
pub struct StreamingBenchOptions {
    /// Model, formats, adapter and I/O settings; budget, policy and prefetch are overridden.
    pub base: EngineOptions,
    /// Expert budgets in percent of all routed experts (at least one layer's top-k slots).
    pub budgets_pct: Vec<f64>,
    /// Eviction policies.
    pub policies: Vec<PolicyKind>,
    /// Prefetchers.
    pub prefetch: Vec<PrefetchKind>,
    /// Requests in the workload.
    pub requests: usize,
    /// Prompt tokens per request.
    pub prompt_tokens: usize,
    /// Tokens generated per request (greedy, end-of-sequence ignored).
    pub decode_tokens: usize,
    /// Seed of random prompts (used when the model has no `validation.txt` and tokenizer).
    pub seed: u64,
}

/// Throughput of the fully resident run.
#[derive(Clone, Debug, Serialize)]
pub struct ResidentReport {
    /// Expert slots, i.e. all routed experts.
    pub slots: usize,
    /// Prompt tokens per second over all requests.
    pub prefill_tokens_per_s: f64,
    /// Generated tokens per second over all requests.
    pub decode_tokens_per_s: f64,
}

/// One configuration of the sweep.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Budget asked for, in percent of all routed experts.
    pub budget_pct: f64,
    /// Expert slots that budget gives.
    pub slots: usize,
    /// Eviction policy.
    pub policy: String,
    /// Prefetcher.
    pub prefetch: String,
    /// Needs found in a slot over needs.
    pub hit_rate: f64,
    /// Needs found in a slot.
    pub expert_hits: u64,
    /// Needs that had to be loaded.
    pub expert_misses: u64,
    /// Experts prefetched.
    pub prefetch_issued: u64,
    /// Prefetched experts then used.
    pub prefetch_used: u64,
    /// Bytes read from the expert source.
    pub bytes_read: u64,
    /// Milliseconds the GPU pipeline waited for expert data.
    pub stall_ms: f64,
    /// Decode steps run optimistically in one submission and kept
    /// ([`crate::decoder::OptimisticSteps`]).
    pub optimistic_steps: u64,
    /// Optimistic steps run again layer by layer.
    pub optimistic_discarded: u64,
    /// Prompt tokens per second over all requests.
    pub prefill_tokens_per_s: f64,
    /// Generated tokens per second over all requests.
    pub decode_tokens_per_s: f64,
    /// `decode_tokens_per_s` over the resident run's.
    pub vs_resident: f64,
}

/// The sweep's results.
#[derive(Clone, Debug, Serialize)]
pub struct StreamingReport {
    /// Adapter name.
    pub adapter: String,
    /// Model directory.
    pub model: String,
    /// Where the prompts came from.
    pub workload: String,
    /// Expert routing of decode steps (`native` or `predicted`), in every run.
    pub routing: String,
    /// Requests run per configuration.
    pub requests: usize,
    /// Prompt tokens per request.
    pub prompt_tokens: usize,
    /// Tokens generated per request.
    pub decode_tokens: usize,
    /// Routed experts in all layers.
    pub total_experts: usize,
    /// The fully resident baseline.
    pub resident: ResidentReport,
    /// Every streaming configuration, in sweep order.
    pub runs: Vec<RunReport>,
}

/// Generations of one engine over the workload, with aggregate speeds.
struct Pass {
    tokens: Vec<Vec<u32>>,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
}

/// Runs every prompt on `engine`, in order.
fn run_requests(engine: &Engine, prompts: &[Vec<u32>], decode_tokens: usize) -> Result<Pass> {
    let options = GenerateOptions {
        max_tokens: decode_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..Default::default()
    };
    let (mut prefill_n, mut prefill_s, mut decode_n, mut decode_s) = (0.0, 0.0, 0.0, 0.0);
    let mut tokens = Vec::new();
    for p in prompts {
        let Generation { tokens: t, stats, .. } = engine.generate(p, &options, |_, _| true)?;
        prefill_n += p.len() as f64;
        prefill_s += p.len() as f64 / stats.prefill_tokens_per_s.max(1e-9);
        let steps = t.len().saturating_sub(1) as f64;
        if steps > 0.0 {
            decode_n += steps;
            decode_s += steps / stats.decode_tokens_per_s.max(1e-9);
        }
        tokens.push(t);
    }
    Ok(Pass {
        tokens,
        prefill_tokens_per_s: prefill_n / f64::max(prefill_s, 1e-9),
        decode_tokens_per_s: decode_n / f64::max(decode_s, 1e-9),
    })
}

/// Slots for `pct` percent of `total` experts, at least `top_k`.
pub fn budget_slots(pct: f64, total: usize, top_k: usize) -> usize {
    ((pct / 100.0 * total as f64).round() as usize).clamp(top_k, total)
}

/// Runs the sweep, calling `progress` after each configuration.
pub fn run(o: &StreamingBenchOptions, mut progress: impl FnMut(&RunReport)) -> Result<StreamingReport> {
    if o.requests == 0 || o.prompt_tokens == 0 || o.decode_tokens == 0 {
        return Err(Error::InvalidArgument("bench streaming needs requests, prompt and decode tokens > 0".into()));
    }
    if o.budgets_pct.is_empty() || o.policies.is_empty() || o.prefetch.is_empty() {
        return Err(Error::InvalidArgument("bench streaming needs at least one budget, policy and prefetcher".into()));
    }
    if let Some(p) = o.budgets_pct.iter().find(|p| !(**p > 0.0 && **p <= 100.0)) {
        return Err(Error::InvalidArgument(format!("expert budget {p}% is not in (0, 100]")));
    }
    let spec = ArchSpec::from_dir(&o.base.model_dir)?;
    let moe = spec.moe.as_ref().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{} is a dense model; bench streaming needs experts",
            o.base.model_dir.display()
        ))
    })?;
    let total = spec.moe_layers.iter().filter(|x| **x).count() * moe.num_experts;
    let gpu = Gpu::new(&o.base.gpu)?;
    let engine = |slots, policy, prefetch| {
        let options = EngineOptions { budget: ExpertBudget::Slots(slots), policy, prefetch, ..o.base.clone() };
        Engine::load_on(Arc::clone(&gpu), &options)
    };
    // Throwaway engines (resident and streaming) compile the pipelines, which the shared GPU
    // context caches; then every measured configuration, the baseline too, gets a fresh engine.
    let workload = requests(&engine(total, PolicyKind::Lru, PrefetchKind::None)?, o.requests, o.prompt_tokens, o.seed)?;
    let least = o.budgets_pct.iter().map(|&p| budget_slots(p, total, moe.top_k)).min().unwrap_or(total);
    for slots in [total, least] {
        run_requests(&engine(slots, PolicyKind::Lru, PrefetchKind::None)?, &workload.prompts[..1], 2)?;
    }
    let base = run_requests(&engine(total, PolicyKind::Lru, PrefetchKind::None)?, &workload.prompts, o.decode_tokens)?;
    let report_resident = ResidentReport {
        slots: total,
        prefill_tokens_per_s: base.prefill_tokens_per_s,
        decode_tokens_per_s: base.decode_tokens_per_s,
    };
    let mut runs = Vec::new();
    for &pct in &o.budgets_pct {
        let slots = budget_slots(pct, total, moe.top_k);
        // With every expert resident the policy and prefetcher play no part: run that once.
        let combos: Vec<(PolicyKind, PrefetchKind)> =
            o.policies.iter().flat_map(|&p| o.prefetch.iter().map(move |&q| (p, q))).collect();
        let combos = if slots == total { &combos[..combos.len().min(1)] } else { &combos[..] };
        for &(policy, prefetch) in combos {
            let e = engine(slots, policy, prefetch)?;
            let before = e.expert_stats();
            let pass = run_requests(&e, &workload.prompts, o.decode_tokens)?;
            let s = e.expert_stats().since(&before);
            check_exact(&base.tokens, &pass.tokens, pct, slots, policy, prefetch)?;
            let r = RunReport {
                budget_pct: pct,
                slots,
                policy: if slots == total { "-".into() } else { policy.name().into() },
                prefetch: if slots == total { "-".into() } else { prefetch.name().into() },
                hit_rate: s.hit_rate,
                expert_hits: s.expert_hits,
                expert_misses: s.expert_misses,
                prefetch_issued: s.prefetch_issued,
                prefetch_used: s.prefetch_used,
                bytes_read: s.bytes_read,
                stall_ms: s.stall_ms,
                optimistic_steps: s.optimistic_steps,
                optimistic_discarded: s.optimistic_discarded,
                prefill_tokens_per_s: pass.prefill_tokens_per_s,
                decode_tokens_per_s: pass.decode_tokens_per_s,
                vs_resident: pass.decode_tokens_per_s / base.decode_tokens_per_s.max(1e-9),
            };
            progress(&r);
            runs.push(r);
        }
    }
    Ok(StreamingReport {
        adapter: gpu.adapter.name.clone(),
        model: o.base.model_dir.display().to_string(),
        workload: workload.source,
        routing: o.base.routing.to_string(),
        requests: o.requests,
        prompt_tokens: o.prompt_tokens,
        decode_tokens: o.decode_tokens,
        total_experts: total,
        resident: report_resident,
        runs,
    })
}

/// Fails unless a streaming configuration generated exactly the resident tokens.
fn check_exact(
    resident: &[Vec<u32>],
    streamed: &[Vec<u32>],
    pct: f64,
    slots: usize,
    policy: PolicyKind,
    prefetch: PrefetchKind,
) -> Result<()> {
    for (i, (a, b)) in resident.iter().zip(streamed).enumerate() {
        if a != b {
            let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
            return Err(Error::Gpu(format!(
                "bench streaming: with {pct}% of experts ({slots} slots), policy {policy}, prefetch {prefetch}, \
                 request {i} generated other tokens than the resident run (first difference at token {at}: \
                 {:?} vs {:?}); streaming must be exact",
                b.get(at),
                a.get(at)
            )));
        }
    }
    Ok(())
}

impl StreamingReport {
    /// A markdown table of the sweep (for a README).
    pub fn markdown(&self) -> String {
        let mut s = String::from(
            "| budget | slots | policy | prefetch | hit rate | MiB read | stall ms | optimistic kept / rerun | decode tok/s | vs resident |\n\
             |---:|---:|---|---|---:|---:|---:|---:|---:|---:|\n",
        );
        s += &format!(
            "| 100% (resident) | {} | - | - | 100.0% | 0.0 | 0 | - | {:.2} | 1.00 |\n",
            self.resident.slots, self.resident.decode_tokens_per_s
        );
        for r in &self.runs {
            s += &format!(
                "| {}% | {} | {} | {} | {:.1}% | {:.1} | {:.0} | {} / {} | {:.2} | {:.2} |\n",
                r.budget_pct,
                r.slots,
                r.policy,
                r.prefetch,
                r.hit_rate * 100.0,
                r.bytes_read as f64 / 1048576.0,
                r.stall_ms,
                r.optimistic_steps,
                r.optimistic_discarded,
                r.decode_tokens_per_s,
                r.vs_resident
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::budget_slots;

    #[test]
    fn budgets_round_and_respect_top_k() {
        assert_eq!(budget_slots(10.0, 128, 2), 13);
        assert_eq!(budget_slots(1.0, 16, 2), 2);
        assert_eq!(budget_slots(100.0, 128, 2), 128);
    }
}
