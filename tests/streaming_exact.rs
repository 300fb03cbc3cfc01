//! Exactness of expert streaming: with any slot budget (down to one layer's top-k), any
//! policy and any prefetcher, `generate` tokens and `score` log-probs are bit-identical to the
//! fully resident run; on the hybrid fixtures also after a prompt of over 1000 tokens.

mod common;

use common::{fixtures, gpu, gpu_layouts, gpu_layouts_team32};
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::ops::WeightFormat;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions};

fn options(dir: &std::path::Path, budget: ExpertBudget, policy: PolicyKind, prefetch: PrefetchKind) -> EngineOptions {
    let mut o = EngineOptions::new(dir).with_format(WeightFormat::F32);
    o.budget = budget;
    o.policy = policy;
    o.prefetch = prefetch;
    o.io_threads = 2;
    o
}

#[test]
fn every_budget_policy_and_prefetcher_matches_resident() {
    for (dir, golden) in fixtures() {
        let spec = moestream::model::ArchSpec::from_dir(&dir).unwrap();
        let Some(moe) = spec.moe.clone() else { continue };
        let total = spec.moe_layers.iter().filter(|m| **m).count() * moe.num_experts;
        let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
        let gen = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
        let resident =
            Engine::load_on(gpu(), &options(&dir, ExpertBudget::Auto, PolicyKind::Lru, PrefetchKind::None)).unwrap();
        let want_tokens = resident.generate(prompt, &gen, |_, _| true).unwrap().tokens;
        let want_lp = resident.score(prompt).unwrap().logprobs;
        drop(resident);
        let budgets = [moe.top_k, moe.top_k + 1, total / 2, total - 1];
        let mut runs = 0;
        for &slots in &budgets {
            for policy in [PolicyKind::Lru, PolicyKind::Lfu, PolicyKind::Eamc] {
                for prefetch in [PrefetchKind::None, PrefetchKind::Eamc] {
                    let e =
                        Engine::load_on(gpu(), &options(&dir, ExpertBudget::Slots(slots), policy, prefetch)).unwrap();
                    let g = e.generate(prompt, &gen, |_, _| true).unwrap();
                    assert_eq!(g.tokens, want_tokens, "{} slots={slots} {policy:?} {prefetch:?}", golden.architecture);
                    assert!(g.stats.experts.expert_misses > 0, "a budget below all experts must miss");
                    let s = e.score(prompt).unwrap();
                    assert_eq!(s.logprobs, want_lp, "{} slots={slots} {policy:?} {prefetch:?}", golden.architecture);
                    runs += 1;
                }
            }
        }
        println!("{}: {runs} streaming configurations identical to resident", golden.architecture);
    }
}

#[test]
fn hybrid_long_prompt_streams_exactly_at_the_minimum_budget() {
    // The 1100-token golden prompt of each hybrid fixture (prefill chunks over the DeltaNet's
    // or KDA's recurrent state, many expert waves per chunk at one layer's top-k of slots), then
    // decoding: log-probs and tokens bit-identical to resident.
    for fixture in ["qwen3_next", "qwen3_5_moe", "ling"] {
        let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with(fixture)).unwrap();
        let top_k = moestream::model::ArchSpec::from_dir(&dir).unwrap().moe.unwrap().top_k;
        let prompt = &golden.prompts.iter().find(|p| p.name == "long").unwrap().tokens;
        assert!(prompt.len() >= 1000);
        let gen = GenerateOptions { max_tokens: 4, ignore_eos: true, ..Default::default() };
        let run = |budget| {
            let mut o = options(&dir, budget, PolicyKind::Lru, PrefetchKind::None);
            o.context = Some(1200);
            let e = Engine::load_on(gpu(), &o).unwrap();
            (e.score(prompt).unwrap(), e.generate(prompt, &gen, |_, _| true).unwrap())
        };
        let (want_score, want_gen) = run(ExpertBudget::Auto);
        let (score, g) = run(ExpertBudget::Slots(top_k));
        assert!(score.experts.expert_misses > 0);
        assert_eq!(score.logprobs, want_score.logprobs, "{fixture}: streamed long prompt");
        assert_eq!(g.tokens, want_gen.tokens, "{fixture}: streamed decode after the long prompt");
    }
}

#[test]
fn streaming_in_the_gpu_layouts_matches_resident() {
    // The kernel layouts hardware GPUs get (lane teams of 8 and of 32, WIDE int4 loads, gathered
    // expert prefill): the smallest budget streams bit-identically to the resident run there too.
    for (dir, golden) in fixtures() {
        let spec = moestream::model::ArchSpec::from_dir(&dir).unwrap();
        let Some(moe) = spec.moe.clone() else { continue };
        let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
        let gen = GenerateOptions { max_tokens: 6, ignore_eos: true, ..Default::default() };
        // int4 (groups of 32: WIDE loads where rows are 16-byte aligned) and f32 weights.
        let formats = [WeightFormat::Int4(Default::default()), WeightFormat::F32];
        for (format, gpu) in formats.into_iter().flat_map(|f| [(f, gpu_layouts()), (f, gpu_layouts_team32())]) {
            let run = |budget| {
                let o = options(&dir, budget, PolicyKind::Lru, PrefetchKind::Eamc).with_format(format);
                let e = Engine::load_on(gpu.clone(), &o).unwrap();
                (e.generate(prompt, &gen, |_, _| true).unwrap().tokens, e.score(prompt).unwrap().logprobs)
            };
            let resident = run(ExpertBudget::Auto);
            let streamed = run(ExpertBudget::Slots(moe.top_k));
            let team = gpu.caps.decode_team;
            assert_eq!(
                streamed, resident,
                "{} GPU layouts ({team}-lane teams) {format:?}, {} slots",
                golden.architecture, moe.top_k
            );
        }
    }
}

#[test]
fn budget_below_top_k_is_a_clear_error() {
    let (dir, _) = fixtures().into_iter().find(|(d, _)| d.ends_with("mixtral")).unwrap();
    let err = Engine::load_on(gpu(), &options(&dir, ExpertBudget::Slots(1), PolicyKind::Lru, PrefetchKind::None))
        .err()
        .expect("1 slot is below top-2");
    assert!(err.to_string().contains("minimum is 2"), "{err}");
}
