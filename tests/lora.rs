//! PEFT LoRA adapters (`EngineOptions::lora`, `--lora DIR`), applied unmerged on the GPU,
//! against the CPU reference on the merged weights `W + s·B·A` (merged by
//! `LoraAdapter::merge_into`): log-probs within the 1e-3 of `tests/engine_golden.rs` on f32
//! and int4 bases, through the prefill matmul and the decode matvec; and every malformed
//! adapter refused with a typed error.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{fixtures, fixtures_dir, gpu, max_abs_diff, GoldenPrompt, Rng, TempDir};
use moestream::decoder::DecoderOptions;
use moestream::model::lora::{LoraAdapter, CONFIG_FILE, WEIGHTS_FILE};
use moestream::model::names;
use moestream::model::ArchSpec;
use moestream::ops::{KvDtype, WeightFormat};
use moestream::quant::QuantParams;
use moestream::reference::ReferenceModel;
use moestream::runtime::{Engine, EngineOptions, GenerateOptions};
use moestream::Error;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};

/// The log-prob tolerance of `tests/engine_golden.rs` (f32) and `tests/engine_int4.rs`.
const TOL: f32 = 1e-3;
const RANK: usize = 4;
const ALPHA: f64 = 8.0;
const CONTEXT: usize = 64;

/// An adapter to write in PEFT's layout: its config and its tensors by name.
struct Peft {
    config: Value,
    tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

impl Peft {
    /// Rank 4, alpha 8, `target_modules` as given, no tensors yet.
    fn new(target_modules: Value) -> Peft {
        let config = json!({
            "peft_type": "LORA",
            "r": RANK,
            "lora_alpha": ALPHA,
            "lora_dropout": 0.0,
            "target_modules": target_modules,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "rank_pattern": {},
            "alpha_pattern": {},
        });
        Peft { config, tensors: BTreeMap::new() }
    }

    /// Adds `base_model.model.{module}.lora_{A,B}.weight` for a `[out, inp]` weight: A
    /// `[r, inp]` and B `[out, r]` uniform in ±0.15, large enough to move log-probs by far more
    /// than the tolerance (PEFT initialises B to zero; a trained adapter does not keep it).
    fn pair(&mut self, rng: &mut Rng, module: &str, out: usize, inp: usize) {
        self.tensor(&format!("{module}.lora_A.weight"), vec![RANK, inp], rng.vec(RANK * inp, -0.15, 0.15));
        self.tensor(&format!("{module}.lora_B.weight"), vec![out, RANK], rng.vec(out * RANK, -0.15, 0.15));
    }

    /// Adds one tensor under PEFT's `base_model.model.` prefix.
    fn tensor(&mut self, name: &str, shape: Vec<usize>, data: Vec<f32>) {
        self.tensors.insert(format!("base_model.model.{name}"), (shape, data));
    }

