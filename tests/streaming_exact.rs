//! Exactness of expert streaming: with any slot budget (down to one layer's top-k), any
//! policy and any prefetcher, `generate` tokens and `score` log-probs are bit-identical to the
//! fully resident run.

mod common;

use common::{fixtures, gpu};
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
fn budget_below_top_k_is_a_clear_error() {
    let (dir, _) = fixtures().into_iter().find(|(d, _)| d.ends_with("mixtral")).unwrap();
    let err = Engine::load_on(gpu(), &options(&dir, ExpertBudget::Slots(1), PolicyKind::Lru, PrefetchKind::None))
        .err()
        .expect("1 slot is below top-2");
    assert!(err.to_string().contains("minimum is 2"), "{err}");
}
