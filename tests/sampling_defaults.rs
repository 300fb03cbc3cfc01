//! What an engine samples with where the caller names nothing: the model's recommendation
//! (`generation_config.json`, a GGUF's `general.sampling.*` keys) over llama.cpp's defaults,
//! a bad recommended value dropped field by field, `do_sample: false` greedy.

mod common;

use std::path::Path;

use common::{fixtures_dir, gpu, TempDir};
use moestream::runtime::{Engine, EngineOptions, SamplingParams};

fn load(dir: &Path, cache: &Path) -> Engine {
    let mut o = EngineOptions::new(dir);
    o.context = Some(64);
    o.cache_dir = Some(cache.to_path_buf());
    Engine::load_on(gpu(), &o).unwrap()
}

/// A copy of the qwen3_moe fixture with `generation_config` as its generation config (none
/// when `None`).
fn fixture_with(tag: &str, generation_config: Option<serde_json::Value>) -> TempDir {
    let dir = TempDir::new(tag);
    for entry in std::fs::read_dir(fixtures_dir().join("qwen3_moe")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "generation_config.json" {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    if let Some(c) = generation_config {
        std::fs::write(dir.path().join("generation_config.json"), c.to_string()).unwrap();
    }
    dir
}

#[test]
fn the_models_recommendation_lies_over_llama_cpps_defaults() {
    let cache = TempDir::new("sampling_cache");
    let llama = SamplingParams::llama_cpp();

    // The bundled model states llama.cpp's settings itself.
    let bundled = load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe"), cache.path());
    assert_eq!(bundled.sampling_defaults(), llama);
    drop(bundled);

    // `do_sample: false` (the fixture's transformers-written config): the plain argmax, no
    // penalty the model did not state.
    let greedy = load(&fixtures_dir().join("qwen3_moe"), cache.path()).sampling_defaults();
    assert!(greedy.argmax_on_gpu());

    // No file: llama.cpp's.
    let none = fixture_with("sampling_none", None);
    assert_eq!(load(none.path(), cache.path()).sampling_defaults(), llama);

    // Qwen3's published settings; an out-of-range top-p dropped, the rest taken.
    let qwen3 = serde_json::json!({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.0,
                                   "repetition_penalty": 1.05, "eos_token_id": 0});
    let dir = fixture_with("sampling_qwen3", Some(qwen3));
    let d = load(dir.path(), cache.path()).sampling_defaults();
    assert_eq!((d.temperature, d.top_k, d.top_p, d.min_p), (0.6, 20, llama.top_p, llama.min_p));
    assert_eq!(d.penalties.repeat, 1.05);

    // A GGUF's `general.sampling.*` keys (written by make_model.py as llama.cpp names them).
    let gguf = load(&fixtures_dir().join("gguf/qwen3_moe.gguf"), cache.path()).sampling_defaults();
    assert_eq!((gguf.temperature, gguf.top_k, gguf.top_p, gguf.penalties.last_n), (0.6, 20, 0.9, 32));
    assert_eq!((gguf.min_p, gguf.penalties.repeat), (llama.min_p, llama.penalties.repeat));
}