    /// Writes `adapter_config.json` and `adapter_model.safetensors` into `dir`.
    fn write(&self, dir: &Path) {
        std::fs::write(dir.join(CONFIG_FILE), serde_json::to_vec_pretty(&self.config).unwrap()).unwrap();
        let bytes: Vec<(&String, Vec<u8>)> =
            self.tensors.iter().map(|(n, (_, d))| (n, d.iter().flat_map(|v| v.to_le_bytes()).collect())).collect();
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(n, b)| ((*n).clone(), TensorView::new(Dtype::F32, self.tensors[*n].0.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(WEIGHTS_FILE)).unwrap();
    }

    /// Writes the adapter into a new temporary directory.
    fn written(&self) -> TempDir {
        let dir = TempDir::new("lora");
        self.write(dir.path());
        dir
    }
}

/// Every projection an adapter may target in `spec`, as (module path, out, in), named the way
/// PEFT names them: the attention projections, then each dense layer's MLP and each MoE layer's
/// shared expert.
fn all_targets(spec: &ArchSpec) -> Vec<(String, usize, usize)> {
    let (h, qd, kvd) = (spec.hidden, spec.q_dim(), spec.kv_dim());
    let mut out = Vec::new();
    for i in 0..spec.layers {
        let p = format!("model.layers.{i}");
        if spec.mla().is_none() {
            out.push((format!("{p}.self_attn.q_proj"), qd, h));
            out.push((format!("{p}.self_attn.k_proj"), kvd, h));
            out.push((format!("{p}.self_attn.v_proj"), kvd, h));
            out.push((format!("{p}.self_attn.o_proj"), h, qd));
        }
        let mlp = match (&spec.moe, spec.is_moe_layer(i)) {
            (_, false) => Some((format!("{p}.mlp"), spec.dense_intermediate)),
            (Some(m), true) => m.shared_expert_intermediate.map(|si| (names::shared_expert(spec.family, i), si)),
            (None, true) => None,
        };
        if let Some((m, inter)) = mlp {
            out.push((format!("{m}.gate_proj"), inter, h));
            out.push((format!("{m}.up_proj"), inter, h));
            out.push((format!("{m}.down_proj"), h, inter));
        }
    }
    out
}

/// An adapter with a random pair on every projection of `spec` it may target.
fn adapter_on_all_targets(spec: &ArchSpec, seed: u64) -> Peft {
    let mut peft = Peft::new(json!(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]));
    let mut rng = Rng::new(seed);
    for (module, out, inp) in all_targets(spec) {
        peft.pair(&mut rng, &module, out, inp);
    }
    peft
}

fn spec_of(fixture: &str) -> ArchSpec {
    ArchSpec::from_dir(&fixtures_dir().join(fixture)).unwrap()
}

fn prompts(fixture: &str) -> Vec<GoldenPrompt> {
    let (_, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with(fixture)).expect("fixture");
    golden.prompts.into_iter().filter(|p| p.name == "short" || p.name == "text").collect()
}

/// The GPU engine on `fixture` in `format` with the adapter `peft` against the CPU reference
/// on the same base weights with the adapter merged: log-probs of every prompt within [`TOL`]
/// with prefill steps (and, for the shorter prompt, one-token decode steps), greedy tokens
/// equal, and the adapter moving log-probs by over 50× the tolerance.
fn check(fixture: &str, format: WeightFormat, peft: &Peft) {
    let dir = fixtures_dir().join(fixture);
    let adapter_dir = peft.written();
    let cache = TempDir::new("lora-int4-cache");
    let engine = |max_batch: usize| {
        let mut o = EngineOptions::new(&dir).with_format(format);
        o.context = Some(CONTEXT);
        o.kv_dtype = KvDtype::F32;
        o.max_batch = max_batch;
        o.cache_dir = Some(cache.path().to_path_buf());
        o.lora = Some(adapter_dir.path().to_path_buf());
        Engine::load_on(gpu(), &o).unwrap_or_else(|e| panic!("{fixture}: {e}"))
    };
    let (prefill, decode) = (engine(64), engine(1));
    let adapter = LoraAdapter::load(adapter_dir.path(), &spec_of(fixture)).unwrap();
    let decoder = DecoderOptions {
        experts: format,
        dense: format,
        context: CONTEXT,
        kv_dtype: KvDtype::F32,
        kv_budget: u64::MAX,
        max_batch: 64,
        window_rings: true,
        state_snapshots: 0,
        streaming: None,
        mtp: false,
    };
    let base = ReferenceModel::load(&dir).unwrap().rounded_like(&decoder).unwrap();
    let merged = ReferenceModel::load(&dir).unwrap().rounded_like(&decoder).unwrap().with_lora(&adapter).unwrap();
    let shortest = prompts(fixture).into_iter().map(|p| p.tokens.len()).min().unwrap();
    for p in prompts(fixture) {
        let want = merged.log_probs(&p.tokens).unwrap();
        let got = prefill.score(&p.tokens).unwrap().logprobs;
        let err = max_abs_diff(&got, &want);
        let change = max_abs_diff(&got, &base.log_probs(&p.tokens).unwrap());
        println!(
            "{fixture} {} {}: |GPU-CPU merged| {err:.2e}, adapter moved log-probs by {change:.3}",
            format.name(),
            p.name
        );
        assert!(err < TOL, "{fixture} {}: GPU with adapter vs merged reference: {err}", p.name);
        assert!(change > 50.0 * TOL, "{fixture} {}: the adapter barely changes log-probs ({change})", p.name);
        if p.tokens.len() == shortest {
            let err = max_abs_diff(&decode.score(&p.tokens).unwrap().logprobs, &want);
            println!("{fixture} {} {} one token per step: |GPU-CPU merged| {err:.2e}", format.name(), p.name);
            assert!(err < TOL, "{fixture} {}: decode steps with adapter vs merged reference: {err}", p.name);
        }
        let opts = GenerateOptions { max_tokens: 6, ignore_eos: true, ..Default::default() };
        let g = prefill.generate(&p.tokens, &opts, |_, _| true).unwrap();
        assert_eq!(g.tokens, merged.greedy(&p.tokens, 6).unwrap(), "{fixture} {}: greedy", p.name);
    }
}

#[test]
fn f32_attention_dense_and_shared_expert_match_merged_reference() {
    // Qwen2-MoE fixture: dense layers 0 and 2, MoE layers 1 and 3 with a shared expert.
    check("qwen2_moe", WeightFormat::F32, &adapter_on_all_targets(&spec_of("qwen2_moe"), 1));
}

#[test]
fn mla_model_adapts_dense_and_shared_experts_and_refuses_attention() {
    // DeepSeek-V2 fixture: dense layer 0, MoE layers 1 and 2 with (ungated) shared experts.
    check("deepseek_v2", WeightFormat::F32, &adapter_on_all_targets(&spec_of("deepseek_v2"), 3));
    let mut q = Peft::new(json!(["q_proj"]));
    q.pair(&mut Rng::new(2), "model.layers.0.self_attn.q_proj", 96, 64);
    let m = lora_message(load_err("deepseek_v2", &q, |_| {}));
    assert!(m.contains("MLA"), "{m}");
}

#[test]
fn int4_base_matches_reference_on_dequantized_weights_plus_merged_delta() {
    let format = WeightFormat::Int4(QuantParams::default());
    check("qwen2_moe", format, &adapter_on_all_targets(&spec_of("qwen2_moe"), 2));
}

#[test]
fn rslora_scales_by_alpha_over_sqrt_rank() {
    // Qwen3-MoE fixture: no shared expert, layer 1 dense.
    let spec = spec_of("qwen3_moe");
    let mut peft = adapter_on_all_targets(&spec, 3);
    let plain = peft.written();
    peft.config["use_rslora"] = json!(true);
    let rs = peft.written();
    assert_eq!(LoraAdapter::load(plain.path(), &spec).unwrap().scale(), (ALPHA / RANK as f64) as f32);
    assert_eq!(LoraAdapter::load(rs.path(), &spec).unwrap().scale(), (ALPHA / (RANK as f64).sqrt()) as f32);
    check("qwen3_moe", WeightFormat::F32, &peft);
}

#[test]
fn pattern_target_modules_are_accepted() {
    let spec = spec_of("qwen2_moe");
    let mut peft = adapter_on_all_targets(&spec, 4);
    peft.config["target_modules"] = json!(".*\\.(q|k|v|o|gate|up|down)_proj");
    let a = LoraAdapter::load(peft.written().path(), &spec).unwrap();
    assert_eq!(a.rank(), RANK);
}

// ---------------------------------------------------------------------------------------------
// Malformed adapters: typed errors, never panics.

/// Loading `peft` (after `edit` of its written directory) for `fixture` fails: the error.
fn load_err(fixture: &str, peft: &Peft, edit: impl FnOnce(&Path)) -> Error {
    let dir = peft.written();
    edit(dir.path());
    match LoraAdapter::load(dir.path(), &spec_of(fixture)) {
        Ok(_) => panic!("adapter loaded, an error was expected"),
        Err(e) => {
            println!("{e}");
            e
        }
    }
}

/// A valid one-pair adapter on layer 0's q_proj of qwen2_moe, plus `extra` pairs.
fn q_adapter(extra: &[(&str, usize, usize)]) -> Peft {
    let mut peft = Peft::new(json!(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]));
    let mut rng = Rng::new(9);
    peft.pair(&mut rng, "model.layers.0.self_attn.q_proj", 64, 64);
    for &(module, out, inp) in extra {
        peft.pair(&mut rng, module, out, inp);
    }
    peft
}

