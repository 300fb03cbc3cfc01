//! Broken checkpoints and bad inputs must give specific typed errors, never panics.
//!
//! Every case builds a tiny Mixtral-shaped checkpoint in its own temporary directory (written
//! with the `safetensors` crate), breaks one thing, and matches the [`Error`] variant.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::TempDir;
use moestream::model::{ArchSpec, Checkpoint};
use moestream::reference::ReferenceModel;
use moestream::Error;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};

const HIDDEN: usize = 8;
const VOCAB: usize = 16;
const INTER: usize = 12;
const EXPERTS: usize = 3;
const MAX_POS: usize = 8;

fn config() -> Value {
    json!({
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": VOCAB,
        "num_local_experts": EXPERTS,
        "num_experts_per_tok": 2,
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false
    })
}

/// One stored tensor: dtype, shape and raw little-endian bytes.
struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn f32_tensor(shape: &[usize], seed: usize) -> Raw {
    let n: usize = shape.iter().product();
    let bytes = (0..n).flat_map(|i| (((i * 7 + seed * 13) % 17) as f32 / 17.0 - 0.5).to_le_bytes()).collect();
    Raw { dtype: Dtype::F32, shape: shape.to_vec(), bytes }
}

/// Every tensor of the tiny model (head_dim 4: q `[8, 8]`, k/v `[4, 8]`).
fn tensors() -> BTreeMap<String, Raw> {
    let (h, kv) = (HIDDEN, 4);
    let mut specs: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![VOCAB, h]),
        ("model.norm.weight".into(), vec![h]),
        ("lm_head.weight".into(), vec![VOCAB, h]),
        ("model.layers.0.input_layernorm.weight".into(), vec![h]),
        ("model.layers.0.post_attention_layernorm.weight".into(), vec![h]),
        ("model.layers.0.self_attn.q_proj.weight".into(), vec![h, h]),
        ("model.layers.0.self_attn.k_proj.weight".into(), vec![kv, h]),
        ("model.layers.0.self_attn.v_proj.weight".into(), vec![kv, h]),
        ("model.layers.0.self_attn.o_proj.weight".into(), vec![h, h]),
        ("model.layers.0.block_sparse_moe.gate.weight".into(), vec![EXPERTS, h]),
    ];
    for e in 0..EXPERTS {
        let p = format!("model.layers.0.block_sparse_moe.experts.{e}");
        specs.push((format!("{p}.w1.weight"), vec![INTER, h]));
        specs.push((format!("{p}.w3.weight"), vec![INTER, h]));
        specs.push((format!("{p}.w2.weight"), vec![h, INTER]));
    }
    specs.into_iter().enumerate().map(|(i, (name, shape))| (name, f32_tensor(&shape, i))).collect()
}

fn write_config(dir: &Path, cfg: &Value) {
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(cfg).unwrap()).unwrap();
}

