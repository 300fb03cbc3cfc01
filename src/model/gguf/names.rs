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
    /// What llama.cpp's converter changed, undone on reading.
    pub fix: Fix,
}

/// How llama.cpp's converter changed a tensor from its Hugging Face form, undone on reading
/// (see [`crate::model::weights`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fix {
    /// Hugging Face row `r` (outermost index) is row `rows[r]` of the GGUF tensor (from
    /// `first_row`): the interleaved-RoPE q/k rows of `llama`, the tiled value heads of
    /// `qwen35moe`, the per-key-head groups of `qwen3next`'s `ssm_ba`. Whole rows move, so a
    /// quantized matrix keeps its blocks.
    pub rows: Option<Vec<usize>>,
    /// What was done to the values.
    pub values: Values,
}

/// A change to a tensor's values (see [`Fix`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Values {
    /// Stored as they are.
    #[default]
    Same,
    /// Stored as `w + 1` (the zero-centred norms of `qwen3next` / `qwen35moe`).
    PlusOne,
    /// Stored as `-exp(w)` (`ssm_a` from `A_log`).
    NegExp,
    /// Hugging Face column `c` is stored column `cols[c]` (`qwen35moe`'s `ssm_out` over tiled
    /// value heads); read dequantized, since columns cross a row's blocks.
    Columns(Vec<usize>),
}

impl Mapped {
    fn whole(name: String, shape: &[usize], fix: Fix) -> Mapped {
        Mapped { name, shape: shape.to_vec(), first_row: 0, fix }
    }
}

/// Rows of `heads` heads of `2 * half` rows each, llama.cpp's interleaved order (row
/// `(h, j, s)` holds Hugging Face row `(h, s, j)`, `s < 2`, `j < half`) back to halves.
fn unpermute_rope(heads: usize, half: usize) -> Vec<usize> {
    (0..heads * 2 * half)
        .map(|r| {
            let (h, s, j) = (r / (2 * half), (r / half) % 2, r % half);
            h * 2 * half + 2 * j + s
        })
        .collect()
}

/// `qwen35moe`'s value heads back from tiled to grouped order: Hugging Face head `g * r + j`
/// (value head `j` of key head `g`, `r` per key head) is stored as head `j * nk + g`;
/// `width` rows per head.
fn untile(nk: usize, r: usize, width: usize) -> Vec<usize> {
    (0..nk * r * width)
        .map(|i| {
            let (head, d) = (i / width, i % width);
            ((head % r) * nk + head / r) * width + d
        })
        .collect()
}

