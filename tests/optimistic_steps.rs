//! Optimistic streaming decode steps (a whole token in one submission on the slot table as it
//! stands, checked afterwards, run again layer by layer when a routed expert had no slot):
//! for every MoE fixture family, hybrids included, the logits of every decode step are
//! bit-identical to the fully resident run, both where the steps are kept (a budget of all
//! experts but one) and where most are discarded (one layer's top-k of slots); `Auto` tries
//! them where steps hit (tracing a resident model: the same trace) and not where they miss.

mod common;

use common::{fixtures, gpu, TempDir};
use std::sync::Arc;

use moestream::decoder::{OptimisticSteps, StepOutput, StepResult};
use moestream::experts::policy::{Phase, PolicyKind};
use moestream::experts::predictor::PrefetchKind;
use moestream::gpu::{Gpu, GpuOptions};
use moestream::ops::WeightFormat;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions};

fn engine(dir: &std::path::Path, budget: ExpertBudget, prefetch: PrefetchKind) -> Engine {
    engine_on(gpu(), dir, budget, prefetch)
}

fn engine_on(gpu: Arc<Gpu>, dir: &std::path::Path, budget: ExpertBudget, prefetch: PrefetchKind) -> Engine {
    let mut o = EngineOptions::new(dir).with_format(WeightFormat::F32);
    o.budget = budget;
    o.policy = PolicyKind::Lru;
    o.prefetch = prefetch;
    o.io_threads = 2;
    Engine::load_on(gpu, &o).unwrap()
}

/// The logits of `steps` greedy decode steps after `prompt`, stepping the model directly.
fn decode_logits(e: &Engine, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let m = e.model();
    let cache = m.new_cache().unwrap();
    let StepResult::Token(mut token) = m.step(&cache, prompt, 0, Phase::Prefill, StepOutput::Argmax).unwrap() else {
        panic!("a greedy token")
    };
    let mut all = Vec::new();
    for i in 0..steps {
        let StepResult::Logits(logits) =
            m.step(&cache, &[token], prompt.len() + i, Phase::Decode, StepOutput::Logits).unwrap()
        else {
            panic!("logits")
        };
        token = logits.iter().enumerate().fold(0, |best, (j, &l)| if l > logits[best] { j } else { best }) as u32;
        all.push(logits);
    }
    all
}

#[test]
fn optimistic_steps_match_resident_for_every_family() {
    let mut families = 0;
    for (dir, golden) in fixtures() {
        let spec = moestream::model::ArchSpec::from_dir(&dir).unwrap();
        let Some(moe) = spec.moe.clone() else { continue };
        let total = spec.moe_layers.iter().filter(|m| **m).count() * moe.num_experts;
        let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
        let steps = 10;
        let want = decode_logits(&engine(&dir, ExpertBudget::Auto, PrefetchKind::None), prompt, steps);
        for (slots, prefetch) in
            [(total - 1, PrefetchKind::None), (moe.top_k, PrefetchKind::None), (total / 2, PrefetchKind::Eamc)]
        {
            let e = engine(&dir, ExpertBudget::Slots(slots), prefetch);
            e.model().set_optimistic_steps(OptimisticSteps::Always);
            let got = decode_logits(&e, prompt, steps);
            let what = format!("{} slots={slots} {prefetch:?}", golden.architecture);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g == w, "{what}: decode step {i}'s logits differ from resident");
            }
            let s = e.expert_stats();
            assert_eq!(s.optimistic_steps + s.optimistic_discarded, steps as u64, "{what}: every decode step is tried");
            if slots == total - 1 {
                assert!(s.optimistic_steps > 0, "{what}: no optimistic step was kept ({s})");
            }
            if slots == moe.top_k {
                assert!(s.optimistic_discarded > 0, "{what}: no optimistic step was discarded ({s})");
            }
        }
        families += 1;
    }
    assert!(families >= 8, "only {families} MoE fixtures");
}

#[test]
fn generate_with_optimistic_steps_gives_the_resident_tokens() {
    for name in ["mixtral", "qwen3_5_moe", "deepseek_v3"] {
        let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with(name)).unwrap();
        let p = golden.prompts.iter().find(|p| p.name == "short").unwrap();
        let gen = GenerateOptions { max_tokens: p.greedy.len(), ignore_eos: true, ..Default::default() };
        let top_k = moestream::model::ArchSpec::from_dir(&dir).unwrap().moe.unwrap().top_k;
        for slots in [top_k, top_k + 1] {
            let e = engine(&dir, ExpertBudget::Slots(slots), PrefetchKind::Eamc);
            e.model().set_optimistic_steps(OptimisticSteps::Always);
            let g = e.generate(&p.tokens, &gen, |_, _| true).unwrap();
            assert_eq!(g.tokens, p.greedy, "{name} slots={slots}: optimistic steps vs transformers");
        }
    }
}

