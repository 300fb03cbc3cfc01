//! Ling's (`BailingHybridForCausalLM`) config as transformers' `BailingHybridConfig` reads it,
//! rewritten into the keys the other parsers read: its attribute-map names (what
//! transformers writes: `num_experts_per_token`, `num_expert_group`, `num_shared_experts`,
//! `moe_renormalize`, `model_max_length`) become the DeepSeek ones, its KDA sizes
//! (`linear_num_heads` or `num_attention_heads`, `linear_head_dim` or `head_dim`,
//! `linear_conv_kernel_dim` or `short_conv_kernel_size`) become the hybrid block's, and its
//! defaults are filled in. (Its layer pattern, `layer_group_size`: the last layer of every
//! group is MLA, is read by the hybrid block's parser.)

use serde_json::{json, Map, Value};

use super::fields::get;

/// transformers' attribute map of `BailingHybridConfig`: (name written, name read here).
const ALIASES: &[(&str, &str)] = &[
    ("num_experts_per_token", "num_experts_per_tok"),
    ("num_expert_group", "n_group"),
    ("num_shared_experts", "n_shared_experts"),
    ("moe_renormalize", "norm_topk_prob"),
    ("model_max_length", "max_position_embeddings"),
];

/// `BailingHybridConfig`'s defaults of the fields that change the math (the KDA sizes
/// are derived below).
fn defaults() -> Value {
    json!({
        "num_experts": 512,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "n_shared_experts": 1,
        "norm_topk_prob": true,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 2,
        "max_position_embeddings": 262144,
        "rope_theta": 6_000_000.0,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "kda_safe_gate": true,
        "kda_lower_bound": -5.0,
        "rms_norm_eps": 1e-6,
    })
}

/// `cfg` with its aliases renamed, its defaults filled in and the hybrid block's keys derived.
/// A key given under both names keeps the one read here.
pub(super) fn with_defaults(cfg: &Value) -> Value {
    let mut out: Map<String, Value> = cfg.as_object().cloned().unwrap_or_default();
    for (alias, name) in ALIASES {
        if let (Some(v), None) = (get(cfg, alias), get(cfg, name)) {
            out.insert(name.to_string(), v.clone());
        }
    }
    if let Value::Object(d) = defaults() {
        for (k, v) in d {
            if out.get(&k).is_none_or(Value::is_null) {
                out.insert(k, v);
            }
        }
    }
    let first = |keys: &[&str], default: Value| {
        keys.iter().find_map(|k| out.get(*k).filter(|v| !v.is_null()).cloned()).unwrap_or(default)
    };
    let heads = first(&["linear_num_heads", "num_attention_heads"], Value::Null);
    let dim = first(&["linear_head_dim", "head_dim"], json!(128));
    let kernel = first(&["linear_conv_kernel_dim", "short_conv_kernel_size"], json!(4));
    for (k, v) in [
        ("linear_num_key_heads", &heads),
        ("linear_num_value_heads", &heads),
        ("linear_key_head_dim", &dim),
        ("linear_value_head_dim", &dim),
        ("linear_conv_kernel_dim", &kernel),
    ] {
        out.insert(k.to_string(), v.clone());
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_and_kda_sizes() {
        let cfg = with_defaults(&json!({
            "num_attention_heads": 4, "head_dim": 8, "linear_head_dim": 16,
            "num_experts_per_token": 2, "moe_renormalize": false, "short_conv_kernel_size": 3,
        }));
        assert_eq!(cfg["num_experts_per_tok"], 2);
        assert_eq!(cfg["norm_topk_prob"], false);
        assert_eq!(cfg["linear_key_head_dim"], 16);
        assert_eq!(cfg["linear_num_value_heads"], 4);
        assert_eq!(cfg["linear_conv_kernel_dim"], 3);
        assert_eq!(cfg["rope_theta"], 6_000_000.0);
        // A hub config's head_dim is the KDA head width.
        assert_eq!(with_defaults(&json!({"head_dim": 128}))["linear_value_head_dim"], 128);
    }
}