/// The Hugging Face tensors that GGUF tensor `name` of `shape` (outermost first) holds, or
/// `None` when moestream has no use for it (the caller refuses the file).
pub fn hf_tensors(spec: &ArchSpec, name: &str, shape: &[usize]) -> Option<Vec<Mapped>> {
    let whole = |hf: String| Some(vec![Mapped::whole(hf, shape, Fix::default())]);
    match name {
        "token_embd.weight" => return whole(names::EMBED.into()),
        "output_norm.weight" => return norm(spec, names::FINAL_NORM.into(), shape),
        "output.weight" => return whole(names::LM_HEAD.into()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let i: usize = layer.parse().ok()?;
    let p = names::layer(i);
    if i >= spec.layers {
        // The multi-token-prediction blocks (`nextn_predict_layers`) follow the layers, as in
        // the Hugging Face checkpoints: the first is read under layer `num_hidden_layers`'s
        // names (crate::model::mtp), its own tensors (`nextn.*`) as Hugging Face names them;
        // further ones are not read.
        if i >= spec.layers + spec.mtp_layers {
            return None;
        }
        if i > spec.layers {
            return Some(Vec::new());
        }
        if let Some(own) = leaf.strip_prefix("nextn.") {
            let hf = match own {
                "eh_proj.weight" | "embed_tokens.weight" => return whole(format!("{p}.{own}")),
                "shared_head_head.weight" => return whole(format!("{p}.shared_head.head.weight")),
                "enorm.weight" | "hnorm.weight" => format!("{p}.{own}"),
                "shared_head_norm.weight" => format!("{p}.shared_head.norm.weight"),
                _ => return None,
            };
            return norm(spec, hf, shape);
        }
    } else if let Some(mapped) = hybrid_tensor(spec, i, leaf, shape) {
        return mapped;
    }
    let a = format!("{p}.self_attn");
    let ffn = names::ffn_prefix(spec.family, i);
    let shared = names::shared_expert(spec.family, i);
    let llama_rope = matches!(spec.family, Family::Llama | Family::Mixtral);
    let permuted = |hf: String, heads: usize| {
        let rows = llama_rope.then(|| unpermute_rope(heads, shape[0] / heads / 2));
        Some(vec![Mapped::whole(hf, shape, Fix { rows, values: Values::Same })])
    };
    let proj = |k: usize| -> Option<Vec<Mapped>> {
        let [e, rows, cols] = shape[..] else { return None };
        Some(
            (0..e)
                .map(|x| Mapped {
                    name: names::expert(spec.family, i, x)[k].clone(),
                    shape: vec![rows, cols],
                    first_row: x * rows,
                    fix: Fix::default(),
                })
                .collect(),
        )
    };
    match leaf {
        "attn_norm.weight" => norm(spec, format!("{p}.input_layernorm.weight"), shape),
        "ffn_norm.weight" => whole(format!("{p}.post_attention_layernorm.weight")),
        // GLM-4.5's FFN norm (llama.cpp names it after the Hugging Face module).
        // (and gpt-oss's and the hybrid families'.)
        "post_attention_norm.weight"
            if matches!(spec.family, Family::Glm4Moe | Family::GptOss) || spec.hybrid.is_some() =>
        {
            norm(spec, format!("{p}.post_attention_layernorm.weight"), shape)
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
        "attn_q_norm.weight" => norm(spec, format!("{a}.q_norm.weight"), shape),
        "attn_k_norm.weight" => norm(spec, format!("{a}.k_norm.weight"), shape),
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
        // A [1, hidden] matrix for Hugging Face; llama.cpp's `qwen2moe` stores a vector.
        "ffn_gate_inp_shexp.weight" => Some(vec![Mapped {
            name: format!("{ffn}.shared_expert_gate.weight"),
            shape: vec![1, *shape.last()?],
            first_row: 0,
            fix: Fix::default(),
        }]),
        _ => None,
    }
}

/// A norm weight: llama.cpp stores the zero-centred ones of the hybrid families with their 1
/// added.
fn norm(spec: &ArchSpec, hf: String, shape: &[usize]) -> Option<Vec<Mapped>> {
    let values = if spec.zero_centred_norms() { Values::PlusOne } else { Values::Same };
    Some(vec![Mapped::whole(hf, shape, Fix { rows: None, values })])
}

/// The Gated DeltaNet tensors of layer `i` of a hybrid model (`qwen3next`, `qwen35moe`) as the
/// split Hugging Face projections (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`;
/// [`crate::model::config::HybridSpec::fused_projection`] is false for GGUF), value heads in
/// Hugging Face's grouped order. `None` for other tensors.
fn hybrid_tensor(spec: &ArchSpec, i: usize, leaf: &str, shape: &[usize]) -> Option<Option<Vec<Mapped>>> {
    let hy = spec.hybrid.as_ref().filter(|hy| hy.is_linear(i))?;
    let a = format!("{}.linear_attn", names::layer(i));
    let (nk, nv, dk, dv) = (hy.num_k_heads, hy.num_v_heads, hy.head_k_dim, hy.head_v_dim);
    let r = nv / nk;
    // qwen35moe's converter tiles the value heads when there are more of them than key heads.
    let tiled = spec.family == Family::Qwen35Moe && r > 1;
    let untiled = |width: usize, before: usize| -> Option<Vec<usize>> {
        tiled.then(|| (0..before).chain(untile(nk, r, width).into_iter().map(|x| x + before)).collect())
    };
    let one = |name: &str, rows: Option<Vec<usize>>, values: Values| {
        Some(Some(vec![Mapped::whole(format!("{a}.{name}"), shape, Fix { rows, values })]))
    };
    match leaf {
        "attn_qkv.weight" => one("in_proj_qkv.weight", untiled(dv, 2 * nk * dk), Values::Same),
        "attn_gate.weight" => one("in_proj_z.weight", untiled(dv, 0), Values::Same),
        "ssm_beta.weight" => one("in_proj_b.weight", untiled(1, 0), Values::Same),
        "ssm_alpha.weight" => one("in_proj_a.weight", untiled(1, 0), Values::Same),
        // qwen3next keeps in_proj_ba's per-key-head groups: [b (r rows), a (r rows)] each.
        "ssm_ba.weight" => {
            let cols = *shape.last()?;
            Some(Some(
                (0..2)
                    .map(|part| Mapped {
                        name: format!("{a}.in_proj_{}.weight", ["b", "a"][part]),
                        shape: vec![nv, cols],
                        first_row: 0,
                        fix: Fix {
                            rows: Some((0..nv).map(|h| (h / r) * 2 * r + part * r + h % r).collect()),
                            values: Values::Same,
                        },
                    })
                    .collect(),
            ))
        }
        "ssm_a" => one("A_log", untiled(1, 0), Values::NegExp),
        "ssm_dt.bias" => one("dt_bias", untiled(1, 0), Values::Same),
        // Squeezed from [conv_dim, 1, kernel].
        "ssm_conv1d.weight" => {
            let [channels, taps] = shape[..] else { return Some(None) };
            Some(Some(vec![Mapped {
                name: format!("{a}.conv1d.weight"),
                shape: vec![channels, 1, taps],
                first_row: 0,
                fix: Fix { rows: untiled(dv, 2 * nk * dk), values: Values::Same },
            }]))
        }
        "ssm_norm.weight" => one("norm.weight", None, Values::Same),
        "ssm_out.weight" => {
            let values = match untiled(dv, 0) {
                Some(cols) => Values::Columns(cols),
                None => Values::Same,
            };
            one("out_proj.weight", None, values)
        }
        _ => None,
    }
}
