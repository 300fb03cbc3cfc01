//! Tensor names of each family's checkpoints.

use super::config::Family;

/// The prefix of decoder layer `i`.
pub fn layer(i: usize) -> String {
    format!("model.layers.{i}")
}

/// The name transformers gives tensor `name` of a Ling (`BailingHybrid`) checkpoint, as its
/// conversion mapping renames them on load: `model.word_embeddings` → `model.embed_tokens`,
/// `attention` → `self_attn`, `attention.dense` → `self_attn.o_proj`, KDA's `f_proj`,
/// `dt_bias` and `A_log` under `self_attn.forget_gate`, `mlp.gate.expert_bias` →
/// `mlp.gate.e_score_correction_bias`. `None` when `name` needs no renaming. (The split
/// `q/k/v_conv1d` taps keep their names; transformers concatenates them.)
pub fn from_ling(name: &str) -> Option<String> {
    let mut n = match name.strip_prefix("model.word_embeddings.") {
        Some(rest) => format!("model.embed_tokens.{rest}"),
        None => name.to_string(),
    };
    n = n.replace(".attention.", ".self_attn.").replace(".self_attn.dense.", ".self_attn.o_proj.");
    for t in ["f_proj.", "dt_bias", "A_log"] {
        n = n.replace(&format!(".self_attn.{t}"), &format!(".self_attn.forget_gate.{t}"));
    }
    n = n.replace(".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias");
    (n != name).then_some(n)
}

/// The name an MTP module's tensor in Qwen3-Next's `mtp.*` layout takes as layer `layers` of a
/// model of `layers` decoder layers, in DeepSeek-V3's layout ([`crate::model::mtp`]):
/// `mtp.layers.0.*` → `model.layers.{layers}.*`, `mtp.fc` → `eh_proj`,
/// `mtp.pre_fc_norm_embedding` → `enorm`, `mtp.pre_fc_norm_hidden` → `hnorm`, `mtp.norm` →
/// `shared_head.norm`. `None` for other tensors (and further MTP layers, which are not run).
pub fn from_mtp(name: &str, layers: usize) -> Option<String> {
    let rest = name.strip_prefix("mtp.")?;
    let p = layer(layers);
    if let Some(t) = rest.strip_prefix("layers.0.") {
        return Some(format!("{p}.{t}"));
    }
    let to = match rest {
        "fc.weight" => "eh_proj.weight",
        "pre_fc_norm_embedding.weight" => "enorm.weight",
        "pre_fc_norm_hidden.weight" => "hnorm.weight",
        "norm.weight" => "shared_head.norm.weight",
        _ => return None,
    };
    Some(format!("{p}.{to}"))
}

/// Token embedding matrix `[vocab, hidden]`.
pub const EMBED: &str = "model.embed_tokens.weight";
/// Final RMSNorm weight.
pub const FINAL_NORM: &str = "model.norm.weight";
/// Output projection `[vocab, hidden]` (absent when tied).
pub const LM_HEAD: &str = "lm_head.weight";

/// The module holding a layer's FFN block.
pub fn ffn_prefix(family: Family, layer_index: usize) -> String {
    let block = if family == Family::Mixtral { "block_sparse_moe" } else { "mlp" };
    format!("{}.{block}", layer(layer_index))
}

/// Names of one routed expert's (gate, up, down) projections, in the per-expert layout that
/// Hugging Face hub checkpoints use.
pub fn expert(family: Family, layer_index: usize, e: usize) -> [String; 3] {
    let p = format!("{}.experts.{e}", ffn_prefix(family, layer_index));
    if family == Family::Mixtral {
        [format!("{p}.w1.weight"), format!("{p}.w3.weight"), format!("{p}.w2.weight")]
    } else {
        [format!("{p}.gate_proj.weight"), format!("{p}.up_proj.weight"), format!("{p}.down_proj.weight")]
    }
}

/// Names of a layer's fused expert tensors (transformers-5 layout): `gate_up_proj`
/// `[experts, 2 * intermediate, hidden]` and `down_proj` `[experts, hidden, intermediate]`.
pub fn fused_experts(family: Family, layer_index: usize) -> [String; 2] {
    let p = format!("{}.experts", ffn_prefix(family, layer_index));
    [format!("{p}.gate_up_proj"), format!("{p}.down_proj")]
}

/// Name of a layer's router weight `[experts, hidden]`.
pub fn router(family: Family, layer_index: usize) -> String {
    format!("{}.{}.weight", ffn_prefix(family, layer_index), router_module(family))
}

/// Name of a layer's router logit bias `[experts]` (gpt-oss).
pub fn router_logit_bias(family: Family, layer_index: usize) -> String {
    format!("{}.{}.bias", ffn_prefix(family, layer_index), router_module(family))
}

fn router_module(family: Family) -> &'static str {
    match family {
        Family::GptOss => "router",
        _ => "gate",
    }
}

/// gpt-oss's stacked expert tensors of a layer, under `mlp.experts.`: `gate_up_proj`
/// `[experts, hidden, 2 * inter]` (gate and up columns interleaved), `down_proj`
/// `[experts, inter, hidden]`, their biases, and the MXFP4 `*_blocks` / `*_scales`.
pub fn gpt_oss_experts(layer_index: usize, tensor: &str) -> String {
    format!("{}.mlp.experts.{tensor}", layer(layer_index))
}

/// Name of a layer's router correction bias `[experts]` (sigmoid routing).
pub fn router_bias(family: Family, layer_index: usize) -> String {
    format!("{}.gate.e_score_correction_bias", ffn_prefix(family, layer_index))
}

/// The module of a layer's shared expert(s): `shared_expert` (Qwen2-MoE) or `shared_experts`
/// (DeepSeek, GLM-4.5, Ling).
pub fn shared_expert(family: Family, layer_index: usize) -> String {
    let module = match family {
        Family::DeepseekV2 | Family::DeepseekV3 | Family::Glm4Moe | Family::BailingHybrid => "shared_experts",
        _ => "shared_expert",
    };
    format!("{}.{module}", ffn_prefix(family, layer_index))
}

/// Names of a plain SwiGLU MLP's (gate, up, down) under module `prefix`.
pub fn mlp(prefix: &str) -> [String; 3] {
    [format!("{prefix}.gate_proj.weight"), format!("{prefix}.up_proj.weight"), format!("{prefix}.down_proj.weight")]
}

#[cfg(test)]
mod tests {
    use super::from_ling;

    #[test]
    fn ling_names_become_transformers_names_once() {
        let cases = [
            ("model.word_embeddings.weight", "model.embed_tokens.weight"),
            ("model.layers.1.attention.dense.weight", "model.layers.1.self_attn.o_proj.weight"),
            ("model.layers.0.attention.f_proj.weight", "model.layers.0.self_attn.forget_gate.f_proj.weight"),
            ("model.layers.0.attention.A_log", "model.layers.0.self_attn.forget_gate.A_log"),
            ("model.layers.0.attention.q_conv1d.weight", "model.layers.0.self_attn.q_conv1d.weight"),
            ("model.layers.2.mlp.gate.expert_bias", "model.layers.2.mlp.gate.e_score_correction_bias"),
        ];
        for (ling, hf) in cases {
            assert_eq!(from_ling(ling).as_deref(), Some(hf));
            assert_eq!(from_ling(hf), None, "{hf} is already a transformers name");
        }
        assert_eq!(from_ling("model.layers.1.mlp.experts.3.up_proj.weight"), None);
    }
}
