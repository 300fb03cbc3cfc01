//! Hostile input never panics: seeded mutants of every file the engine reads, run through the
//! real entry points (engine load + a short score, `convert`, `simulate`, `prerouter train`).
//! The property: a clean error or a correct run (finite log-probabilities), never a panic (on
//! any thread), abort or hang.
//!
//! Input kinds: `config.json` (Mixtral and Qwen2-MoE, through the engine and `convert`), the
//! `model.safetensors` header, a converted `model.json` and `experts.bin` header, prerouter
//! heads (their config metadata and header), a LoRA adapter (config and header), the EAMC
//! collection file, a routing trace and a prerouter dataset. JSON documents get hostile values
//! (0, ±1, 2^31…2^64−1, floats, null, strings, wrong types, deleted keys); binary headers get
//! bit flips, overwritten bytes and words, and cuts; `experts.bin` fields are also rewritten
//! with their checksums recomputed so the checks behind the checksums are reached.
//!
//! CI runs a few dozen mutants per input kind; `MOESTREAM_FUZZ_LONG=1` runs 50 times as many
//! and `MOESTREAM_FUZZ_CASES=N` exactly N per kind. Mutants that once panicked are kept as
//! named regression tests at the end of this file.

#[path = "../common/mod.rs"]
mod common;
mod gguf;
mod harness;
mod mlx;
mod mutate;
mod templates;
mod tokenizer;
mod weights;

use std::path::{Path, PathBuf};

use common::TempDir;
use harness::{fuzz, guarded, Outcome};
use moestream::convert::{convert, ConvertOptions};
use moestream::decoder::RoutingMode;
use moestream::experts::policy::{Phase, PolicyKind};
use moestream::experts::predictor::PrefetchKind;
use moestream::experts::trace::{Trace, TraceHeader, TraceWriter};
use moestream::prerouter::compat::ModelDims;
use moestream::prerouter::dataset::{Dataset, DatasetMeta, DatasetWriter};
use moestream::prerouter::features::Features;
use moestream::prerouter::head::{Head, HeadDims};
use moestream::prerouter::heads_file::Heads;
use moestream::prerouter::routers::{read_routers, ModelTables};
use moestream::prerouter::train::{train, TrainOptions, TrainedHead};
use moestream::runtime::engine::ExpertBudget;
use moestream::util::rng::SplitMix64;
use moestream::{sim, Engine, EngineOptions};
use mutate::{apply_bytes, mutants, mutate_json_text, mutate_safetensors, Mutant};
use proptest::prelude::*;
use serde_json::{json, Value};

/// The tiny Mixtral checkpoint every kind starts from (hidden 64, 2 layers, 8 experts, top-2).
fn fixture() -> PathBuf {
    common::fixtures_dir().join("mixtral")
}

/// `dst` naming the file `src`: a symbolic link where that needs no privileges, else a copy.
#[cfg(unix)]
fn link_file(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(src, dst)
}

#[cfg(not(unix))]
fn link_file(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::copy(src, dst).map(drop)
}

/// A copy of model directory `src` (files linked) with `name` replaced by `bytes`.
fn dir_with(src: &Path, name: &str, bytes: &[u8]) -> TempDir {
    let dir = TempDir::new("fuzz");
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap();
        if file != name && path.is_file() {
            link_file(&path, &dir.path().join(file)).unwrap();
        }
    }
    std::fs::write(dir.path().join(name), bytes).unwrap();
    dir
}

fn text<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<T, String> {
    r.map_err(|e| e.to_string())
}

/// Loads `dir` (context 16, options as `configure` sets them) and scores four tokens.
fn load_and_score(dir: &Path, configure: impl FnOnce(&mut EngineOptions)) -> Outcome {
    let logprobs = score_of(dir, configure)?;
    match logprobs.iter().all(|l| l.is_finite() && *l <= 1e-4) {
        true => Ok(()),
        false => panic!("a run that succeeds must give log-probabilities, got {logprobs:?}"),
    }
}

/// [`load_and_score`] for mutants of weight data, where any numbers may come out.
fn load_and_score_any(dir: &Path, configure: impl FnOnce(&mut EngineOptions)) -> Outcome {
    score_of(dir, configure).map(|_| ())
}

