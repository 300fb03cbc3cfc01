//! GGUF metadata → the Hugging Face `config.json` the engine's own parser
//! ([`ArchSpec::from_config`]) reads, for families whose configuration has many fields
//! (`glm4moe`): one translation of llama.cpp's keys back into transformers' names, so the
//! family's checks and defaults live in one place. Keys that change the math and have no
//! transformers equivalent here are refused by name.

use serde_json::{json, Map, Value};

use super::{GgufModel, GgufValue};
use crate::error::{Error, Result};
use crate::model::config::ArchSpec;

/// `{arch}.rope.scaling.*` keys translated into `rope_scaling` (others are refused).
const YARN_KEYS: [(&str, &str); 4] = [
    ("factor", "factor"),
    ("original_context_length", "original_max_position_embeddings"),
    ("yarn_beta_fast", "beta_fast"),
    ("yarn_beta_slow", "beta_slow"),
];

/// The architecture of a `glm4moe` GGUF model, through the `Glm4MoeForCausalLM` config it was
/// converted from (llama.cpp's `convert_hf_to_gguf.py`): the multi-token-prediction blocks
/// after the main ones (`nextn_predict_layers`) are not part of next-token decoding.
pub fn glm4moe(m: &GgufModel) -> Result<ArchSpec> {
    let arch = "glm4moe";
    let key = |k: &str| format!("{arch}.{k}");
    let num = |k: &str| m.get(&key(k)).and_then(GgufValue::as_u64);
    let req = |k: &str| num(k).ok_or_else(|| Error::ConfigField(key(k)));
    let float = |k: &str| m.get(&key(k)).and_then(GgufValue::as_f64);
    let blocks = req("block_count")?;
    let nextn = num("nextn_predict_layers").unwrap_or(0);
    let heads = req("attention.head_count")?;
    let hidden = req("embedding_length")?;
    let head_dim = num("attention.key_length").unwrap_or(hidden / heads.max(1));
    if num("attention.value_length").is_some_and(|v| v != head_dim) {
        return Err(Error::UnsupportedConfig(format!("GGUF {}: value length ≠ key length", key("attention"))));
    }
    match num("expert_gating_func") {
        // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, what GLM-4.5 routes with.
        Some(2) => {}
        other => return Err(Error::UnsupportedConfig(format!("GGUF {}: {other:?} (GLM-4.5 is sigmoid, 2)", key("expert_gating_func")))),
    }
    let rotary = num("rope.dimension_count").unwrap_or(head_dim);
    let embd = m.info("token_embd.weight").ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))?;
    let mut cfg = json!({
        "architectures": ["Glm4MoeForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": blocks.checked_sub(nextn).ok_or_else(|| Error::ConfigField(key("nextn_predict_layers")))?,
        "intermediate_size": req("feed_forward_length")?,
        "moe_intermediate_size": req("expert_feed_forward_length")?,
        "num_attention_heads": heads,
        "num_key_value_heads": num("attention.head_count_kv").unwrap_or(heads),
        "head_dim": head_dim,
        "partial_rotary_factor": rotary as f64 / head_dim.max(1) as f64,
        "rope_theta": float("rope.freq_base").unwrap_or(10000.0),
        "rms_norm_eps": float("attention.layer_norm_rms_epsilon").ok_or_else(|| Error::ConfigField(key("attention.layer_norm_rms_epsilon")))?,
        "n_routed_experts": req("expert_count")?,
        "num_experts_per_tok": req("expert_used_count")?,
        "n_shared_experts": num("expert_shared_count").unwrap_or(0),
        "first_k_dense_replace": num("leading_dense_block_count").unwrap_or(0),
        "routed_scaling_factor": float("expert_weights_scale").unwrap_or(1.0),
        "norm_topk_prob": matches!(m.get(&key("expert_weights_norm")), Some(GgufValue::Bool(true))),
        "n_group": num("expert_group_count").unwrap_or(1),
        "topk_group": num("expert_group_used_count").unwrap_or(1),
        "use_qk_norm": m.info("blk.0.attn_q_norm.weight").is_some(),
        "attention_bias": m.info("blk.0.attn_q.bias").is_some(),
        "vocab_size": embd.shape[0],
        "max_position_embeddings": num("context_length").unwrap_or(4096),
        "tie_word_embeddings": m.info("output.weight").is_none(),
        "hidden_act": "silu",
    });
    if let Some(eos) = m.get("tokenizer.ggml.eos_token_id").and_then(GgufValue::as_u64) {
        cfg["eos_token_id"] = json!(eos);
    }
    if let Some(scaling) = rope_scaling(m, arch)? {
        cfg["rope_scaling"] = scaling;
    }
    ArchSpec::from_config(&cfg)
}

/// `rope_scaling` from `{arch}.rope.scaling.*`: none, or YaRN with the keys transformers names;
/// other types and keys are refused by name.
fn rope_scaling(m: &GgufModel, arch: &str) -> Result<Option<Value>> {
    let prefix = format!("{arch}.rope.scaling.");
    let kind = match m.get(&format!("{prefix}type")) {
        None => return Ok(None),
        Some(GgufValue::String(s)) if s == "none" => return Ok(None),
        Some(GgufValue::String(s)) if s == "yarn" => "yarn",
        Some(v) => return Err(Error::UnsupportedConfig(format!("GGUF {prefix}type {v:?} is not supported"))),
    };
    let mut out = Map::new();
    out.insert("type".into(), json!(kind));
    for (k, v) in m.metadata.range(prefix.clone()..) {
        let Some(field) = k.strip_prefix(&prefix) else { break };
        if field == "type" {
            continue;
        }
        let hf = YARN_KEYS.iter().find(|(g, _)| *g == field).map(|(_, h)| *h).ok_or_else(|| {
            Error::UnsupportedConfig(format!("GGUF {k} is not supported (it changes the rotary math)"))
        })?;
        let value = match v {
            GgufValue::Uint(n) => json!(n),
            GgufValue::Int(n) => json!(n),
            GgufValue::Float(x) => json!(x),
            _ => return Err(Error::ConfigField(k.clone())),
        };
        out.insert(hf.into(), value);
    }
    Ok(Some(Value::Object(out)))
}
