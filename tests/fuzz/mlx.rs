//! MLX 4-bit mutants: the `quantization` block of `config.json` (group size, bits, mode: hostile
//! values, wrong types, deleted keys), the rest of `config.json`, and the `model.safetensors`
//! header (its JSON and its bytes) of `tests/fixtures/mlx/olmoe_4bit`, through the engine.

use proptest::prelude::*;
use serde_json::Value;

use crate::common;
use crate::harness::{fuzz, guarded};
use crate::mutate::{apply_json, json_mutations, mutants, mutate_json_text, mutate_safetensors, Mutant};
use crate::{dir_with, load_and_score};

fn fixture() -> std::path::PathBuf {
    common::fixtures_dir().join("mlx/olmoe_4bit")
}

/// `config.json` with mutations applied to its `quantization` block only.
fn mutate_quantization(text: &[u8], m: &[crate::mutate::JsonMutation]) -> Vec<u8> {
    let mut cfg: Value = serde_json::from_slice(text).unwrap();
    let mut q = Value::Object([("quantization".to_string(), cfg["quantization"].take())].into_iter().collect());
    apply_json(&mut q, m);
    match q.get_mut("quantization") {
        Some(v) => cfg["quantization"] = v.take(),
        None => {
            cfg.as_object_mut().unwrap().remove("quantization");
        }
    }
    serde_json::to_vec_pretty(&cfg).unwrap()
}

/// Where an MLX mutant goes.
#[derive(Clone, Debug)]
enum MlxMutant {
    Quantization(Vec<crate::mutate::JsonMutation>),
    Config(Mutant),
    Safetensors(Mutant),
}

#[test]
fn mlx_4bit_directory_through_engine() {
    let config = std::fs::read(fixture().join("config.json")).unwrap();
    let weights = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let strategy = prop_oneof![
        2 => json_mutations().prop_map(MlxMutant::Quantization),
        1 => mutants().prop_map(MlxMutant::Config),
        2 => mutants().prop_map(MlxMutant::Safetensors),
    ];
    fuzz("mlx-olmoe-4bit/engine", 64, strategy, |m| {
        let dir = match &m {
            MlxMutant::Quantization(q) => dir_with(&fixture(), "config.json", &mutate_quantization(&config, q)),
            MlxMutant::Config(c) => dir_with(&fixture(), "config.json", &mutate_json_text(&config, c)),
            MlxMutant::Safetensors(s) => dir_with(&fixture(), "model.safetensors", &mutate_safetensors(&weights, s)),
        };
        guarded(move || load_and_score(dir.path(), |_| {}))
    });
}
