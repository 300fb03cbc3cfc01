//! The routed-expert block of MoE families: experts, top-k, routing rule, shared experts and
//! which layers are MoE.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fields::{bool_field, f32_field, get, opt_usize, usize_field};
use super::routing::{self, RoutingKind};
use super::Family;
use crate::error::{Error, Result};

/// The routed-expert part of an MoE architecture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeSpec {
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Intermediate size of one routed expert.
    pub expert_intermediate: usize,
    /// How the router scores and chooses experts.
    pub routing: RoutingKind,
    /// Renormalise the top-k router weights to sum to one.
    pub norm_topk_prob: bool,
    /// Multiplier of the routed experts' weights (after any renormalisation).
    pub routed_scaling_factor: f32,
    /// Intermediate size of the always-on shared expert(s), resident beside the routed ones
    /// (Qwen2-MoE's one; DeepSeek's and GLM's `n_shared_experts * moe_intermediate_size`).
    pub shared_expert_intermediate: Option<usize>,
    /// The shared expert's output is scaled by a sigmoid gate `[1, hidden]` (Qwen2-MoE).
    pub shared_expert_gate: bool,
    /// The router's logits have a bias (`mlp.router.bias`, gpt-oss), added before top-k.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub router_logit_bias: bool,
    /// The routed experts' activation (and whether their projections have biases).
    #[serde(default, skip_serializing_if = "ExpertAct::is_swiglu")]
    pub expert_act: ExpertAct,
}

/// The routed experts' activation between gate/up and down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum ExpertAct {
    /// `silu(gate) * up`, no biases.
    #[default]
    SwiGlu,
    /// gpt-oss: gate/up/down have biases; `gate = min(gate, limit)`, `up = clamp(up, ±limit)`,
    /// `(up + 1) * gate * sigmoid(alpha * gate)`.
    ClampedSwiGlu {
        /// `swiglu_alpha` (sigmoid gain).
        alpha: f32,
        /// `swiglu_limit`.
        limit: f32,
    },
}

impl ExpertAct {
    /// Whether this is the plain SwiGLU.
    pub fn is_swiglu(&self) -> bool {
        *self == ExpertAct::SwiGlu
    }

    /// Whether the experts' projections have biases (resident per expert, see
    /// `MoeWeights::expert_bias`).
    pub fn has_bias(&self) -> bool {
        matches!(self, ExpertAct::ClampedSwiGlu { .. })
    }
}

/// Ling's `mlp_layer_types`: per layer `dense` or `sparse` (MoE).
fn mlp_layer_types(types: &Value, layers: usize) -> Result<Vec<bool>> {
    let types = types.as_array().ok_or_else(|| Error::ConfigField("mlp_layer_types".into()))?;
    if types.len() != layers {
        return Err(Error::UnsupportedConfig(format!(
            "mlp_layer_types has {} entries for {layers} layers",
            types.len()
        )));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("sparse") => Ok(true),
            Some("dense") => Ok(false),
            other => Err(Error::UnsupportedConfig(format!("MLP layer type {other:?} is not implemented"))),
        })
        .collect()
}