fn lora_message(e: Error) -> String {
    match e {
        Error::Lora { message, .. } => message,
        other => panic!("expected Error::Lora, got {other:?}"),
    }
}

#[test]
fn unsupported_tensors_are_named() {
    for (module, out, inp) in [
        ("model.layers.1.mlp.experts.0.gate_proj", 32, 64),
        ("lm_head", 384, 64),
        ("model.layers.1.mlp.shared_expert_gate", 1, 64),
        ("model.layers.1.mlp.gate", 8, 64),
        ("model.embed_tokens", 384, 64),
    ] {
        let e = load_err("qwen2_moe", &q_adapter(&[(module, out, inp)]), |_| {});
        let want = format!("base_model.model.{module}.lora_A.weight");
        assert!(matches!(&e, Error::UnsupportedLoraTensor(n) if *n == want), "{module}: {e:?}");
    }
    let mut peft = q_adapter(&[]);
    peft.tensor("model.layers.0.self_attn.q_proj.base_layer.weight", vec![64, 64], vec![0.0; 64 * 64]);
    let e = load_err("qwen2_moe", &peft, |_| {});
    assert!(matches!(&e, Error::UnsupportedLoraTensor(n) if n.ends_with("base_layer.weight")), "{e:?}");
}

#[test]
fn modules_the_model_lacks_are_refused() {
    let beyond =
        lora_message(load_err("qwen2_moe", &q_adapter(&[("model.layers.9.self_attn.q_proj", 64, 64)]), |_| {}));
    assert!(beyond.contains("layer 9") && beyond.contains("4 layers"), "{beyond}");
    // qwen3_moe has no shared expert; layer 1 of qwen2_moe is an MoE layer, without a dense MLP.
    let mut no_shared = Peft::new(json!(["gate_proj"]));
    no_shared.pair(&mut Rng::new(1), "model.layers.0.mlp.shared_expert.gate_proj", 64, 64);
    let m = lora_message(load_err("qwen3_moe", &no_shared, |_| {}));
    assert!(m.contains("no shared expert"), "{m}");
    let m = lora_message(load_err("qwen2_moe", &q_adapter(&[("model.layers.1.mlp.gate_proj", 96, 64)]), |_| {}));
    assert!(m.contains("no dense MLP"), "{m}");
    let mut only_q = q_adapter(&[("model.layers.0.self_attn.v_proj", 32, 64)]);
    only_q.config["target_modules"] = json!(["q_proj"]);
    let m = lora_message(load_err("qwen2_moe", &only_q, |_| {}));
    assert!(m.contains("v_proj") && m.contains("target_modules"), "{m}");
}

