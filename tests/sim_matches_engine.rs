//! The simulator replays the engine's own cache code: on a trace recorded by a streaming run,
//! its hit and miss counts equal the engine's counters for the same policy and budget (on a
//! Qwen3-MoE fixture and on the hybrid linear-attention Qwen3.5-MoE fixture).

mod common;

use common::{fixtures, gpu};
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::experts::trace::Trace;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions, MtpLoad};

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

/// With MTP drafts, the module's layer's experts go through the slots too: the trace names that
/// layer, and replaying it gives the engine's counts (the bundled model and its MTP module).
#[test]
fn a_trace_with_mtp_drafts_replays_to_the_engine_counters() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe");
    let trace = std::env::temp_dir().join(format!("moestream-sim-mtp-{}.jsonl", std::process::id()));
    let slots = 64;
    let mut o = EngineOptions::new(&dir);
    o.mtp = MtpLoad::Required;
    o.budget = ExpertBudget::Slots(slots);
    o.trace = Some(trace.clone());
    let engine = Engine::load_on(gpu(), &o).unwrap();
    let gen = GenerateOptions { max_tokens: 24, ignore_eos: true, mtp_drafts: 3, ..Default::default() };
    let mut drafted = 0;
    for prompt in ["The history of", "In the morning the"] {
        let tokens = engine.encode(prompt).unwrap();
        drafted += engine.generate(&tokens, &gen, |_, _| true).unwrap().stats.draft_tokens;
    }
    assert!(drafted > 0);
    let stats = engine.expert_stats();
    drop(engine);
    let t = Trace::read(&trace).unwrap();
    assert_eq!((t.header.layers, t.header.moe_layers.len()), (9, 9), "the MTP layer is layer 8");
    let sim = moestream::sim::simulate(&t, &[slots], &[o.policy], o.prefetch, o.eamc_capacity).unwrap();
    assert_eq!((sim[0].hits, sim[0].misses), (stats.expert_hits, stats.expert_misses));
    assert_eq!(sim[0].prefetch_issued, stats.prefetch_issued);
    std::fs::remove_file(trace).unwrap();
}