/// The routed-expert block and which layers run it, `(None, all false)` for dense families.
pub(super) fn parse(
    cfg: &Value,
    family: Family,
    layers: usize,
    dense_intermediate: usize,
) -> Result<(Option<MoeSpec>, Vec<bool>)> {
    use Family::*;
    if matches!(family, Llama | Qwen2 | Qwen3) {
        return Ok((None, vec![false; layers]));
    }
    let deepseek_like = matches!(family, DeepseekV2 | DeepseekV3 | Glm4Moe | BailingHybrid);
    let num_experts = opt_usize(cfg, "num_local_experts")?
        .or(opt_usize(cfg, "num_experts")?)
        .or(opt_usize(cfg, "n_routed_experts")?)
        .ok_or_else(|| Error::ConfigField("num_experts".into()))?;
    let top_k = match (family, opt_usize(cfg, "num_experts_per_tok")?) {
        // Hub gpt-oss configs also carry `experts_per_token`.
        (GptOss, None) => usize_field(cfg, "experts_per_token")?,
        (_, k) => k.ok_or_else(|| Error::ConfigField("num_experts_per_tok".into()))?,
    };
    if top_k == 0 || top_k > num_experts {
        return Err(Error::UnsupportedConfig(format!("num_experts_per_tok {top_k} not in 1..={num_experts}")));
    }
    let expert_intermediate = match family {
        Mixtral | Olmoe | GptOss => dense_intermediate,
        _ => usize_field(cfg, "moe_intermediate_size")?,
    };
    let (shared, shared_gate) = match family {
        Qwen2Moe | Qwen3Next | Qwen35Moe => {
            (opt_usize(cfg, "shared_expert_intermediate_size")?.filter(|&s| s > 0), true)
        }
        _ if deepseek_like => {
            let n = opt_usize(cfg, "n_shared_experts")?.unwrap_or(if family == DeepseekV2 { 2 } else { 1 });
            ((n > 0).then_some(n * expert_intermediate), false)
        }
        _ => (None, false),
    };
    let routing = match family {
        DeepseekV2 => routing::parse_softmax_topk_method(cfg, num_experts, top_k)?,
        DeepseekV3 | BailingHybrid => routing::parse_noaux_tc(cfg, num_experts, top_k, (8, 4))?,
        Glm4Moe => routing::parse_noaux_tc(cfg, num_experts, top_k, (1, 1))?,
        _ => RoutingKind::Softmax,
    };
    let norm_topk_prob = match family {
        // gpt-oss: top-k of the logits, softmax over those k (== softmax, top-k, renormalise).
        Mixtral | GptOss => true,
        // transformers' DeepSeek-V2 never renormalises (the original code did when asked):
        // refuse rather than pick one.
        DeepseekV2 if bool_field(cfg, "norm_topk_prob", false)? => {
            return Err(Error::UnsupportedConfig(
                "norm_topk_prob with DeepSeek-V2 routing is not implemented (transformers ignores it)".into(),
            ))
        }
        DeepseekV3 | Glm4Moe | Qwen3Next | BailingHybrid => bool_field(cfg, "norm_topk_prob", true)?,
        // transformers' Qwen3.5-MoE router always renormalises (it has no such field).
        Qwen35Moe => true,
        _ => bool_field(cfg, "norm_topk_prob", false)?,
    };
    let routed_scaling_factor = if deepseek_like {
        f32_field(cfg, "routed_scaling_factor", if family == DeepseekV3 { 2.5 } else { 1.0 })?
    } else {
        1.0
    };
    let moe_layers: Vec<bool> = if let (BailingHybrid, Some(types)) = (family, get(cfg, "mlp_layer_types")) {
        mlp_layer_types(types, layers)?
    } else if deepseek_like {
        let first_dense = opt_usize(cfg, "first_k_dense_replace")?.unwrap_or(match family {
            DeepseekV3 => 3,
            Glm4Moe => 1,
            _ => 0,
        });
        if let Some(freq) = opt_usize(cfg, "moe_layer_freq")?.filter(|&f| f != 1) {
            return Err(Error::UnsupportedConfig(format!(
                "moe_layer_freq {freq} is not implemented (transformers treats every layer from first_k_dense_replace as MoE)"
            )));
        }
        (0..layers).map(|i| i >= first_dense).collect()
    } else {
        let step = opt_usize(cfg, "decoder_sparse_step")?.unwrap_or(1).max(1);
        let mlp_only: Vec<usize> = get(cfg, "mlp_only_layers")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).map(|v| v as usize).collect())
            .unwrap_or_default();
        let uses_step = matches!(family, Qwen2Moe | Qwen3Moe | Qwen3Next);
        (0..layers).map(|i| !uses_step || (!mlp_only.contains(&i) && (i + 1) % step == 0)).collect()
    };
    let expert_act = match family {
        GptOss => {
            let (alpha, limit) = (f32_field(cfg, "swiglu_alpha", 1.702)?, f32_field(cfg, "swiglu_limit", 7.0)?);
            if !(alpha.is_finite() && limit.is_finite() && limit > 0.0) {
                return Err(Error::UnsupportedConfig(format!(
                    "swiglu_alpha {alpha} / swiglu_limit {limit} must be finite (the limit positive)"
                )));
            }
            ExpertAct::ClampedSwiGlu { alpha, limit }
        }
        _ => ExpertAct::SwiGlu,
    };
    let spec = MoeSpec {
        num_experts,
        top_k,
        expert_intermediate,
        routing,
        norm_topk_prob,
        routed_scaling_factor,
        shared_expert_intermediate: shared,
        shared_expert_gate: shared_gate,
        router_logit_bias: family == GptOss,
        expert_act,
    };
    Ok((Some(spec), moe_layers))
}
