//! `bench model`: the report says which weight formats ran, as the engine loaded them (a
//! Hugging Face directory in what was asked for, a converted or GGUF model in its own), and
//! times what it was asked to.

mod common;

use common::TempDir;

use moestream::bench::model::{self, ModelBenchOptions};
use moestream::ops::WeightFormat;
use moestream::runtime::drafts::PromptLookup;
use moestream::runtime::MtpLoad;
use moestream::{Engine, EngineOptions};

fn options() -> ModelBenchOptions {
    ModelBenchOptions {
        prompt_tokens: 6,
        decode_tokens: 3,
        runs: 1,
        seed: 1,
        compare_chained: false,
        compare_optimistic: false,
        drafts: None,
        compare_draft_prefetch: false,
        mtp_drafts: 0,
        temperature: 0.0,
        prompt_repeats: 1,
        prompt_text: None,
    }
}

#[test]
fn the_report_names_the_weight_formats_that_ran() {
    let cache = TempDir::new("bench_model_cache");
    let int4 = WeightFormat::Int4(Default::default());
    let gguf = common::fixtures_dir().join("gguf/qwen3_moe.gguf");
    for (dir, format, dense, experts) in [
        (common::fixtures_dir().join("mixtral"), WeightFormat::F16, "f16", "f16"),
        (common::fixtures_dir().join("mixtral"), int4, "int4-affine-g32", "int4-affine-g32"),
        // GGUF weights run as stored, whatever is asked for (this file's experts are BF16).
        (gguf, WeightFormat::F16, "as stored", "bf16"),
    ] {
        let mut o = EngineOptions::new(&dir);
        (o.experts, o.dense, o.cache_dir) = (format, format, Some(cache.path().to_path_buf()));
        let r = model::run(|| Engine::load(&o), &options()).unwrap();
        assert_eq!((r.weights.dense.as_str(), r.weights.experts.as_str()), (dense, experts), "{dir:?} {format:?}");
        assert_eq!((r.prompt_tokens, r.decode_tokens, r.runs), (6, 3, 1));
        assert!(r.prefill_tokens_per_s > 0.0 && r.decode_tokens_per_s > 0.0, "{r:?}");
    }
}

#[test]
fn drafts_are_compared_with_their_acceptance() {
    // A repeated prompt on the bundled model (its greedy text loops): drafts are proposed and
    // accepted, each verify step gives at least one token, both modes decode the same count.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe");
    let o = ModelBenchOptions {
        decode_tokens: 48,
        runs: 2,
        prompt_repeats: 3,
        drafts: Some(PromptLookup { ngram: 3, max_draft: 4 }),
        ..options()
    };
    // Drafting paced by acceptance only (not by the time steps take): counts that do not
    // depend on the VM's speed.
    let load = || {
        let e = Engine::load(&EngineOptions::new(&dir))?;
        e.set_draft_payoff(false);
        Ok(e)
    };
    let r = model::run(load, &ModelBenchOptions { compare_draft_prefetch: true, ..o.clone() }).unwrap();
    assert!(r.draft_prefetch.is_none(), "every expert resident: nothing to read ahead");
    let d = r.drafts.expect("drafts asked for");
    assert!(d.accepted_draft_tokens > 0 && d.accepted_draft_tokens <= d.draft_tokens, "{d:?}");
    assert!((1.0..=5.0).contains(&d.tokens_per_verify_step), "{d:?}");
    assert_eq!((d.decode.on_runs.len(), d.decode.off_runs.len()), (2, 2));
    assert!(d.decode.on_runs.iter().chain(&d.decode.off_runs).all(|s| *s > 0.0), "{d:?}");
    assert_eq!(d.source, "prompt lookup");
    // Streaming a quarter of the experts: the verify steps' reads ahead against none.
    let streamed = || {
        let mut options = EngineOptions::new(&dir);
        options.budget = moestream::runtime::ExpertBudget::Slots(64);
        let e = Engine::load(&options)?;
        e.set_draft_payoff(false);
        Ok(e)
    };
    let r = model::run(streamed, &ModelBenchOptions { compare_draft_prefetch: true, ..o.clone() }).unwrap();
    let p = r.draft_prefetch.expect("streaming with drafts");
    assert_eq!((p.decode.on_runs.len(), p.decode.off_runs.len()), (2, 2));
    assert!(p.on.prefetch_issued > p.off.prefetch_issued, "{p:?}");
    assert!(p.on.bytes_read_per_token > 0.0 && p.off.misses_per_token > 0.0, "{p:?}");
    let bad = ModelBenchOptions { temperature: f32::NAN, ..o };
    assert!(model::run(|| Engine::load(&EngineOptions::new(&dir)), &bad).is_err());
    // MTP drafts, on a fixture that ships an MTP layer.
    let glm = common::fixtures_dir().join("glm4_moe");
    let mtp = ModelBenchOptions { decode_tokens: 16, runs: 1, mtp_drafts: 2, ..options() };
    let load = || Engine::load(&EngineOptions { mtp: MtpLoad::Required, ..EngineOptions::new(&glm) });
    let d = model::run(load, &mtp).unwrap().drafts.expect("MTP drafts asked for");
    assert_eq!(d.source, "mtp");
    assert!(d.draft_tokens > 0 && d.accepted_draft_tokens <= d.draft_tokens, "{d:?}");
}

/// `bench paths`: each path the default takes on this adapter is compared (both phases, a ratio
/// per run), the others say why not, and an unknown path name is refused by name.
#[test]
fn bench_paths_compares_each_path_the_default_takes() {
    use moestream::bench::paths::{self, PathsBenchOptions};
    let o = EngineOptions::new(common::fixtures_dir().join("qwen3_moe"));
    let mut p = PathsBenchOptions { prompt_tokens: 4, decode_tokens: 2, runs: 2, seed: 1, only: None };
    let r = paths::run(&o, &p).unwrap();
    assert_eq!(r.paths.len(), 9, "{r:?}");
    for c in &r.paths {
        match (&c.prefill, &c.decode, &c.not_compared) {
            (Some(pre), Some(dec), None) => {
                assert_eq!((pre.ratios.len(), dec.ratios.len()), (2, 2), "{c:?}");
                assert!(dec.fast_runs.iter().chain(&dec.plain_runs).all(|s| *s > 0.0), "{c:?}");
            }
            (None, None, Some(why)) => assert!(!why.is_empty()),
            _ => panic!("{c:?}"),
        }
    }
    // Every adapter takes a decode layout and a way to prefill, and the fixture streams.
    for always in ["decode_layout", "dense_prefill", "expert_prefill", "optimistic_steps"] {
        assert!(r.paths.iter().any(|c| c.name == always && c.decode.is_some()), "{always}: {r:?}");
    }
    let mtp = r.paths.iter().find(|c| c.name == "mtp_drafts").unwrap();
    assert!(mtp.not_compared.as_deref().is_some_and(|why| why.contains("no MTP module")), "{mtp:?}");
    // A fixture with an MTP module compares its drafts with one token a step.
    let glm = EngineOptions::new(common::fixtures_dir().join("glm4_moe"));
    let only_mtp = PathsBenchOptions { only: Some(vec!["mtp_drafts".into()]), ..p.clone() };
    let r = paths::run(&glm, &only_mtp).unwrap();
    assert!(r.paths[0].decode.as_ref().is_some_and(|d| d.ratios.len() == 2), "{r:?}");
    p.only = Some(vec!["weight_tiles".into(), "no_such_path".into()]);
    let e = paths::run(&o, &p).unwrap_err().to_string();
    assert!(e.contains("no_such_path") && e.contains("weight_tiles"), "{e}");
}