fn score_of(dir: &Path, configure: impl FnOnce(&mut EngineOptions)) -> Result<Vec<f32>, String> {
    let mut options = EngineOptions::new(dir);
    options.context = Some(16);
    // A GGUF file converts into this cache: beside the mutant, removed with it.
    options.cache_dir = Some(dir.with_file_name(".moestream-cache"));
    configure(&mut options);
    let engine = text(Engine::load_on(common::gpu(), &options))?;
    Ok(text(engine.score(&[1, 2, 3, 4]))?.logprobs)
}

/// A converted (int4) copy of the fixture.
fn converted() -> TempDir {
    let out = TempDir::new("fuzz-converted");
    convert(&fixture(), &out.path().join("m"), &ConvertOptions::default(), &mut |_| {}).unwrap();
    out
}

#[test]
fn config_json_through_engine() {
    let original = std::fs::read(fixture().join("config.json")).unwrap();
    fuzz("config.json/engine", 96, mutants(), |m| {
        let dir = dir_with(&fixture(), "config.json", &mutate_json_text(&original, &m));
        guarded(move || load_and_score(dir.path(), |_| {}))
    });
}

/// `cases` mutants (in CI) of fixture `name`'s `config.json` through the engine.
fn fuzz_config_of(name: &str, cases: u32) {
    let src = common::fixtures_dir().join(name);
    let original = std::fs::read(src.join("config.json")).unwrap();
    fuzz(&format!("config.json/{name}/engine"), cases, mutants(), |m| {
        let dir = dir_with(&src, "config.json", &mutate_json_text(&original, &m));
        guarded(move || load_and_score(dir.path(), |_| {}))
    });
}

#[test]
fn config_json_of_qwen2_moe_through_engine() {
    // Shared experts, sparse steps and dense layers: fields Mixtral has not.
    fuzz_config_of("qwen2_moe", 64);
}

#[test]
fn config_json_of_hybrid_models_through_engine() {
    // Qwen3-Next's `layer_types` / `full_attention_interval`, the `linear_*` DeltaNet sizes,
    // gated attention; Qwen3.5-MoE's `text_config` nesting and `mrope_section`; Ling's KDA
    // gate fields, `mlp_layer_types`, attribute-map aliases and MLA sizes.
    fuzz_config_of("qwen3_next", 32);
    fuzz_config_of("qwen3_5_moe", 32);
    fuzz_config_of("ling", 32);
}

#[test]
fn config_json_with_sliding_windows_through_engine() {
    // Mixtral's `sliding_window`; Qwen2's `use_sliding_window`, `max_window_layers`, `layer_types`.
    fuzz_config_of("mixtral_swa", 32);
    fuzz_config_of("qwen2_swa", 32);
}

#[test]
fn config_json_of_gpt_oss_through_engine() {
    // `layer_types`, sinks, `swiglu_limit`, router and attention biases; the MXFP4 directory's
    // `quantization_config`.
    fuzz_config_of("gpt_oss", 32);
    fuzz_config_of("gpt_oss_mxfp4", 32);
}

#[test]
fn config_json_of_mla_families_through_engine() {
    // MLA sizes, YaRN blocks, group-limited and sigmoid routing, dense-first layers.
    fuzz_config_of("deepseek_v2", 32);
    fuzz_config_of("deepseek_v3", 32);
    fuzz_config_of("glm4_moe", 32);
}

#[test]
fn config_json_through_convert() {
    let original = std::fs::read(fixture().join("config.json")).unwrap();
    fuzz("config.json/convert", 48, mutants(), |m| {
        let dir = dir_with(&fixture(), "config.json", &mutate_json_text(&original, &m));
        guarded(move || {
            let out = TempDir::new("fuzz-convert-out");
            text(convert(dir.path(), &out.path().join("m"), &ConvertOptions::default(), &mut |_| {})).map(|_| ())
        })
    });
}

#[test]
fn safetensors_header_through_engine() {
    let original = std::fs::read(fixture().join("model.safetensors")).unwrap();
    fuzz("model.safetensors/engine", 64, mutants(), |m| {
        let dir = dir_with(&fixture(), "model.safetensors", &mutate_safetensors(&original, &m));
        guarded(move || load_and_score(dir.path(), |_| {}))
    });
}

