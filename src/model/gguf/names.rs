//! llama.cpp tensor names (`blk.N.attn_q.weight`, stacked `blk.N.ffn_gate_exps.weight`, ...)
//! → the Hugging Face names the rest of moestream reads ([`crate::model::names`]).

use crate::model::config::{ArchSpec, Family};
use crate::model::names;

/// Where a Hugging Face tensor lies inside a GGUF tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Mapped {
    /// Hugging Face name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// First row inside the GGUF tensor (viewed as `[rows, cols]`).
    pub first_row: usize,
    /// Rows of the GGUF q/k projection to put back in Hugging Face order, per this many heads
    /// (llama arch only, see [`crate::model::weights`]).
    pub unpermute_heads: Option<usize>,
}

/// The Hugging Face tensors that GGUF tensor `name` of `shape` (outermost first) holds, or
/// `None` when moestream has no use for it (the caller refuses the file).
pub fn hf_tensors(spec: &ArchSpec, name: &str, shape: &[usize]) -> Option<Vec<Mapped>> {
    let whole =
        |hf: String| Some(vec![Mapped { name: hf, shape: shape.to_vec(), first_row: 0, unpermute_heads: None }]);
    match name {
        "token_embd.weight" => return whole(names::EMBED.into()),
        "output_norm.weight" => return whole(names::FINAL_NORM.into()),
        "output.weight" => return whole(names::LM_HEAD.into()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let i: usize = layer.parse().ok()?;
    if i >= spec.layers {
        // GLM-4.5's multi-token-prediction blocks follow its layers; next-token decoding does
        // not use them.
        return (spec.family == Family::Glm4Moe).then(Vec::new);
    }
    let p = names::layer(i);
    let a = format!("{p}.self_attn");
    let ffn = names::ffn_prefix(spec.family, i);
    let shared = names::shared_expert(spec.family, i);
    let llama_rope = matches!(spec.family, Family::Llama | Family::Mixtral);
    let permuted = |hf: String, heads: usize| {
        Some(vec![Mapped {
            name: hf,
            shape: shape.to_vec(),
            first_row: 0,
            unpermute_heads: llama_rope.then_some(heads),
        }])
    };
    let proj = |k: usize| -> Option<Vec<Mapped>> {
        let [e, rows, cols] = shape[..] else { return None };
        Some(
            (0..e)
                .map(|x| Mapped {
                    name: names::expert(spec.family, i, x)[k].clone(),
                    shape: vec![rows, cols],
                    first_row: x * rows,
                    unpermute_heads: None,
                })
                .collect(),
        )
    };
    match leaf {
        "attn_norm.weight" => whole(format!("{p}.input_layernorm.weight")),
        "ffn_norm.weight" => whole(format!("{p}.post_attention_layernorm.weight")),
        // GLM-4.5's FFN norm (llama.cpp names it after the Hugging Face module).
        "post_attention_norm.weight" if matches!(spec.family, Family::Glm4Moe | Family::GptOss) => {
            whole(format!("{p}.post_attention_layernorm.weight"))
        }
        "exp_probs_b.bias" => whole(names::router_bias(spec.family, i)),
        "attn_q.weight" => permuted(format!("{a}.q_proj.weight"), spec.heads),
        "attn_k.weight" => permuted(format!("{a}.k_proj.weight"), spec.kv_heads),
        "attn_v.weight" => whole(format!("{a}.v_proj.weight")),
        // MLA (deepseek2). Newer llama.cpp splits kv_b into attn_k_b + attn_v_b, which
        // `Checkpoint::from_gguf` puts back together.
        "attn_q_a.weight" => whole(format!("{a}.q_a_proj.weight")),
        "attn_q_a_norm.weight" => whole(format!("{a}.q_a_layernorm.weight")),
        "attn_q_b.weight" => whole(format!("{a}.q_b_proj.weight")),
        "attn_kv_a_mqa.weight" => whole(format!("{a}.kv_a_proj_with_mqa.weight")),
        "attn_kv_a_norm.weight" => whole(format!("{a}.kv_a_layernorm.weight")),
        "attn_kv_b.weight" => whole(format!("{a}.kv_b_proj.weight")),
        "attn_output.weight" => whole(format!("{a}.o_proj.weight")),
        // gpt-oss: o_proj's bias, the sinks, the router's bias and the experts' biases
        // (`[experts, rows]`, gate and up apart: `gpt_oss_weights` reads them under these names).
        "attn_output.bias" => whole(format!("{a}.o_proj.bias")),
        "attn_sinks.weight" => whole(format!("{a}.sinks")),
        "ffn_gate_inp.bias" => whole(names::router_logit_bias(spec.family, i)),
        "ffn_gate_exps.bias" => whole(names::gpt_oss_experts(i, "gate_proj_bias")),
        "ffn_up_exps.bias" => whole(names::gpt_oss_experts(i, "up_proj_bias")),
        "ffn_down_exps.bias" => whole(names::gpt_oss_experts(i, "down_proj_bias")),
        "attn_q.bias" => whole(format!("{a}.q_proj.bias")),
        "attn_k.bias" => whole(format!("{a}.k_proj.bias")),
        "attn_v.bias" => whole(format!("{a}.v_proj.bias")),
        "attn_q_norm.weight" => whole(format!("{a}.q_norm.weight")),
        "attn_k_norm.weight" => whole(format!("{a}.k_norm.weight")),
        "ffn_gate.weight" => whole(format!("{p}.mlp.gate_proj.weight")),
        "ffn_up.weight" => whole(format!("{p}.mlp.up_proj.weight")),
        "ffn_down.weight" => whole(format!("{p}.mlp.down_proj.weight")),
        "ffn_gate_inp.weight" => whole(names::router(spec.family, i)),
        "ffn_gate_exps.weight" => proj(0),
        "ffn_up_exps.weight" => proj(1),
        "ffn_down_exps.weight" => proj(2),
        "ffn_gate_shexp.weight" => whole(format!("{shared}.gate_proj.weight")),
        "ffn_up_shexp.weight" => whole(format!("{shared}.up_proj.weight")),
        "ffn_down_shexp.weight" => whole(format!("{shared}.down_proj.weight")),
        // Stored as a vector by llama.cpp, a [1, hidden] matrix by Hugging Face.
        "ffn_gate_inp_shexp.weight" => Some(vec![Mapped {
            name: format!("{ffn}.shared_expert_gate.weight"),
            shape: [&[1][..], shape].concat(),
            first_row: 0,
            unpermute_heads: None,
        }]),
        _ => None,
    }
}
