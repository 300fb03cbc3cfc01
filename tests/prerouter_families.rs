//! The prerouter on the DeepSeek and GLM families (dense first layer, group-limited softmax and
//! sigmoid + correction-bias routing, shared experts): collection, training, the heads as a
//! prefetch hint (output exact while streaming) and as the routing (prediction-as-routing, where
//! the router's own weights of the predicted experts are used).

mod common;

use std::path::PathBuf;

use common::gpu;
use moestream::bench::workload::SplitMix64;
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::model::decoder::RoutingMode;
use moestream::ops::WeightFormat;
use moestream::prerouter::collect::collect;
use moestream::prerouter::compat::ModelDims;
use moestream::prerouter::dataset::Dataset;
use moestream::prerouter::features::Features;
use moestream::prerouter::heads_file::Heads;
use moestream::prerouter::routers::read_routers;
use moestream::prerouter::train::{train, TrainOptions};
use moestream::runtime::{ExpertBudget, GenerateOptions};
use moestream::{Engine, EngineOptions};

/// A repeating cycle of distinct tokens: the next layer's routing at t+1 is learnable from t.
fn periodic_tokens(n: usize, period: usize, vocab: usize) -> Vec<u32> {
    let mut rng = SplitMix64::new(7);
    let mut cycle: Vec<u32> = (1..vocab as u32).collect();
    for i in (1..cycle.len()).rev() {
        cycle.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    (0..n).map(|i| cycle[i % period]).collect()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("moestream-prerouter-families-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn trained_heads(fixture: &str) -> (EngineOptions, PathBuf, Vec<u32>) {
    let model = common::fixtures_dir().join(fixture);
    let base = EngineOptions::new(&model).with_format(WeightFormat::F32);
    let dir = scratch(fixture);
    let tokens = periodic_tokens(481, 24, 384);
    let engine = Engine::load_on(gpu(), &base).unwrap();
    let meta = collect(&engine, &tokens, &dir, 160).unwrap();
    // The first layer is dense (first_k_dense_replace = 1): the MoE layers are 1 and 2.
    assert_eq!(meta.moe_layers, vec![1, 2], "{fixture}");
    let data = Dataset::open(&dir).unwrap();
    let dims = ModelDims::of(engine.spec()).unwrap();
    let routers = read_routers(&model, &dims, &dir).unwrap();
    let opts =
        TrainOptions { inner: 32, epochs: 30, batch: 16, seed: 3, holdout: 0.2, threads: 2, ..TrainOptions::default() };
    let (heads, report) = train(&data, &routers, &opts).unwrap();
    let l = &report.layers[0];
    eprintln!("{fixture}: {l:?}");
    assert_eq!((l.layer, l.target_layer), (1, 2));
    assert!(l.recall >= 0.9, "{fixture}: trained recall {}", l.recall);
    let file = dir.join("heads.safetensors");
    Heads::new(&dims, Features::EDGE0, 32, heads).save(&file).unwrap();
    (base, file, tokens)
}

#[test]
fn prerouter_collects_trains_and_runs_on_the_new_families() {
    for fixture in ["deepseek_v2", "deepseek_v3", "glm4_moe"] {
        let (base, file, tokens) = trained_heads(fixture);
        let prompt = &tokens[..30];
        let options = GenerateOptions { max_tokens: 16, ignore_eos: true, ..GenerateOptions::default() };
        let resident = Engine::load_on(gpu(), &base).unwrap().generate(prompt, &options, |_, _| true).unwrap();
        // As a prefetch hint through 6 of the 16 slots (prefetches keep one layer's top-k free), output
        // exact.
        let streaming = EngineOptions {
            budget: ExpertBudget::Slots(6),
            policy: PolicyKind::Lru,
            prefetch: PrefetchKind::Prerouter,
            prerouter: Some(file.clone()),
            ..base.clone()
        };
        let streamed = Engine::load_on(gpu(), &streaming).unwrap().generate(prompt, &options, |_, _| true).unwrap();
        assert_eq!(streamed.tokens, resident.tokens, "{fixture}: prerouter prefetch changed the output");
        assert!(streamed.stats.experts.prefetch_issued > 0, "{fixture}: {:?}", streamed.stats.experts);

        // As the routing: the trained head predicts this periodic text (recall ≥ 0.9), so at
        // nearly every token the predicted experts are the native ones, and since the router's
        // own weights of the predicted experts are used (softmax, group-limited or sigmoid with
        // the correction bias, scaled), the log-prob is then the native one.
        let text = &tokens[..40];
        let native = Engine::load_on(gpu(), &base).unwrap().score(text).unwrap();
        let predicted_options =
            EngineOptions { routing: RoutingMode::Predicted, prerouter: Some(file.clone()), ..base.clone() };
        let predicted = Engine::load_on(gpu(), &predicted_options).unwrap().score(text).unwrap();
        let differ = native.logprobs.iter().zip(&predicted.logprobs).filter(|(a, b)| (*a - *b).abs() > 1e-4).count();
        eprintln!("{fixture}: {differ} of {} log-probs differ under predicted routing", text.len() - 1);
        assert!(differ <= 3, "{fixture}: {differ} log-probs differ from native");
        assert!(predicted.logprobs.iter().all(|l| l.is_finite()));
        let streamed_predicted = Engine::load_on(
            gpu(),
            &EngineOptions {
                budget: ExpertBudget::Slots(6),
                policy: PolicyKind::Lru,
                prefetch: PrefetchKind::Prerouter,
                ..predicted_options
            },
        )
        .unwrap()
        .score(text)
        .unwrap();
        assert_eq!(streamed_predicted.logprobs, predicted.logprobs, "{fixture}: streamed predicted == resident");
    }
}