#[test]
fn model_json_through_engine() {
    let conv = converted();
    let src = conv.path().join("m");
    let original = std::fs::read(src.join("model.json")).unwrap();
    fuzz("model.json/engine", 64, mutants(), |m| {
        let dir = dir_with(&src, "model.json", &mutate_json_text(&original, &m));
        // Streaming, so the I/O pool's threads run too.
        guarded(move || load_and_score(dir.path(), |o| o.budget = ExpertBudget::Slots(4)))
    });
}

/// Offsets of the fixed header's integer fields in `experts.bin` (u32, u64).
const STORE_U32: [usize; 12] = [12, 24, 28, 32, 36, 40, 44, 80, 84, 104, 108, 128];
const STORE_U64: [usize; 9] = [16, 48, 56, 64, 72, 88, 96, 112, 136];

/// A mutant of `experts.bin`: raw header bytes (the checksums catch them), or one field set
/// to a hostile value with both checksums recomputed, so the checks behind them are reached.
#[derive(Clone, Debug)]
enum StoreMutant {
    Raw(Vec<mutate::ByteMutation>),
    Field {
        at: usize,
        wide: bool,
        value: u64,
    },
    Index {
        entry: usize,
        part: usize,
        value: u64,
    },
    /// A GGUF store's type table: one layer's gate/up (`part` 0) or down (1) ggml type.
    Types {
        layer: usize,
        part: usize,
        value: u32,
    },
}

fn store_mutants() -> impl Strategy<Value = StoreMutant> {
    let values = || prop::sample::select(vec![0u64, 1, 7, 4096, 1 << 20, u32::MAX as u64, 1 << 40, u64::MAX]);
    prop_oneof![
        1 => mutate::byte_mutations().prop_map(StoreMutant::Raw),
        2 => (any::<usize>(), any::<bool>(), values()).prop_map(|(at, wide, value)| StoreMutant::Field { at, wide, value }),
        1 => (any::<usize>(), 0usize..3, values()).prop_map(|(entry, part, value)| StoreMutant::Index { entry, part, value }),
        1 => (any::<usize>(), 0usize..2, prop::sample::select(vec![0u32, 1, 2, 8, 12, 13, 14, 39, 40, 1000, u32::MAX]))
            .prop_map(|(layer, part, value)| StoreMutant::Types { layer, part, value }),
    ]
}