#[test]
fn auto_runs_optimistically_where_steps_hit_and_not_where_they_miss() {
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with("mixtral")).unwrap();
    let top_k = moestream::model::ArchSpec::from_dir(&dir).unwrap().moe.unwrap().top_k;
    let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
    let gen = GenerateOptions { max_tokens: 40, ignore_eos: true, ..Default::default() };
    // Tracing a resident model: its routing comes back to the host, and every step hits.
    let tmp = TempDir::new("optimistic-trace");
    let traced = |mode, name: &str| {
        let mut o = EngineOptions::new(&dir).with_format(WeightFormat::F32);
        o.trace = Some(tmp.path().join(name));
        let e = Engine::load_on(gpu(), &o).unwrap();
        assert_eq!(e.model().optimistic_steps(), OptimisticSteps::Auto);
        e.model().set_optimistic_steps(mode);
        let g = e.generate(prompt, &gen, |_, _| true).unwrap();
        drop(e);
        (g.tokens, g.stats.experts, std::fs::read(tmp.path().join(name)).unwrap())
    };
    let (tokens, hits, trace) = traced(OptimisticSteps::Auto, "auto.trace");
    let (layered_tokens, layered, layered_trace) = traced(OptimisticSteps::Never, "layered.trace");
    println!("traced, resident: {hits}");
    // (How many depends on the two ways' measured times; the choice itself is unit-tested.)
    assert!(hits.optimistic_steps >= 1, "{hits}");
    assert_eq!(hits.optimistic_discarded, 0, "{hits}");
    assert_eq!(layered.optimistic_steps + layered.optimistic_discarded, 0, "{layered}");
    assert_eq!(tokens, layered_tokens);
    assert!(trace == layered_trace, "optimistic steps write the trace a layered run writes");
    // One layer's top-k of slots: nearly every step misses, so few are tried.
    let e = engine(&dir, ExpertBudget::Slots(top_k), PrefetchKind::None);
    let misses = e.generate(prompt, &gen, |_, _| true).unwrap().stats.experts;
    println!("top-k slots: {misses}");
    assert!(misses.optimistic_discarded <= 4, "{misses}");
}

#[test]
fn unknown_kernel_settings_in_the_environment_are_refused_by_name() {
    // Read at load; an unknown value is refused by name, not taken for the default.
    let (dir, _) = fixtures().into_iter().find(|(d, _)| d.ends_with("mixtral")).unwrap();
    for (name, value, said) in [
        ("MOESTREAM_OPTIMISTIC_STEPS", "sometimes", "MOESTREAM_OPTIMISTIC_STEPS=sometimes"),
        ("MOESTREAM_CHAINED_DECODE", "yes", "MOESTREAM_CHAINED_DECODE=yes: expected on, off"),
        ("MOESTREAM_DECODE_LAYOUT", "team", "MOESTREAM_DECODE_LAYOUT=team: expected lanes, teams, teams8"),
        ("MOESTREAM_DENSE_PREFILL", "gemm", "MOESTREAM_DENSE_PREFILL=gemm: expected tiled, matvec"),
        ("MOESTREAM_EXPERT_PREFILL", "tiles", "MOESTREAM_EXPERT_PREFILL=tiles: expected pairs, gather"),
        ("MOESTREAM_SHADER_CHECKS", "off", "MOESTREAM_SHADER_CHECKS=off: expected on, auto"),
        ("MOESTREAM_WORDS64", "on", "MOESTREAM_WORDS64=on: expected auto, off"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_moestream"))
            .args(["generate", "--model"])
            .arg(&dir)
            .args(["--tokens", "1,2,3", "--max-tokens", "1"])
            .env(name, value)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{name}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(said), "{err}");
    }
}

#[test]
fn an_optimistic_step_waits_for_the_gpu_once() {
    // Mixtral fixture: 2 MoE layers. Layer by layer, a greedy decode step waits for each
    // layer's routing and for its token; a kept optimistic step for its log alone.
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with("mixtral")).unwrap();
    let spec = moestream::model::ArchSpec::from_dir(&dir).unwrap();
    let moe_layers = spec.moe_layers.iter().filter(|m| **m).count();
    let total = moe_layers * spec.moe.as_ref().unwrap().num_experts;
    let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
    let gen = GenerateOptions { max_tokens: 12, ignore_eos: true, ..Default::default() };
    // A GPU context of its own: the waits counted are those of every engine on the context,
    // and the other tests' run at the same time.
    let own = Gpu::new(&GpuOptions::default()).unwrap();
    let waits = |budget, mode| {
        let e = engine_on(own.clone(), &dir, budget, PrefetchKind::None);
        e.set_chained_decode(false);
        e.model().set_optimistic_steps(mode);
        let g = e.generate(prompt, &gen, |_, _| true).unwrap();
        (g.stats.decode_waits_per_token, g.stats.experts)
    };
    assert_eq!(waits(ExpertBudget::Auto, OptimisticSteps::Auto).0, 1.0, "resident: one wait per token");
    let (layered, _) = waits(ExpertBudget::Slots(total - 1), OptimisticSteps::Never);
    assert_eq!(layered, (1 + moe_layers) as f64);
    let (optimistic, s) = waits(ExpertBudget::Slots(total - 1), OptimisticSteps::Always);
    // Kept: 1 wait; discarded: 1, then the layered rerun's waits after the first miss.
    let steps = (s.optimistic_steps + s.optimistic_discarded) as f64;
    assert!(s.optimistic_steps > 0, "{s}");
    assert!(
        optimistic >= 1.0 && optimistic <= 1.0 + s.optimistic_discarded as f64 * (1 + moe_layers) as f64 / steps,
        "{optimistic}"
    );
    assert!(optimistic < layered, "{optimistic} vs {layered}");
}