fn write_weights(dir: &Path, t: &BTreeMap<String, Raw>) {
    let views: Vec<(String, TensorView<'_>)> = t
        .iter()
        .map(|(name, r)| (name.clone(), TensorView::new(r.dtype, r.shape.clone(), &r.bytes).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

/// A complete, valid checkpoint after `edit` has changed its config and tensors.
fn checkpoint(tag: &str, edit: impl FnOnce(&mut Value, &mut BTreeMap<String, Raw>)) -> TempDir {
    let dir = TempDir::new(&format!("bad-ckpt-{tag}"));
    let (mut cfg, mut t) = (config(), tensors());
    edit(&mut cfg, &mut t);
    write_config(dir.path(), &cfg);
    write_weights(dir.path(), &t);
    dir
}

fn load_err(dir: &TempDir) -> Error {
    match ReferenceModel::load(dir.path()) {
        Ok(_) => panic!("loading {} unexpectedly succeeded", dir.path().display()),
        Err(e) => e,
    }
}

#[test]
fn valid_tiny_checkpoint_loads_and_runs() {
    let dir = checkpoint("valid", |_, _| {});
    let model = ReferenceModel::load(dir.path()).unwrap();
    let logits = model.forward(&[1, 2, 3]).unwrap();
    assert_eq!(logits.len(), 3);
    assert!(logits.iter().flatten().all(|v| v.is_finite()));
    assert_eq!(model.greedy(&[1, 2], 3).unwrap().len(), 3);
    assert_eq!(model.log_probs(&[4]).unwrap(), Vec::<f32>::new());
}

#[test]
fn unknown_architecture() {
    let dir = checkpoint("arch", |c, _| c["architectures"] = json!(["GPT2LMHeadModel"]));
    assert!(matches!(load_err(&dir), Error::UnsupportedArchitecture(a) if a == "GPT2LMHeadModel"));
}

#[test]
fn missing_config_field() {
    let dir = checkpoint("field", |c, _| {
        c.as_object_mut().unwrap().remove("hidden_size");
    });
    assert!(matches!(load_err(&dir), Error::ConfigField(f) if f == "hidden_size"));
    let dir = checkpoint("field-type", |c, _| c["num_hidden_layers"] = json!("two"));
    assert!(matches!(load_err(&dir), Error::ConfigField(f) if f == "num_hidden_layers"));
}

#[test]
fn unsupported_rope_scaling() {
    let dir = checkpoint("yarn", |c, _| c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0}));
    assert!(matches!(load_err(&dir), Error::ConfigField(f) if f == "original_max_position_embeddings"));
    let dir = checkpoint("longrope", |c, _| c["rope_scaling"] = json!({"rope_type": "longrope", "factor": 4.0}));
    assert!(matches!(load_err(&dir), Error::UnsupportedConfig(m) if m.contains("longrope")));
    let dir = checkpoint("rope-key", |c, _| {
        c["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.0, "short_factor": [1.0]})
    });
    assert!(matches!(load_err(&dir), Error::UnsupportedConfig(m) if m.contains("short_factor")));
}

/// Fixture `fixture`'s config with `edit` applied, parsed.
fn fixture_config(
    fixture: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> moestream::Result<ArchSpec> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/{fixture}/config.json"));
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(cfg.as_object_mut().unwrap());
    ArchSpec::from_config(&cfg)
}

/// The DeepSeek-V2 fixture's config with `edit` applied, parsed.
fn deepseek_config(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> moestream::Result<ArchSpec> {
    fixture_config("deepseek_v2", edit)
}

/// Parsing failed with an [`Error::UnsupportedConfig`] naming `needle`.
fn unsupported(r: moestream::Result<ArchSpec>, needle: &str) {
    match r {
        Err(Error::UnsupportedConfig(m)) => assert!(m.contains(needle), "{m:?} should name {needle:?}"),
        other => panic!("expected UnsupportedConfig naming {needle:?}, got {other:?}"),
    }
}

type Edit = Box<dyn FnOnce(&mut serde_json::Map<String, Value>)>;

fn set(key: &'static str, v: Value) -> Edit {
    Box::new(move |c| drop(c.insert(key.into(), v)))
}

#[test]
fn ling_config_fields() {
    use moestream::model::LinearKind;
    let spec = fixture_config("ling", |_| {}).unwrap();
    let hy = spec.hybrid.as_ref().unwrap();
    assert_eq!(hy.linear_layers, [true, false, true, false]);
    assert_eq!(spec.moe_layers, [false, true, true, true]);
    assert_eq!(hy.kind, LinearKind::Kda { lower_bound: Some(-5.0) });
    assert_eq!((hy.num_v_heads, hy.head_k_dim, hy.conv_kernel), (4, 16, 4));
    assert!(spec.mla().is_some() && spec.rope.interleaved);
    // The softplus gate; the layer pattern from layer_group_size when layer_types is absent;
    // a hub config's names (head_dim is the KDA width, the attribute map's aliases).
    let softplus = fixture_config("ling", |c| drop(c.insert("kda_safe_gate".into(), json!(false)))).unwrap();
    assert_eq!(softplus.hybrid.unwrap().kind, LinearKind::Kda { lower_bound: None });
    let hub = fixture_config("ling", |c| {
        for k in ["layer_types", "mlp_layer_types", "linear_head_dim", "num_experts_per_token", "moe_renormalize"] {
            c.remove(k);
        }
        c.insert("head_dim".into(), json!(32));
        c.insert("num_experts_per_tok".into(), json!(3));
        c.insert("layer_group_size".into(), json!(4));
    })
    .unwrap();
    assert_eq!(hub.hybrid.as_ref().unwrap().linear_layers, [true, true, true, false]);
    assert_eq!(hub.hybrid.as_ref().unwrap().head_k_dim, 32);
    assert_eq!(hub.moe_layers, [false, true, true, true]);
    let moe = hub.moe.unwrap();
    assert_eq!((moe.top_k, moe.norm_topk_prob), (3, true));
    // Fields that change the math and are malformed or not implemented are refused by name.
    let cases: Vec<(Edit, &str)> = vec![
        (set("mlp_layer_types", json!(["dense", "sparse"])), "mlp_layer_types"),
        (set("mlp_layer_types", json!(["dense", "moe", "sparse", "sparse"])), "MLP layer type"),
        (set("layer_types", json!(["linear_attention", "sliding_attention", "x", "y"])), "layer type"),
        (set("kda_lower_bound", json!(1e39)), "kda_lower_bound"),
        (set("attention_bias", json!(true)), "attention_bias"),
        (set("hidden_act", json!("gelu")), "hidden_act"),
        (set("num_expert_group", json!(3)), "n_group"),
        (
            set("rope_parameters", json!({"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})),
            "partial_rotary_factor",
        ),
    ];
    for (edit, needle) in cases {
        unsupported(fixture_config("ling", edit), needle);
    }
    let no_group = fixture_config("ling", |c| {
        c.remove("layer_types");
        c.insert("layer_group_size".into(), json!(0));
    });
    unsupported(no_group, "layer_group_size");
    assert!(matches!(
        fixture_config("ling", |c| drop(c.insert("kda_safe_gate".into(), json!("yes")))),
        Err(Error::ConfigField(f)) if f == "kda_safe_gate"
    ));
}

#[test]
fn malformed_mla_and_routing_configs() {
    assert!(deepseek_config(|_| {}).is_ok());
    let field = |key: &'static str| move |c: &mut serde_json::Map<String, Value>| drop(c.remove(key));
    assert!(matches!(deepseek_config(field("kv_lora_rank")), Err(Error::ConfigField(f)) if f == "kv_lora_rank"));
    assert!(
        matches!(deepseek_config(field("qk_rope_head_dim")), Err(Error::ConfigField(f)) if f == "qk_rope_head_dim")
    );
    unsupported(deepseek_config(set("qk_rope_head_dim", json!(7))), "qk_rope_head_dim");
    unsupported(deepseek_config(set("v_head_dim", json!(0))), "v_head_dim");
    unsupported(deepseek_config(set("q_lora_rank", json!(0))), "q_lora_rank");
    unsupported(deepseek_config(set("attention_bias", json!(true))), "attention_bias");
    unsupported(deepseek_config(set("n_group", json!(3))), "n_group");
    unsupported(deepseek_config(set("topk_group", json!(5))), "topk_group");
    unsupported(deepseek_config(set("topk_method", json!("noaux_tc"))), "topk_method");
    unsupported(deepseek_config(set("scoring_func", json!("sigmoid"))), "scoring_func");
    unsupported(deepseek_config(set("norm_topk_prob", json!(true))), "norm_topk_prob");
    unsupported(deepseek_config(set("moe_layer_freq", json!(2))), "moe_layer_freq");
    unsupported(deepseek_config(set("hidden_act", json!("gelu"))), "hidden_act");
    assert!(
        matches!(deepseek_config(set("kv_lora_rank", json!("wide"))), Err(Error::ConfigField(f)) if f == "kv_lora_rank")
    );
}

#[test]
fn mla_tensor_shapes_follow_the_config() {
    // A config whose v_head_dim disagrees with the stored kv_b_proj and o_proj.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/deepseek_v2");
    let dir = TempDir::new("bad-ckpt-mla-shape");
    std::fs::copy(src.join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["v_head_dim"] = json!(8);
    write_config(dir.path(), &cfg);
    assert!(matches!(load_err(&dir), Error::TensorShape { name, .. } if name.ends_with("kv_b_proj.weight")));
}

#[test]
fn missing_tensor() {
    let name = "model.layers.0.self_attn.k_proj.weight";
    let dir = checkpoint("missing", |_, t| {
        t.remove(name);
    });
    assert!(matches!(load_err(&dir), Error::MissingTensor(n) if n == name));
    let expert = "model.layers.0.block_sparse_moe.experts.2.w2.weight";
    let dir = checkpoint("missing-expert", |_, t| {
        t.remove(expert);
    });
    assert!(matches!(load_err(&dir), Error::MissingTensor(n) if n == expert));
}

#[test]
fn wrong_shape() {
    let name = "model.layers.0.self_attn.q_proj.weight";
    let dir = checkpoint("shape", |_, t| {
        t.insert(name.into(), f32_tensor(&[HIDDEN, HIDDEN + 1], 0));
    });
    match load_err(&dir) {
        Error::TensorShape { name: n, actual, expected } => {
            assert_eq!(n, name);
            assert_eq!(actual, vec![HIDDEN, HIDDEN + 1]);
            assert_eq!(expected, vec![HIDDEN, HIDDEN]);
        }
        e => panic!("expected TensorShape, got {e:?}"),
    }
}

#[test]
fn wrong_dtype() {
    let name = "model.norm.weight";
    let dir = checkpoint("dtype", |_, t| {
        t.insert(name.into(), Raw { dtype: Dtype::I32, shape: vec![HIDDEN], bytes: vec![0; 4 * HIDDEN] });
    });
    assert!(matches!(load_err(&dir), Error::TensorDtype { name: n, dtype } if n == name && dtype == "I32"));
    assert!(matches!(Checkpoint::open(dir.path()), Err(Error::TensorDtype { .. })));
}

#[test]
fn truncated_safetensors() {
    let dir = checkpoint("truncated", |_, _| {});
    let file = dir.path().join("model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    // Cut inside the tensor data.
    f.set_len(len - 100).unwrap();
    assert!(matches!(load_err(&dir), Error::Safetensors { .. }));
    // Cut inside the JSON header.
    f.set_len(40).unwrap();
    assert!(matches!(load_err(&dir), Error::Safetensors { .. }));
    // Shorter than the 8-byte header length.
    f.set_len(3).unwrap();
    assert!(matches!(load_err(&dir), Error::Safetensors { .. }));
}

#[test]
fn corrupt_safetensors_header() {
    let dir = checkpoint("garbage", |_, _| {});
    let mut bytes = 20u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{not json at all!!!}");
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    assert!(matches!(load_err(&dir), Error::Safetensors { .. }));
}

#[test]
fn no_weights() {
    let dir = TempDir::new("bad-ckpt-noweights");
    write_config(dir.path(), &config());
    assert!(matches!(load_err(&dir), Error::NoWeights(p) if p == dir.path()));
    assert!(matches!(Checkpoint::open(dir.path()), Err(Error::NoWeights(_))));
}

#[test]
fn missing_config() {
    let dir = TempDir::new("bad-ckpt-noconfig");
    write_weights(dir.path(), &tensors());
    assert!(matches!(load_err(&dir), Error::Io { path, .. } if path.ends_with("config.json")));
    assert!(matches!(ArchSpec::from_dir(dir.path()), Err(Error::Io { .. })));
    // A directory that does not exist at all.
    let gone = dir.path().join("does-not-exist");
    assert!(matches!(ReferenceModel::load(&gone), Err(Error::Io { .. })));
}

#[test]
fn malformed_json() {
    let dir = checkpoint("json", |_, _| {});
    std::fs::write(dir.path().join("config.json"), "{\"architectures\": [\"MixtralForCausalLM\"],").unwrap();
    assert!(matches!(load_err(&dir), Error::Json { path, .. } if path.ends_with("config.json")));
}

#[test]
fn missing_shard_of_index() {
    let dir = checkpoint("shard", |_, _| {});
    let index = json!({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    assert!(matches!(load_err(&dir), Error::Io { .. }));
    std::fs::write(dir.path().join("model.safetensors.index.json"), "[1, 2").unwrap();
    assert!(matches!(load_err(&dir), Error::Json { .. }));
}

#[test]
fn bad_prompts_at_forward_time() {
    let dir = checkpoint("prompts", |_, _| {});
    let model = ReferenceModel::load(dir.path()).unwrap();
    let vocab = VOCAB as u32;
    assert!(
        matches!(model.forward(&[1, vocab, 2]), Err(Error::TokenOutOfRange { id, vocab: v }) if id == vocab && v == VOCAB)
    );
    assert!(matches!(model.forward(&[u32::MAX]), Err(Error::TokenOutOfRange { .. })));
    assert!(matches!(model.forward(&[]), Err(Error::EmptyPrompt)));
    assert!(matches!(model.log_probs(&[]), Err(Error::EmptyPrompt)));
    assert!(matches!(model.greedy(&[], 2), Err(Error::EmptyPrompt)));
    let long = vec![1u32; MAX_POS + 1];
    assert!(matches!(
        model.forward(&long),
        Err(Error::ContextOverflow { requested, context }) if requested == MAX_POS + 1 && context == MAX_POS
    ));
    assert!(model.forward(&long[..MAX_POS]).is_ok());
    assert!(matches!(model.greedy(&long[..MAX_POS - 1], 2), Err(Error::ContextOverflow { .. })));
    assert!(matches!(model.log_probs(&long), Err(Error::ContextOverflow { .. })));
    // Step-by-step sessions check the same limits and stay usable after an error.
    let mut s = model.session();
    assert!(matches!(s.step(vocab), Err(Error::TokenOutOfRange { .. })));
    for _ in 0..MAX_POS {
        s.step(3).unwrap();
    }
    assert!(matches!(s.step(3), Err(Error::ContextOverflow { .. })));
    assert_eq!(s.position(), MAX_POS);
}

#[test]
fn empty_weight_file() {
    let dir = checkpoint("empty-file", |_, _| {});
    std::fs::write(dir.path().join("model.safetensors"), b"").unwrap();
    assert!(matches!(load_err(&dir), Error::Safetensors { .. } | Error::Io { .. }));
}

#[test]
fn degenerate_head_config_does_not_panic() {
    // heads not a multiple of kv heads.
    let dir = checkpoint("gqa", |c, _| c["num_key_value_heads"] = json!(3));
    assert!(matches!(load_err(&dir), Error::UnsupportedConfig(_)));
    let dir = checkpoint("kv0", |c, _| c["num_key_value_heads"] = json!(0));
    assert!(
        matches!(load_err(&dir), Error::ConfigValue { field, value, .. } if field == "num_key_value_heads" && value == "0")
    );
    // More experts per token than experts.
    let dir = checkpoint("topk", |c, _| c["num_experts_per_tok"] = json!(EXPERTS + 1));
    assert!(matches!(load_err(&dir), Error::UnsupportedConfig(_)));
}

#[test]
fn gpu_refuses_head_dim_not_a_multiple_of_8() {
    // The tiny model's head_dim 4 runs on the CPU reference, but grouped attention on the GPU
    // reads heads in 8-dim chunks: refused at load, by name.
    let dir = checkpoint("head-dim-4", |_, _| {});
    let options = moestream::runtime::EngineOptions::new(dir.path());
    match moestream::runtime::Engine::load_on(common::gpu(), &options) {
        Err(Error::UnsupportedConfig(msg)) => assert!(msg.contains("head_dim 4"), "{msg}"),
        Err(e) => panic!("expected the head_dim refusal, got {e}"),
        Ok(_) => panic!("head_dim 4 loaded on the GPU"),
    }
}
