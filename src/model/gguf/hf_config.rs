//! GGUF metadata → the Hugging Face `config.json` the engine's own parser
//! ([`ArchSpec::from_config`]) reads, for families whose configuration has many fields
//! (`glm4moe`, `deepseek2`, `qwen3next`, `qwen35moe`): one translation of llama.cpp's keys (as its
//! `convert_hf_to_gguf.py` writes them) back into transformers' names, so each family's checks
//! and defaults live in one place. Keys that change the math and have no equivalent here are
//! refused by name.

use serde_json::{json, Map, Value};

use super::{GgufModel, GgufValue};
use crate::error::{Error, Result};
use crate::model::config::ArchSpec;

/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_*` values.
const GATING_SOFTMAX: u64 = 1;
const GATING_SIGMOID: u64 = 2;

/// Typed reads of `{arch}.*` keys.
struct Keys<'a> {
    m: &'a GgufModel,
    arch: &'static str,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    fn num(&self, k: &str) -> Option<u64> {
        self.m.get(&self.key(k)).and_then(GgufValue::as_u64)
    }
    fn req(&self, k: &str) -> Result<u64> {
        self.num(k).ok_or_else(|| Error::ConfigField(self.key(k)))
    }
    fn float(&self, k: &str) -> Option<f64> {
        self.m.get(&self.key(k)).and_then(GgufValue::as_f64)
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.m.get(&self.key(k)), Some(GgufValue::Bool(true)))
    }
}

/// The fields every family here shares: sizes, RoPE base, norms, the routed-expert block.
fn common(k: &Keys, hf_arch: &str, layers: u64) -> Result<Value> {
    let embd = k.m.info("token_embd.weight").ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))?;
    let mut cfg = json!({
        "architectures": [hf_arch],
        "hidden_size": k.req("embedding_length")?,
        "num_hidden_layers": layers,
        "intermediate_size": k.req("feed_forward_length")?,
        "moe_intermediate_size": k.req("expert_feed_forward_length")?,
        "num_attention_heads": k.req("attention.head_count")?,
        "rope_theta": k.float("rope.freq_base").unwrap_or(10000.0),
        "rms_norm_eps": k.float("attention.layer_norm_rms_epsilon").ok_or_else(|| Error::ConfigField(k.key("attention.layer_norm_rms_epsilon")))?,
        "n_routed_experts": k.req("expert_count")?,
        "num_experts_per_tok": k.req("expert_used_count")?,
        "n_shared_experts": k.num("expert_shared_count").unwrap_or(0),
        "first_k_dense_replace": k.num("leading_dense_block_count").unwrap_or(0),
        "routed_scaling_factor": k.float("expert_weights_scale").unwrap_or(1.0),
        "n_group": k.num("expert_group_count").unwrap_or(1),
        "topk_group": k.num("expert_group_used_count").unwrap_or(1),
        "vocab_size": embd.shape[0],
        "max_position_embeddings": k.num("context_length").unwrap_or(4096),
        "tie_word_embeddings": k.m.info("output.weight").is_none(),
        "hidden_act": "silu",
        "num_nextn_predict_layers": k.num("nextn_predict_layers").unwrap_or(0),
    });
    if let Some(eos) = k.m.get("tokenizer.ggml.eos_token_id").and_then(GgufValue::as_u64) {
        cfg["eos_token_id"] = json!(eos);
    }
    Ok(cfg)
}

/// The architecture of a `glm4moe` GGUF model, through the `Glm4MoeForCausalLM` config it was
/// converted from: the multi-token-prediction blocks after the main ones
/// (`nextn_predict_layers`) are not part of next-token decoding.
pub fn glm4moe(m: &GgufModel) -> Result<ArchSpec> {
    let k = Keys { m, arch: "glm4moe" };
    let blocks = k.req("block_count")?;
    let layers = blocks.checked_sub(k.num("nextn_predict_layers").unwrap_or(0));
    let mut cfg =
        common(&k, "Glm4MoeForCausalLM", layers.ok_or_else(|| Error::ConfigField(k.key("nextn_predict_layers")))?)?;
    let heads = k.req("attention.head_count")?;
    let head_dim = k.num("attention.key_length").unwrap_or(k.req("embedding_length")? / heads.max(1));
    if k.num("attention.value_length").is_some_and(|v| v != head_dim) {
        return Err(Error::UnsupportedConfig(format!("GGUF {}: value length ≠ key length", k.key("attention"))));
    }
    match k.num("expert_gating_func") {
        Some(GATING_SIGMOID) => {}
        other => {
            let key = k.key("expert_gating_func");
            return Err(Error::UnsupportedConfig(format!("GGUF {key}: {other:?} (GLM-4.5 routes by sigmoid, 2)")));
        }
    }
    let rotary = k.num("rope.dimension_count").unwrap_or(head_dim);
    let fields = json!({
        "num_key_value_heads": k.num("attention.head_count_kv").unwrap_or(heads),
        "head_dim": head_dim,
        "partial_rotary_factor": rotary as f64 / head_dim.max(1) as f64,
        "norm_topk_prob": k.flag("expert_weights_norm"),
        "use_qk_norm": m.info("blk.0.attn_q_norm.weight").is_some(),
        "attention_bias": m.info("blk.0.attn_q.bias").is_some(),
    });
    merge(&mut cfg, fields);
    if let Some(scaling) = rope_scaling(&k, false)? {
        cfg["rope_scaling"] = scaling;
    }
    ArchSpec::from_config(&cfg)
}

/// The architecture of a `deepseek2` GGUF model (DeepSeek-V2 with softmax routing, V3 with
/// sigmoid + correction bias, `expert_gating_func`), through the config it was converted from:
/// MLA's widths from `kv_lora_rank`, `q_lora_rank`, `key_length_mla`, `value_length_mla` and
/// the rotary `rope.dimension_count`; YaRN's `mscale_all_dim` from `yarn_log_multiplier`
/// (llama.cpp keeps `0.1 · mscale_all_dim` and, as it does, `mscale` is taken as 1).
pub fn deepseek2(m: &GgufModel) -> Result<ArchSpec> {
    let k = Keys { m, arch: "deepseek2" };
    let sigmoid = match k.num("expert_gating_func") {
        None | Some(GATING_SOFTMAX) => false,
        Some(GATING_SIGMOID) => true,
        Some(other) => {
            let key = k.key("expert_gating_func");
            return Err(Error::UnsupportedConfig(format!("GGUF {key}: {other} (softmax 1 or sigmoid 2)")));
        }
    };
    let hf_arch = if sigmoid { "DeepseekV3ForCausalLM" } else { "DeepseekV2ForCausalLM" };
    let mut cfg = common(&k, hf_arch, k.req("block_count")?)?;
    let rope = k.req("rope.dimension_count")?;
    let qk = k.req("attention.key_length_mla")?;
    let heads = k.req("attention.head_count")?;
    let grouped = k.num("expert_group_count").unwrap_or(1) > 1;
    let fields = json!({
        "num_key_value_heads": heads,
        "kv_lora_rank": k.req("attention.kv_lora_rank")?,
        "q_lora_rank": k.num("attention.q_lora_rank"),
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": qk.checked_sub(rope).ok_or_else(|| Error::ConfigField(k.key("attention.key_length_mla")))?,
        "v_head_dim": k.req("attention.value_length_mla")?,
        "head_dim": rope,
        "scoring_func": if sigmoid { "sigmoid" } else { "softmax" },
        "topk_method": match (sigmoid, grouped) {
            (true, _) => "noaux_tc",
            (false, true) => "group_limited_greedy",
            (false, false) => "greedy",
        },
    });
    merge(&mut cfg, fields);
    // V2 never renormalises (the parser refuses it); written only when the file asks for it.
    if k.flag("expert_weights_norm") || sigmoid {
        cfg["norm_topk_prob"] = json!(k.flag("expert_weights_norm"));
    }
    if let Some(scaling) = rope_scaling(&k, true)? {
        cfg["rope_scaling"] = scaling;
    }
    ArchSpec::from_config(&cfg)
}

/// The architecture of a `gpt-oss` GGUF model, through the `GptOssForCausalLM` config it was
/// converted from. llama.cpp keeps no key for what it hardcodes: the clamped SwiGLU's alpha
/// 1.702 and limit 7.0 (transformers' defaults) and YaRN without truncation (transformers'
/// gpt-oss default, `truncate: false`); sliding windows on even layers unless
/// `attention.sliding_window_pattern` says otherwise (refused: only llama.cpp's default, 2, is
/// read), and no separate base for the windowed layers (`rope.freq_base_swa` refused unless
/// equal).
pub fn gpt_oss(m: &GgufModel) -> Result<ArchSpec> {
    let k = Keys { m, arch: "gpt-oss" };
    let layers = k.req("block_count")?;
    let mut cfg = common(&k, "GptOssForCausalLM", layers)?;
    let heads = k.req("attention.head_count")?;
    let pattern = k.key("attention.sliding_window_pattern");
    if m.get(&pattern).is_some_and(|v| v.as_u64() != Some(2)) {
        return Err(Error::UnsupportedConfig(format!("GGUF {pattern} other than 2")));
    }
    if k.float("rope.freq_base_swa").is_some_and(|b| Some(b) != k.float("rope.freq_base")) {
        let key = k.key("rope.freq_base_swa");
        return Err(Error::UnsupportedConfig(format!("GGUF {key} differs from rope.freq_base")));
    }
    let fields = json!({
        "num_local_experts": k.req("expert_count")?,
        "intermediate_size": k.req("expert_feed_forward_length")?,
        "num_key_value_heads": k.num("attention.head_count_kv").unwrap_or(heads),
        "head_dim": k.num("attention.key_length").unwrap_or(k.req("embedding_length")? / heads.max(1)),
        "sliding_window": k.req("attention.sliding_window")?,
        "attention_bias": m.info("blk.0.attn_q.bias").is_some(),
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
    });
    merge(&mut cfg, fields);
    if k.num("attention.value_length").is_some_and(|v| Some(v) != cfg["head_dim"].as_u64()) {
        return Err(Error::UnsupportedConfig(format!("GGUF {}: value length ≠ key length", k.key("attention"))));
    }
    let mut scaling = rope_scaling(&k, false)?.unwrap_or_else(|| json!({"type": "default"}));
    if scaling["type"] == "yarn" {
        scaling["truncate"] = json!(false);
    }
    cfg["rope_scaling"] = scaling;
    ArchSpec::from_config(&cfg)
}

/// The architecture of a `qwen3next` or `qwen35moe` GGUF model (Gated DeltaNet layers between
/// gated full-attention layers, every layer MoE with a gated shared expert), through the
/// `Qwen3NextForCausalLM` / `Qwen3_5MoeForCausalLM` config it was converted from: the DeltaNet's
/// sizes from the `ssm.*` keys (`group_count` key heads, `time_step_rank` value heads,
/// `state_size` key width, `inner_size` all value heads' width), the layer pattern from
/// `attention.recurrent_layers` (else `full_attention_interval`), the output gate from
/// `attn_q`'s doubled rows. llama.cpp stores the in-projection split (`attn_qkv`, `attn_gate`,
/// `ssm_ba` or `ssm_beta` + `ssm_alpha`), so the spec reads it split
/// (`fused_projection: false`) whatever the family.
pub fn hybrid(m: &GgufModel, arch: &'static str) -> Result<ArchSpec> {
    let k = Keys { m, arch };
    let hf_arch = if arch == "qwen3next" { "Qwen3NextForCausalLM" } else { "Qwen3_5MoeForCausalLM" };
    let blocks = k.req("block_count")?;
    let layers = blocks
        .checked_sub(k.num("nextn_predict_layers").unwrap_or(0))
        .ok_or_else(|| Error::ConfigField(k.key("nextn_predict_layers")))?;
    if let Some(v) = m.get(&k.key("rope.scaling.type")).filter(|v| v.as_str() != Some("none")) {
        return Err(Error::UnsupportedConfig(format!("GGUF {} {v:?} is not supported", k.key("rope.scaling.type"))));
    }
    let embd = m.info("token_embd.weight").ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))?;
    let heads = k.req("attention.head_count")?;
    let head_dim = k.num("attention.key_length").unwrap_or(k.req("embedding_length")? / heads.max(1));
    if k.num("attention.value_length").is_some_and(|v| v != head_dim) {
        return Err(Error::UnsupportedConfig(format!("GGUF {}: value length ≠ key length", k.key("attention"))));
    }
    let v_heads = k.req("ssm.time_step_rank")?;
    let layer_types = match m.get(&k.key("attention.recurrent_layers")).and_then(GgufValue::as_array) {
        Some(flags) => flags
            .iter()
            .take(layers as usize)
            .map(|f| match f {
                GgufValue::Bool(true) => Ok("linear_attention"),
                GgufValue::Bool(false) => Ok("full_attention"),
                _ => Err(Error::ConfigField(k.key("attention.recurrent_layers"))),
            })
            .collect::<Result<Vec<_>>>()?,
        None => {
            let interval = k.num("full_attention_interval").unwrap_or(4).max(1);
            (0..layers).map(|i| if (i + 1) % interval == 0 { "full_attention" } else { "linear_attention" }).collect()
        }
    };
    // The output gate doubles the query projection of the full-attention layers.
    let full = layer_types.iter().position(|t| *t == "full_attention");
    let q_rows = full.and_then(|i| m.info(&format!("blk.{i}.attn_q.weight"))).map(|t| t.shape[0] as u64);
    let mut cfg = json!({
        "architectures": [hf_arch],
        "hidden_size": k.req("embedding_length")?,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": k.num("attention.head_count_kv").unwrap_or(heads),
        "head_dim": head_dim,
        "rms_norm_eps": k.float("attention.layer_norm_rms_epsilon").ok_or_else(|| Error::ConfigField(k.key("attention.layer_norm_rms_epsilon")))?,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": k.float("rope.freq_base").unwrap_or(10000.0),
            "partial_rotary_factor": k.num("rope.dimension_count").unwrap_or(head_dim / 4) as f64 / head_dim.max(1) as f64,
        },
        "vocab_size": embd.shape[0],
        "max_position_embeddings": k.num("context_length").unwrap_or(4096),
        "tie_word_embeddings": m.info("output.weight").is_none(),
        "hidden_act": "silu",
        "num_experts": k.req("expert_count")?,
        "num_experts_per_tok": k.req("expert_used_count")?,
        "moe_intermediate_size": k.req("expert_feed_forward_length")?,
        "shared_expert_intermediate_size": k.num("expert_shared_feed_forward_length").unwrap_or(0),
        "norm_topk_prob": m.get(&k.key("expert_weights_norm")).is_none_or(|v| matches!(v, GgufValue::Bool(true))),
        "decoder_sparse_step": 1,
        "mtp_num_hidden_layers": blocks - layers,
        "layer_types": layer_types,
        "linear_conv_kernel_dim": k.req("ssm.conv_kernel")?,
        "linear_key_head_dim": k.req("ssm.state_size")?,
        "linear_num_key_heads": k.req("ssm.group_count")?,
        "linear_num_value_heads": v_heads,
        "linear_value_head_dim": k.req("ssm.inner_size")? / v_heads.max(1),
        "attn_output_gate": q_rows == Some(2 * heads * head_dim),
    });
    if let Some(eos) = m.get("tokenizer.ggml.eos_token_id").and_then(GgufValue::as_u64) {
        cfg["eos_token_id"] = json!(eos);
    }
    if let Some(ff) = k.num("feed_forward_length") {
        cfg["intermediate_size"] = json!(ff);
    }
    let mut spec = ArchSpec::from_config(&cfg)?;
    if let Some(h) = spec.hybrid.as_mut() {
        h.fused_projection = false;
    }
    Ok(spec)
}

/// Adds `fields` (an object) to `cfg`.
fn merge(cfg: &mut Value, fields: Value) {
    if let (Some(c), Value::Object(f)) = (cfg.as_object_mut(), fields) {
        c.extend(f);
    }
}

/// `rope_scaling` from `{arch}.rope.scaling.*`: none, or YaRN with the keys transformers names
/// (`yarn_log_multiplier` only where llama.cpp's `deepseek2` defines it: `0.1 · mscale_all_dim`);
/// other types and keys are refused by name.
fn rope_scaling(k: &Keys, log_multiplier: bool) -> Result<Option<Value>> {
    let prefix = k.key("rope.scaling.");
    match k.m.get(&format!("{prefix}type")) {
        None => return Ok(None),
        Some(GgufValue::String(s)) if s == "none" => return Ok(None),
        Some(GgufValue::String(s)) if s == "yarn" => {}
        Some(v) => return Err(Error::UnsupportedConfig(format!("GGUF {prefix}type {v:?} is not supported"))),
    }
    let mut out = Map::new();
    out.insert("type".into(), json!("yarn"));
    for (key, v) in k.m.metadata.range(prefix.clone()..) {
        let Some(field) = key.strip_prefix(&prefix) else { break };
        let value = match v {
            GgufValue::Uint(n) => json!(n),
            GgufValue::Int(n) => json!(n),
            GgufValue::Float(x) => json!(x),
            _ if field == "type" => continue,
            _ => return Err(Error::ConfigField(key.clone())),
        };
        let hf = match field {
            "factor" => "factor",
            "original_context_length" => "original_max_position_embeddings",
            "yarn_beta_fast" => "beta_fast",
            "yarn_beta_slow" => "beta_slow",
            "yarn_log_multiplier" if log_multiplier => {
                out.insert("mscale".into(), json!(1.0));
                out.insert("mscale_all_dim".into(), json!(v.as_f64().unwrap_or(0.0) / 0.1));
                continue;
            }
            _ => {
                return Err(Error::UnsupportedConfig(format!(
                    "GGUF {key} is not supported (it changes the rotary math)"
                )))
            }
        };
        out.insert(hf.into(), value);
    }
    Ok(Some(Value::Object(out)))
}
