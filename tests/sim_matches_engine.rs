//! The simulator replays the engine's own cache code: on a trace recorded by a streaming run,
//! its hit and miss counts equal the engine's counters for the same policy and budget (on a
//! Qwen3-MoE fixture and on the hybrid linear-attention Qwen3.5-MoE fixture), prerouter
//! prefetches replayed from the predictions the trace records included.

mod common;

use common::{fixtures, gpu};
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::experts::trace::{Trace, TraceEvent};
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

/// With the prerouter prefetching (the bundled model's shipped heads), the trace records each
/// prediction handed to the cache; replaying them gives the engine's counts, from a streamed
/// trace and from one recorded with every expert resident.
#[test]
fn a_trace_with_prerouter_predictions_replays_to_the_engine_counters() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe");
    let gen = GenerateOptions { max_tokens: 16, ignore_eos: true, ..Default::default() };
    let run = |o: &EngineOptions| {
        let engine = Engine::load_on(gpu(), o).unwrap();
        for prompt in ["The history of", "In the morning the"] {
            let tokens = engine.encode(prompt).unwrap();
            engine.generate(&tokens, &gen, |_, _| true).unwrap();
        }
        engine.expert_stats()
    };
    let slots = 64;
    let resident_trace = std::env::temp_dir().join(format!("moestream-sim-pr-resident-{}.jsonl", std::process::id()));
    let mut resident = EngineOptions::new(&dir);
    resident.prefetch = PrefetchKind::Prerouter;
    resident.trace = Some(resident_trace.clone());
    run(&resident);
    let from_resident = Trace::read(&resident_trace).unwrap();
    assert!(from_resident.events.iter().any(|e| matches!(e, TraceEvent::Predicted(_))), "predictions recorded");
    for (policy, prefetch) in
        [(PolicyKind::Eamc, PrefetchKind::Prerouter), (PolicyKind::Lru, PrefetchKind::PrerouterEamc)]
    {
        let trace = std::env::temp_dir().join(format!("moestream-sim-pr-{}-{prefetch:?}.jsonl", std::process::id()));
        let o = EngineOptions {
            budget: ExpertBudget::Slots(slots),
            policy,
            prefetch,
            trace: Some(trace.clone()),
            ..EngineOptions::new(&dir)
        };
        let stats = run(&o);
        assert!(stats.prefetch_used > 0, "{stats:?}");
        let streamed = Trace::read(&trace).unwrap();
        for t in [&streamed, &from_resident] {
            let sim = moestream::sim::simulate(t, &[slots], &[policy], prefetch, o.eamc_capacity).unwrap();
            let what = format!("{policy:?}+{prefetch:?}");
            assert_eq!((sim[0].hits, sim[0].misses), (stats.expert_hits, stats.expert_misses), "{what}");
            assert_eq!(
                (sim[0].prefetch_issued, sim[0].prefetch_used),
                (stats.prefetch_issued, stats.prefetch_used),
                "{what}"
            );
        }
        std::fs::remove_file(trace).unwrap();
    }
    // Without recorded predictions there is nothing to replay, and simulate says so.
    let plain = Trace {
        events: from_resident.events.iter().filter(|e| !matches!(e, TraceEvent::Predicted(_))).cloned().collect(),
        ..from_resident.clone()
    };
    let refused = moestream::sim::simulate(&plain, &[slots], &[PolicyKind::Eamc], PrefetchKind::Prerouter, 64);
    assert!(refused.unwrap_err().to_string().contains("holds none"));
    std::fs::remove_file(resident_trace).unwrap();
}