fn mutate_store(file: &[u8], m: &StoreMutant) -> Vec<u8> {
    let u32_at = |o: usize| u32::from_le_bytes(file[o..o + 4].try_into().unwrap()) as usize;
    let (layers, experts) = (u32_at(24), u32_at(28));
    // Version 2 (GGUF-typed) stores have a type table (two u32 per layer) after the index.
    let types_at = 160 + 4 * layers + 20 * layers * experts;
    let region = types_at + if u32_at(8) == 2 { 8 * layers } else { 0 } + 4;
    let mut b = file.to_vec();
    match *m {
        StoreMutant::Raw(ref raw) => {
            apply_bytes(&mut b, region, raw);
            return b;
        }
        StoreMutant::Field { at, wide: false, value } => {
            let o = STORE_U32[at % STORE_U32.len()];
            b[o..o + 4].copy_from_slice(&(value as u32).to_le_bytes());
        }
        StoreMutant::Field { at, wide: true, value } => {
            let o = STORE_U64[at % STORE_U64.len()];
            b[o..o + 8].copy_from_slice(&value.to_le_bytes());
        }
        StoreMutant::Index { entry, part, value } => {
            let o = 160 + 4 * layers + 20 * (entry % (layers * experts)) + 8 * part;
            let width = if part == 2 { 4 } else { 8 };
            b[o..o + width].copy_from_slice(&value.to_le_bytes()[..width]);
        }
        StoreMutant::Types { layer, part, value } => {
            // A uniform store has no type table: the word before the region crc instead.
            let o = match region - 4 > types_at {
                true => types_at + 8 * (layer % layers) + 4 * part,
                false => region - 8,
            };
            b[o..o + 4].copy_from_slice(&value.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&b[..156]);
    b[156..160].copy_from_slice(&crc.to_le_bytes());
    let crc = crc32fast::hash(&b[..region - 4]);
    b[region - 4..region].copy_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn expert_store_header_through_engine() {
    let conv = converted();
    let src = conv.path().join("m");
    let original = std::fs::read(src.join("experts.bin")).unwrap();
    fuzz("experts.bin/engine", 64, store_mutants(), |m| {
        let dir = dir_with(&src, "experts.bin", &mutate_store(&original, &m));
        guarded(move || load_and_score(dir.path(), |o| o.budget = ExpertBudget::Slots(4)))
    });
}

#[test]
fn gguf_typed_expert_store_header_through_engine() {
    // A version-2 store: Q4_K_M's experts kept in their ggml types, per layer (Q6_K or Q4_K down).
    let gguf = common::fixtures_dir().join("gguf").join("qwen3_moe-q4km-mixed.gguf");
    let out = TempDir::new("fuzz-converted-gguf");
    let src = out.path().join("m");
    convert(&gguf, &src, &ConvertOptions::default(), &mut |_| {}).unwrap();
    let original = std::fs::read(src.join("experts.bin")).unwrap();
    assert_eq!(original[8], 2, "a GGUF-typed store is version 2");
    fuzz("experts.bin/v2/engine", 64, store_mutants(), |m| {
        let dir = dir_with(&src, "experts.bin", &mutate_store(&original, &m));
        guarded(move || load_and_score(dir.path(), |o| o.budget = ExpertBudget::Slots(4)))
    });
}

/// Heads for the fixture: one head on layer 0 predicting layer 1.
fn heads_file(path: &Path) {
    let features = Features::EDGE0;
    let inner = 8;
    let dims =
        HeadDims { hidden: 64, dense: features.dense_dim(64), sparse: features.sparse_dim(8), inner, experts: 8 };
    let head = Head::new(dims, None, &mut SplitMix64::new(7));
    let model = ModelDims { hidden: 64, experts: 8, top_k: 2, moe_layers: vec![0, 1] };
    Heads::new(&model, features, inner, vec![TrainedHead { layer: 0, target_layer: 1, head }]).save(path).unwrap();
}

/// Mutants of a safetensors file whose `__metadata__` holds a JSON document under `key`:
/// that document mutated, or the file as [`mutate_safetensors`] does.
#[derive(Clone, Debug)]
enum MetaMutant {
    Inner(Vec<mutate::JsonMutation>),
    File(Mutant),
}

fn meta_mutants() -> impl Strategy<Value = MetaMutant> {
    prop_oneof![mutate::json_mutations().prop_map(MetaMutant::Inner), mutants().prop_map(MetaMutant::File)]
}

fn mutate_meta(file: &[u8], key: &str, m: &MetaMutant) -> Vec<u8> {
    match m {
        MetaMutant::File(m) => mutate_safetensors(file, m),
        MetaMutant::Inner(muts) => {
            let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
            let mut header: Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
            let inner = header["__metadata__"][key].as_str().unwrap();
            let mut doc: Value = serde_json::from_str(inner).unwrap();
            mutate::apply_json(&mut doc, muts);
            header["__metadata__"][key] = json!(doc.to_string());
            let mut text = serde_json::to_vec(&header).unwrap();
            text.resize(text.len().next_multiple_of(8), b' ');
            let mut out = (text.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(&text);
            out.extend_from_slice(&file[8 + n..]);
            out
        }
    }
}

#[test]
fn prerouter_heads_through_engine() {
    let scratch = TempDir::new("fuzz-heads");
    let path = scratch.path().join("heads.safetensors");
    heads_file(&path);
    let original = std::fs::read(&path).unwrap();
    fuzz("prerouter.safetensors/engine", 64, meta_mutants(), |m| {
        let dir = TempDir::new("fuzz-heads-case");
        let heads = dir.path().join("heads.safetensors");
        std::fs::write(&heads, mutate_meta(&original, "prerouter", &m)).unwrap();
        guarded(move || {
            let _dir = &dir;
            load_and_score(&fixture(), |o| {
                o.routing = RoutingMode::Predicted;
                o.prerouter = Some(heads);
            })
        })
    });
}

/// A rank-4 adapter on both layers' q_proj of the fixture.
fn lora_adapter(dir: &Path) {
    let config = json!({
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
        "target_modules": ["q_proj"], "bias": "none", "fan_in_fan_out": false,
        "use_rslora": false, "use_dora": false, "rank_pattern": {}, "alpha_pattern": {},
    });
    std::fs::write(dir.join("adapter_config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = (0..2)
        .flat_map(|l| {
            let m = format!("base_model.model.model.layers.{l}.self_attn.q_proj");
            [(format!("{m}.lora_A.weight"), vec![4, 64]), (format!("{m}.lora_B.weight"), vec![64, 4])]
        })
        .map(|(name, shape)| {
            let bytes = (0..256).flat_map(|i| ((i % 13) as f32 * 0.01 - 0.06).to_le_bytes()).collect();
            (name, shape, bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
        .iter()
        .map(|(n, s, b)| {
            (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("adapter_model.safetensors")).unwrap();
}

#[test]
fn lora_adapter_through_engine() {
    let scratch = TempDir::new("fuzz-lora");
    lora_adapter(scratch.path());
    let config = std::fs::read(scratch.path().join("adapter_config.json")).unwrap();
    let weights = std::fs::read(scratch.path().join("adapter_model.safetensors")).unwrap();
    fuzz("lora/engine", 64, (any::<bool>(), mutants()), |(in_config, m)| {
        let dir = match in_config {
            true => dir_with(scratch.path(), "adapter_config.json", &mutate_json_text(&config, &m)),
            false => dir_with(scratch.path(), "adapter_model.safetensors", &mutate_safetensors(&weights, &m)),
        };
        guarded(move || load_and_score(&fixture(), |o| o.lora = Some(dir.path().to_path_buf())))
    });
}

/// Streaming with EAMC, loading the collection in `file` at start (and saving it on drop).
fn with_eamc(o: &mut EngineOptions, file: PathBuf) {
    o.budget = ExpertBudget::Slots(4);
    o.policy = PolicyKind::Eamc;
    o.eamc_file = Some(file);
}

#[test]
fn eamc_collection_through_engine() {
    let scratch = TempDir::new("fuzz-eamc");
    let file = scratch.path().join("eamc.json");
    load_and_score(&fixture(), |o| with_eamc(o, file.clone())).unwrap();
    let original = std::fs::read(&file).unwrap();
    fuzz("eamc.json/engine", 48, mutants(), |m| {
        let dir = TempDir::new("fuzz-eamc-case");
        let file = dir.path().join("eamc.json");
        std::fs::write(&file, mutate_json_text(&original, &m)).unwrap();
        guarded(move || {
            let _dir = &dir;
            load_and_score(&fixture(), |o| with_eamc(o, file))
        })
    });
}

/// A routing trace of the fixture's shape: 3 requests of a prefill and decode steps.
fn trace_text() -> Vec<u8> {
    let header = TraceHeader::new(2, 8, 2, vec![0, 1], 4096);
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    let mut rng = SplitMix64::new(3);
    for r in 0..3 {
        w.request(r).unwrap();
        for (phase, tokens) in [(Phase::Prefill, 3), (Phase::Decode, 1), (Phase::Decode, 1)] {
            let layers: Vec<(u32, Vec<u32>)> =
                (0..2).map(|l| (l, (0..tokens * 2).map(|_| (rng.next_u64() % 8) as u32).collect())).collect();
            w.step(phase, tokens, &layers).unwrap();
        }
    }
    w.finish().unwrap()
}

/// What `moestream simulate` and `trace-stats` do with a trace file.
fn simulate_file(path: &Path) -> Outcome {
    let trace = text(Trace::read(path))?;
    let slots = text(sim::parse_capacities("25%,50%,4", trace.header.total_experts(), trace.header.top_k))?;
    for prefetch in [PrefetchKind::None, PrefetchKind::Eamc] {
        text(sim::simulate(&trace, &slots, &PolicyKind::ALL, prefetch, 4))?;
    }
    let config =
        sim::SimConfig { slots: slots[0], policy: PolicyKind::Eamc, prefetch: PrefetchKind::Eamc, eamc_capacity: 4 };
    text(sim::workload_shift(&trace, 1, config, 3))?;
    let _ = sim::trace_stats(&trace).summary();
    Ok(())
}

#[test]
fn trace_through_simulate() {
    let original = trace_text();
    // Each line is a JSON document; mutants treat the trace as their array.
    let lines: Vec<Value> =
        original.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect();
    let doc = serde_json::to_vec(&Value::Array(lines)).unwrap();
    fuzz("trace/simulate", 256, mutants(), |m| {
        let bytes = match &m {
            Mutant::Json(_) => {
                let mutated: Value = serde_json::from_slice(&mutate_json_text(&doc, &m)).unwrap();
                let lines = mutated.as_array().map(|a| a.iter().map(|l| l.to_string() + "\n").collect::<String>());
                lines.unwrap_or_default().into_bytes()
            }
            Mutant::Bytes(_) => mutate_json_text(&original, &m),
        };
        let dir = TempDir::new("fuzz-trace");
        let path = dir.path().join("trace.jsonl");
        std::fs::write(&path, bytes).unwrap();
        guarded(move || simulate_file(&path))
    });
}

/// A dataset of 40 tokens for the fixture.
fn dataset(dir: &Path) {
    let meta =
        DatasetMeta { version: 1, tokens: 0, hidden: 64, experts: 8, top_k: 2, moe_layers: vec![0, 1], window: 16 };
    let mut w = DatasetWriter::create(dir, meta).unwrap();
    let mut rng = SplitMix64::new(5);
    for _ in 0..40 {
        let hidden: Vec<f32> = (0..128).map(|_| (rng.next_u64() % 1000) as f32 / 500.0 - 1.0).collect();
        let ids: Vec<u16> = (0..4).map(|_| (rng.next_u64() % 8) as u16).collect();
        w.push(rng.next_u64() as u32 % 384, &hidden, &ids).unwrap();
    }
    w.finish().unwrap();
}

/// What `moestream prerouter train --data DIR --model FIXTURE` does.
fn train_on(data_dir: &Path) -> Outcome {
    let data = text(Dataset::open(data_dir))?;
    let m = &data.meta;
    let dims = m.dims();
    let routers = text(read_routers(&fixture(), &dims, data_dir))?;
    let opts = TrainOptions { inner: 8, epochs: 1, batch: 8, ..TrainOptions::default() };
    let (trained, _) = text(train(&data, &ModelTables::routers(routers), &opts))?;
    let out = data_dir.join("heads.safetensors");
    text(Heads::new(&dims, opts.features, opts.inner, trained).save(&out))
}

#[test]
fn dataset_through_prerouter_train() {
    let scratch = TempDir::new("fuzz-data");
    dataset(scratch.path());
    let files = ["meta.json", "hidden.f32", "topk.u16"];
    let originals: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(scratch.path().join(f)).unwrap()).collect();
    fuzz("dataset/prerouter-train", 96, (0usize..4, mutants()), |(which, m)| {
        let dir = TempDir::new("fuzz-data-case");
        for (f, bytes) in files.iter().zip(&originals) {
            std::fs::write(dir.path().join(f), bytes).unwrap();
        }
        let (file, bytes) = match which {
            // meta.json twice as often: it holds the sizes.
            0 | 1 => (files[0], mutate_json_text(&originals[0], &m)),
            k => {
                let mut b = originals[k - 1].clone();
                if let Mutant::Bytes(bm) = &m {
                    apply_bytes(&mut b, originals[k - 1].len(), bm);
                } else {
                    b.truncate(b.len() / 2);
                }
                (files[k - 1], b)
            }
        };
        std::fs::write(dir.path().join(file), bytes).unwrap();
        guarded(move || train_on(dir.path()))
    });
}

#[test]
fn the_harness_catches_panics_on_any_thread_and_hangs() {
    let quick = std::time::Duration::from_millis(200);
    assert!(harness::guarded_within(quick, || panic!("on the calling thread")).is_err());
    let elsewhere = || {
        let _ = std::thread::spawn(|| panic!("on a helper thread")).join();
        Ok(())
    };
    assert!(harness::guarded_within(quick, elsewhere).is_err());
    let hang = || {
        std::thread::sleep(std::time::Duration::from_secs(2));
        Ok(())
    };
    assert!(harness::guarded_within(quick, hang).is_err());
    assert!(matches!(harness::guarded_within(quick, || Err("typed".into())), Ok(Err(_))));
}

// Regression cases: mutants that panicked, aborted or gave NaN before the checks at the edge.

/// Fixture `name`'s config with `field` set to `value`, through the engine: the error it gives
/// (no panic, on any thread); a run that succeeds fails the test.
fn config_case(name: &str, field: &str, value: Value) -> String {
    let src = common::fixtures_dir().join(name);
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg[field] = value;
    let dir = dir_with(&src, "config.json", &serde_json::to_vec(&cfg).unwrap());
    let outcome = guarded(move || load_and_score(dir.path(), |_| {})).unwrap_or_else(|e| panic!("{field}: {e}"));
    outcome.expect_err("the mutant must be refused")
}

#[test]
fn regression_intermediate_size_zero_or_null() {
    // Reported: division by zero in the expert budget (slot bytes 0).
    for value in [json!(0), Value::Null] {
        let e = config_case("mixtral", "intermediate_size", value);
        assert!(e.contains("intermediate_size"), "{e}");
    }
}

#[test]
fn regression_huge_vocab_or_layers() {
    // vocab_size 2^63: `vocab * 4` wrapped to 0, division by zero sizing the batch.
    // num_hidden_layers 2^63 (capacity overflow) or 2^32 (a 4 GiB allocation, then an abort).
    for (field, value) in [("vocab_size", 1u64 << 63), ("num_hidden_layers", 1 << 63), ("num_hidden_layers", 1 << 32)] {
        let e = config_case("mixtral", field, json!(value));
        assert!(e.contains(field) && e.contains(&value.to_string()), "{e}");
    }
}

#[test]
fn regression_huge_intermediate_of_qwen2_moe() {
    // A 2 TiB `gu` buffer: wgpu's validation error handler panicked.
    for field in ["intermediate_size", "shared_expert_intermediate_size", "moe_intermediate_size"] {
        let e = config_case("qwen2_moe", field, json!(1u64 << 32));
        assert!(e.contains(field) && e.contains("4294967296"), "{e}");
    }
}

#[test]
fn regression_huge_linear_head_dim_poisoned_the_gpu_context() {
    // linear_value_head_dim 2^31: a 2 TiB activation buffer was created before the DeltaNet's
    // tensors were checked; wgpu's validation error went to the uncaptured handler, and every
    // later load on that context failed (the long fuzz runs refused all mutants after it). Now
    // the tensors are checked first, and the same load still works afterwards.
    let e = config_case("qwen3_5_moe", "linear_value_head_dim", json!(1u64 << 31));
    assert!(e.contains("in_proj_qkv") && e.contains("has shape"), "{e}");
    load_and_score(&common::fixtures_dir().join("qwen3_5_moe"), |_| {}).expect("the context still works");
}

#[test]
fn regression_rope_theta_zero_gave_nan() {
    // Not a panic but silent garbage: every log-probability NaN.
    for value in [json!(0), json!(-1.5), json!(1e300)] {
        let e = config_case("mixtral", "rope_theta", value);
        assert!(e.contains("rope_theta"), "{e}");
    }
}

#[test]
fn in_range_sizes_that_disagree_with_the_tensors_fail_before_allocating() {
    // Within every bound, but not what the checkpoint holds: the header check refuses them.
    for (name, field, value) in [
        ("mixtral", "vocab_size", 1 << 22),
        ("mixtral", "intermediate_size", 1 << 18),
        ("mixtral", "num_local_experts", 4096),
        ("mixtral", "hidden_size", 1 << 12),
        ("qwen2_moe", "shared_expert_intermediate_size", 1 << 18),
    ] {
        let e = config_case(name, field, json!(value));
        assert!(e.contains("has shape"), "{name} {field}: {e}");
    }
}

#[test]
fn regression_lora_alpha_huge_gave_nan() {
    // lora_alpha 1e300: a finite f64 scale, infinite as the f32 the GPU uses; NaN log-probs.
    let scratch = TempDir::new("fuzz-lora-alpha");
    lora_adapter(scratch.path());
    for alpha in [1e300, -1e300, 1e6] {
        let path = scratch.path().join("adapter_config.json");
        let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        cfg["lora_alpha"] = json!(alpha);
        std::fs::write(&path, serde_json::to_vec(&cfg).unwrap()).unwrap();
        let dir = scratch.path().to_path_buf();
        let outcome = guarded(move || load_and_score(&fixture(), |o| o.lora = Some(dir))).unwrap();
        let e = outcome.expect_err("refused");
        assert!(e.contains("lora_alpha"), "{e}");
    }
}
