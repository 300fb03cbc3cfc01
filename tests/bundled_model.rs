//! The bundled model (models/moestream-tiny-moe) loads, keeps its validation perplexity within
//! stated bounds in f16 and int4, greedy-decodes the same text as transformers (the sample
//! recorded in its model card), and its shipped prerouter heads reach their stated recall and
//! perplexity cost.

mod common;

use std::path::PathBuf;

use common::gpu;
use moestream::decoder::RoutingMode;
use moestream::experts::predictor::PrefetchKind;
use moestream::ops::WeightFormat;
use moestream::prerouter::heads_file::{Heads, HEADS_FILE};
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions, MtpLoad};

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe")
}

/// The first `n` tokens of the committed validation text.
fn validation_tokens(e: &Engine, n: usize) -> Vec<u32> {
    let text = std::fs::read_to_string(model_dir().join("validation.txt")).unwrap();
    let mut ids = e.encode(&text).unwrap();
    ids.truncate(n);
    ids
}

fn options(format: WeightFormat) -> EngineOptions {
    let mut o = EngineOptions::new(model_dir()).with_format(format);
    o.cache_dir = Some(std::env::temp_dir().join(format!("moestream-bundled-{}", std::process::id())));
    o
}

fn engine(format: WeightFormat) -> Engine {
    Engine::load_on(gpu(), &options(format)).unwrap()
}

#[test]
fn validation_perplexity_within_bounds() {
    // Measured on the first 512 validation tokens: f16 143.54, int4 145.73 (see the model
    // card). The bounds leave 3% for numerical differences across GPUs and drivers.
    for (format, bound) in [(WeightFormat::F16, 148.0), (WeightFormat::Int4(Default::default()), 150.5)] {
        let e = engine(format);
        let s = e.score(&validation_tokens(&e, 512)).unwrap();
        println!("{}: perplexity {:.3} over {} tokens", format.name(), s.perplexity, s.logprobs.len());
        assert!(s.perplexity < bound, "{}: perplexity {} above {bound}", format.name(), s.perplexity);
    }
}

#[test]
fn greedy_text_matches_transformers_sample() {
    let e = engine(WeightFormat::F16);
    let prompt = e.encode("The history of").unwrap();
    let g = e.generate(&prompt, &GenerateOptions { max_tokens: 16, ..Default::default() }, |_, _| true).unwrap();
    // transformers' greedy continuation, from the model card's samples.
    let want = " the Poet, and the Poete of the Poet, the Bible, and the Poet";
    assert!(want.starts_with(g.text.trim_end()) || g.text.starts_with(want), "{:?}", g.text);
}

/// Bound on perplexity with predicted routing over native, first 256 validation tokens (f16):
/// measured 133.99 / 135.37 = 0.990 on lavapipe with the shipped heads (1.056 with the heads
/// before them, which did not read the next token); issue #48's target is 1.03.
const PREDICTED_PPL_RATIO: f64 = 1.03;

#[test]
fn shipped_prerouter_heads() {
    // The training report stored in the heads file (held-out tail of 240k tokens); the heads
    // read the next token's embedding.
    let heads = Heads::load(&model_dir().join(HEADS_FILE)).unwrap();
    assert!(heads.config.features.token);
    let report: serde_json::Value = serde_json::from_str(heads.metrics.as_deref().unwrap()).unwrap();
    let recall = report["mean_recall"].as_f64().unwrap();
    let persistence = report["mean_persistence_recall"].as_f64().unwrap();
    assert!(recall >= 0.8 && recall > persistence + 0.3, "recall {recall}, persistence {persistence}");
    assert_eq!(heads.heads.len(), 7, "a head for every MoE layer but the last");

    // Prediction-as-routing (heads found in the model directory) costs little perplexity.
    let predicted = EngineOptions { routing: RoutingMode::Predicted, ..options(WeightFormat::F16) };
    let native = engine(WeightFormat::F16);
    let tokens = validation_tokens(&native, 256);
    let exact = native.score(&tokens).unwrap().perplexity;
    let routed = Engine::load_on(gpu(), &predicted).unwrap().score(&tokens).unwrap().perplexity;
    println!("perplexity over 256 tokens: native {exact:.3}, predicted routing {routed:.3}");
    assert!(routed / exact < PREDICTED_PPL_RATIO, "ratio {}", routed / exact);

    // Streaming at a 25% budget with the predictions prefetched before each step generates what
    // the resident model generates under the same routing, and the prefetches are used.
    let prompt = native.encode("The history of").unwrap();
    let gen = GenerateOptions { max_tokens: 24, ignore_eos: true, ..Default::default() };
    let resident = Engine::load_on(gpu(), &predicted).unwrap().generate(&prompt, &gen, |_, _| true).unwrap();
    let streaming =
        EngineOptions { budget: ExpertBudget::Slots(64), prefetch: PrefetchKind::Prerouter, ..predicted.clone() };
    let streamed = Engine::load_on(gpu(), &streaming).unwrap().generate(&prompt, &gen, |_, _| true).unwrap();
    assert_eq!(streamed.tokens, resident.tokens);
    let stats = streamed.stats.experts;
    assert!(stats.prefetch_used * 2 > stats.prefetch_issued, "most prefetches used: {stats:?}");
    // Drafts would verify their tokens with native routing, so the output would change: refused.
    let with_mtp = Engine::load_on(gpu(), &EngineOptions { mtp: MtpLoad::Required, ..predicted.clone() }).unwrap();
    let drafted = GenerateOptions { mtp_drafts: 3, ..gen.clone() };
    let refused = with_mtp.generate(&prompt, &drafted, |_, _| true).unwrap_err();
    assert!(refused.to_string().contains("--routing predicted"), "{refused}");
}