#[test]
fn wrong_shapes_and_missing_halves() {
    let mut wide = q_adapter(&[]);
    wide.tensor("model.layers.0.self_attn.k_proj.lora_A.weight", vec![RANK, 72], vec![0.1; RANK * 72]);
    wide.tensor("model.layers.0.self_attn.k_proj.lora_B.weight", vec![32, RANK], vec![0.1; 32 * RANK]);
    let e = load_err("qwen2_moe", &wide, |_| {});
    assert!(
        matches!(&e, Error::TensorShape { name, expected, .. } if name.ends_with("k_proj.lora_A.weight") && *expected == [RANK, 64]),
        "{e:?}"
    );
    let mut rank8 = q_adapter(&[]);
    rank8.config["r"] = json!(8);
    let e = load_err("qwen2_moe", &rank8, |_| {});
    assert!(matches!(&e, Error::TensorShape { expected, .. } if *expected == [8, 64]), "{e:?}");
    for half in ["A", "B"] {
        let mut peft = q_adapter(&[]);
        peft.tensors.retain(|n, _| !n.ends_with(&format!("lora_{half}.weight")));
        let e = load_err("qwen2_moe", &peft, |_| {});
        let want = format!("base_model.model.model.layers.0.self_attn.q_proj.lora_{half}.weight");
        assert!(matches!(&e, Error::MissingTensor(n) if *n == want), "{half}: {e:?}");
    }
}

#[test]
fn unsupported_options_are_refused() {
    for (field, value, says) in [
        ("fan_in_fan_out", json!(true), "fan_in_fan_out"),
        ("use_dora", json!(true), "DoRA"),
        ("bias", json!("lora_only"), "bias"),
        ("rank_pattern", json!({"q_proj": 8}), "rank_pattern"),
        ("alpha_pattern", json!({"q_proj": 16}), "alpha_pattern"),
        ("peft_type", json!("IA3"), "IA3"),
        ("r", json!(0), "r must be"),
    ] {
        let mut peft = q_adapter(&[]);
        peft.config[field] = value;
        let m = lora_message(load_err("qwen2_moe", &peft, |_| {}));
        assert!(m.contains(says), "{field}: {m}");
    }
}

#[test]
fn missing_and_malformed_files() {
    let peft = q_adapter(&[]);
    for file in [CONFIG_FILE, WEIGHTS_FILE] {
        let e = load_err("qwen2_moe", &peft, |d| std::fs::remove_file(d.join(file)).unwrap());
        assert!(matches!(&e, Error::Io { path, .. } if path.ends_with(file)), "{file}: {e:?}");
    }
    let e = load_err("qwen2_moe", &peft, |d| std::fs::write(d.join(CONFIG_FILE), "{").unwrap());
    assert!(matches!(&e, Error::Json { .. }), "{e:?}");
    let mut no_r = q_adapter(&[]);
    no_r.config.as_object_mut().unwrap().remove("r");
    let e = load_err("qwen2_moe", &no_r, |_| {});
    assert!(matches!(&e, Error::Json { message, .. } if message.contains("`r`")), "{e:?}");
    let e = load_err("qwen2_moe", &peft, |d| std::fs::write(d.join(WEIGHTS_FILE), b"not safetensors").unwrap());
    assert!(matches!(&e, Error::Safetensors { .. }), "{e:?}");
    let m = lora_message(load_err("qwen2_moe", &Peft::new(json!(["q_proj"])), |_| {}));
    assert!(m.contains("no LoRA tensors"), "{m}");
}

#[test]
fn engine_refuses_a_bad_adapter_before_uploading() {
    let peft = q_adapter(&[("lm_head", 384, 64)]);
    let dir = peft.written();
    let mut o = EngineOptions::new(fixtures_dir().join("qwen2_moe")).with_format(WeightFormat::F32);
    o.lora = Some(dir.path().to_path_buf());
    let e = Engine::load_on(gpu(), &o).err().expect("a bad adapter must fail the load");
    assert!(matches!(&e, Error::UnsupportedLoraTensor(n) if n.contains("lm_head")), "{e:?}");
}
