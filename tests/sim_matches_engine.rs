//! The simulator replays the engine's own cache code: on a trace recorded by a streaming run,
//! its hit and miss counts equal the engine's counters for the same policy and budget (on a
//! Qwen3-MoE fixture and on the hybrid linear-attention Qwen3.5-MoE fixture).

mod common;

use common::{fixtures, gpu};
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::experts::trace::Trace;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions};

#[test]
fn simulated_counts_equal_engine_counters() {
    for fixture in ["qwen3_moe", "qwen3_5_moe"] {
        counts_match(fixture);
    }
}

fn counts_match(fixture: &str) {
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with(fixture)).unwrap();
    for (policy, prefetch) in [
        (PolicyKind::Lru, PrefetchKind::None),
        (PolicyKind::Eamc, PrefetchKind::None),
        (PolicyKind::Eamc, PrefetchKind::Eamc),
        (PolicyKind::S3fifo, PrefetchKind::None),
        (PolicyKind::Arc, PrefetchKind::None),
        (PolicyKind::S3fifo, PrefetchKind::Eamc),
    ] {
        let trace =
            std::env::temp_dir().join(format!("moestream-sim-{}-{policy:?}-{prefetch:?}.jsonl", std::process::id()));
        let slots = 5;
        let mut o = EngineOptions::new(&dir);
        o.budget = ExpertBudget::Slots(slots);
        o.policy = policy;
        o.prefetch = prefetch;
        o.trace = Some(trace.clone());
        let engine = Engine::load_on(gpu(), &o).unwrap();
        let gen = GenerateOptions { max_tokens: 12, ignore_eos: true, ..Default::default() };
        for p in &golden.prompts[..3] {
            engine.generate(&p.tokens, &gen, |_, _| true).unwrap();
        }
        let stats = engine.expert_stats();
        drop(engine); // flushes the trace
        let t = Trace::read(&trace).unwrap();
        assert_eq!(t.requests(), 3);
        let sim = moestream::sim::simulate(&t, &[slots], &[policy], prefetch, o.eamc_capacity).unwrap();
        let what = format!("{fixture} {policy:?} {prefetch:?}");
        assert_eq!((sim[0].hits, sim[0].misses), (stats.expert_hits, stats.expert_misses), "{what}");
        assert_eq!(sim[0].prefetch_issued, stats.prefetch_issued, "{what}");
        println!(
            "{fixture} {policy:?}+{prefetch:?}: engine and simulator both {} hits / {} misses",
            stats.expert_hits, stats.expert_misses
        );
        std::fs::remove_file(trace).unwrap();
    }
}
