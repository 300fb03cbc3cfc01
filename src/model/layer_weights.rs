//! Host-side weights of one decoder layer, read from a checkpoint with every shape checked.
//! Shared by the CPU reference and the GPU uploader so both see identical tensors.

use super::config::{ArchSpec, Family, MlaSpec, QkNorm};
use super::gpt_oss_weights;
use super::hybrid_weights::{self, uncentre, LinearAttnWeights};
use super::names;
use super::weights::{Checkpoint, HostTensor};
use crate::error::{Error, Result};

/// A SwiGLU feed-forward block: `down(silu(gate x) * up x)`.
#[derive(Clone, Debug)]
pub struct MlpWeights {
    /// `[intermediate, hidden]`.
    pub gate: HostTensor,
    /// `[intermediate, hidden]`.
    pub up: HostTensor,
    /// `[hidden, intermediate]`.
    pub down: HostTensor,
}

/// Attention projections and optional biases / q-k norms.
#[derive(Clone, Debug)]
pub struct AttentionWeights {
    /// `[heads*head_dim, hidden]`.
    pub q: HostTensor,
    /// `[kv_heads*head_dim, hidden]`.
    pub k: HostTensor,
    /// `[kv_heads*head_dim, hidden]`.
    pub v: HostTensor,
    /// `[hidden, heads*head_dim]`.
    pub o: HostTensor,
    /// Biases of q, k, v when the architecture has them.
    pub qkv_bias: Option<[HostTensor; 3]>,
    /// `o_proj`'s bias `[hidden]` (gpt-oss).
    pub o_bias: Option<HostTensor>,
    /// One sink logit per query head `[heads]` (gpt-oss `self_attn.sinks`).
    pub sinks: Option<HostTensor>,
    /// Query and key RMSNorm weights when the architecture has them.
    pub qk_norm: Option<[HostTensor; 2]>,
    /// The output gate `[heads*head_dim, hidden]` (Qwen3-Next/3.5 `attn_output_gate`: the
    /// attention output is multiplied by `sigmoid(gate x)`), split from `q_proj`.
    pub gate: Option<HostTensor>,
}

/// How MLA forms its queries.
#[derive(Clone, Debug)]
// One per layer, held only while a layer uploads: boxing a variant would save nothing.
#[allow(clippy::large_enum_variant)]
pub enum MlaQuery {
    /// `q_proj` `[heads * qk_head_dim, hidden]` (no `q_lora_rank`).
    Direct(HostTensor),
    /// `q_b_proj(q_a_layernorm(q_a_proj x))`.
    Compressed {
        /// `q_a_proj` `[q_lora_rank, hidden]`.
        a: HostTensor,
        /// `q_a_layernorm` `[q_lora_rank]`.
        norm: HostTensor,
        /// `q_b_proj` `[heads * qk_head_dim, q_lora_rank]`.
        b: HostTensor,
    },
}

/// Multi-head latent attention's projections (DeepSeek-V2/V3).
#[derive(Clone, Debug)]
pub struct MlaWeights {
    /// Query projection(s); each head's row block is `[qk_nope_head_dim | qk_rope_head_dim]`.
    pub q: MlaQuery,
    /// `kv_a_proj_with_mqa` `[kv_lora_rank + qk_rope_head_dim, hidden]`: the latent, then the
    /// shared rotary key.
    pub kv_a: HostTensor,
    /// `kv_a_layernorm` `[kv_lora_rank]`.
    pub kv_norm: HostTensor,
    /// `kv_b_proj` `[heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]`: per head, W_UK rows
    /// then W_UV rows.
    pub kv_b: HostTensor,
    /// `o_proj` `[hidden, heads * v_head_dim]`.
    pub o: HostTensor,
    /// Ling's output gate `g_proj` `[heads, hidden]`: each head's attention output is
    /// multiplied by `sigmoid(g_proj x)`.
    pub gate: Option<HostTensor>,
}

/// A layer's attention weights, by attention kind.
#[derive(Clone, Debug)]
// One per layer, held only while a layer uploads: boxing a variant would save nothing.
#[allow(clippy::large_enum_variant)]
pub enum AttentionBlock {
    /// Grouped-query attention.
    Grouped(AttentionWeights),
    /// Multi-head latent attention.
    Mla(MlaWeights),
    /// Linear attention (Gated DeltaNet or KDA).
    Linear(LinearAttnWeights),
}

/// The RMSNorm epsilon of MLA's `q_a_layernorm` and `kv_a_layernorm` (transformers builds them
/// with the default, not `rms_norm_eps`).
pub const MLA_NORM_EPS: f32 = 1e-6;

/// The routed-expert block of an MoE layer.
#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// Router `[experts, hidden]`.
    pub router: HostTensor,
    /// `e_score_correction_bias` `[experts]` (sigmoid routing): added for choosing only.
    pub router_bias: Option<HostTensor>,
    /// The router's logit bias `[experts]` (gpt-oss `mlp.router.bias`).
    pub router_logit_bias: Option<HostTensor>,
    /// The routed experts' biases `[experts, 2 * inter + hidden]`: per expert gate, up and
    /// down (gpt-oss), resident beside the streamed expert weights.
    pub expert_bias: Option<HostTensor>,
    /// Shared expert(s) as one MLP, with Qwen2-MoE's sigmoid gate `[1, hidden]`.
    pub shared: Option<(MlpWeights, Option<HostTensor>)>,
}

/// The FFN half of a layer.
#[derive(Clone, Debug)]
// One per layer, held only while a layer uploads: boxing a variant would save nothing.
#[allow(clippy::large_enum_variant)]
pub enum FfnWeights {
    /// A dense SwiGLU MLP.
    Dense(MlpWeights),
    /// Routed experts (read separately with [`expert`]) plus router and shared expert.
    Moe(MoeWeights),
}

/// All non-expert weights of one decoder layer.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// RMSNorm before attention.
    pub input_norm: HostTensor,
    /// RMSNorm before the FFN.
    pub post_norm: HostTensor,
    /// Attention.
    pub attn: AttentionBlock,
    /// Feed-forward.
    pub ffn: FfnWeights,
}

fn mlp(ck: &Checkpoint, names: [String; 3], hidden: usize, inter: usize) -> Result<MlpWeights> {
    let [g, u, d] = names;
    Ok(MlpWeights {
        gate: ck.tensor(&g, &[inter, hidden])?,
        up: ck.tensor(&u, &[inter, hidden])?,
        down: ck.tensor(&d, &[hidden, inter])?,
    })
}

fn mla(ck: &Checkpoint, spec: &ArchSpec, m: &MlaSpec, a: &str) -> Result<MlaWeights> {
    let h = spec.hidden;
    let t = |name: &str, shape: &[usize]| ck.tensor(&format!("{a}.{name}"), shape);
    let q = match m.q_lora_rank {
        None => MlaQuery::Direct(t("q_proj.weight", &[spec.q_dim(), h])?),
        Some(r) => MlaQuery::Compressed {
            a: t("q_a_proj.weight", &[r, h])?,
            norm: t("q_a_layernorm.weight", &[r])?,
            b: t("q_b_proj.weight", &[spec.q_dim(), r])?,
        },
    };
    Ok(MlaWeights {
        q,
        kv_a: t("kv_a_proj_with_mqa.weight", &[m.latent_width(), h])?,
        kv_norm: t("kv_a_layernorm.weight", &[m.kv_lora_rank])?,
        kv_b: t("kv_b_proj.weight", &[spec.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank])?,
        o: t("o_proj.weight", &[h, spec.heads * m.v_head_dim])?,
        gate: match spec.hybrid.as_ref().is_some_and(|hy| hy.attn_output_gate) {
            true => Some(t("g_proj.weight", &[spec.heads, h])?),
            false => None,
        },
    })
}

fn grouped(ck: &Checkpoint, spec: &ArchSpec, a: &str) -> Result<AttentionWeights> {
    let h = spec.hidden;
    let (qd, kvd) = (spec.q_dim(), spec.kv_dim());
    let qkv_bias = if spec.qkv_bias {
        Some([
            ck.tensor(&format!("{a}.q_proj.bias"), &[qd])?,
            ck.tensor(&format!("{a}.k_proj.bias"), &[kvd])?,
            ck.tensor(&format!("{a}.v_proj.bias"), &[kvd])?,
        ])
    } else {
        None
    };
    let norm = |name: &str, n: usize| ck.tensor(&format!("{a}.{name}"), &[n]).map(|w| centred(spec, w));
    let qk_norm = match spec.qk_norm {
        QkNorm::None => None,
        QkNorm::PerHead => Some([norm("q_norm.weight", spec.head_dim)?, norm("k_norm.weight", spec.head_dim)?]),
        QkNorm::Full => {
            Some([ck.tensor(&format!("{a}.q_norm.weight"), &[qd])?, ck.tensor(&format!("{a}.k_norm.weight"), &[kvd])?])
        }
    };
    let gated = spec.hybrid.as_ref().is_some_and(|hy| hy.attn_output_gate);
    let (q, gate) = match gated {
        true => {
            let (q, gate) = hybrid_weights::split_query_gate(
                &ck.tensor(&format!("{a}.q_proj.weight"), &[2 * qd, h])?,
                spec.heads,
                spec.head_dim,
            );
            (q, Some(gate))
        }
        false => (ck.tensor(&format!("{a}.q_proj.weight"), &[qd, h])?, None),
    };
    Ok(AttentionWeights {
        q,
        gate,
        k: ck.tensor(&format!("{a}.k_proj.weight"), &[kvd, h])?,
        v: ck.tensor(&format!("{a}.v_proj.weight"), &[kvd, h])?,
        o: ck.tensor(&format!("{a}.o_proj.weight"), &[h, qd])?,
        qkv_bias,
        o_bias: spec.o_bias.then(|| ck.tensor(&format!("{a}.o_proj.bias"), &[h])).transpose()?,
        sinks: spec.attention_sinks.then(|| ck.tensor(&format!("{a}.sinks"), &[spec.heads])).transpose()?,
        qk_norm,
    })
}

/// A norm weight as the kernels apply it (`x * w`): zero-centred ones get their 1 added.
pub fn centred(spec: &ArchSpec, w: HostTensor) -> HostTensor {
    match spec.zero_centred_norms() {
        true => uncentre(w),
        false => w,
    }
}

/// Reads the non-expert weights of layer `i`.
pub fn layer(ck: &Checkpoint, spec: &ArchSpec, i: usize) -> Result<LayerWeights> {
    let p = names::layer(i);
    let h = spec.hidden;
    let a = format!("{p}.self_attn");
    let attn = match (spec.mla(), &spec.hybrid) {
        (_, Some(hy)) if hy.is_linear(i) => AttentionBlock::Linear(hybrid_weights::linear_attention(ck, spec, hy, i)?),
        (Some(m), _) => AttentionBlock::Mla(mla(ck, spec, m, &a)?),
        (None, _) => AttentionBlock::Grouped(grouped(ck, spec, &a)?),
    };
    let ffn = match (&spec.moe, spec.is_moe_layer(i)) {
        (Some(m), true) => {
            let prefix = names::ffn_prefix(spec.family, i);
            let shared = match m.shared_expert_intermediate {
                Some(si) => Some((
                    mlp(ck, names::mlp(&names::shared_expert(spec.family, i)), h, si)?,
                    match m.shared_expert_gate {
                        true => Some(ck.tensor(&format!("{prefix}.shared_expert_gate.weight"), &[1, h])?),
                        false => None,
                    },
                )),
                None => None,
            };
            let router_bias = match m.routing.has_bias() {
                true => Some(ck.tensor(&names::router_bias(spec.family, i), &[m.num_experts])?),
                false => None,
            };
            let router_logit_bias = m
                .router_logit_bias
                .then(|| ck.tensor(&names::router_logit_bias(spec.family, i), &[m.num_experts]))
                .transpose()?;
            let expert_bias = m.expert_act.has_bias().then(|| gpt_oss_weights::expert_bias(ck, spec, i)).transpose()?;
            FfnWeights::Moe(MoeWeights {
                router: ck.tensor(&names::router(spec.family, i), &[m.num_experts, h])?,
                router_bias,
                router_logit_bias,
                expert_bias,
                shared,
            })
        }
        _ => FfnWeights::Dense(mlp(ck, names::mlp(&format!("{p}.mlp")), h, spec.dense_intermediate)?),
    };
    Ok(LayerWeights {
        input_norm: centred(spec, ck.tensor(&format!("{p}.input_layernorm.weight"), &[h])?),
        post_norm: centred(spec, ck.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?),
        attn,
        ffn,
    })
}

/// Reads routed expert `e` of MoE layer `i`, from per-expert tensors or the fused layout.
pub fn expert(ck: &Checkpoint, spec: &ArchSpec, i: usize, e: usize) -> Result<MlpWeights> {
    let m = spec.moe.as_ref().ok_or_else(|| Error::InvalidArgument("dense model has no experts".into()))?;
    if e >= m.num_experts || !spec.is_moe_layer(i) {
        return Err(Error::InvalidArgument(format!("layer {i} has no routed expert {e}")));
    }
    if spec.family == Family::GptOss {
        return gpt_oss_weights::expert(ck, spec, i, e);
    }
    let (h, inter) = (spec.hidden, m.expert_intermediate);
    let per_expert = names::expert(spec.family, i, e);
    if ck.contains(&per_expert[0]) {
        return mlp(ck, per_expert, h, inter);
    }
    let [gate_up, down] = names::fused_experts(spec.family, i);
    if !ck.contains(&gate_up) {
        return Err(Error::MissingTensor(per_expert[0].clone()));
    }
    // Fused tensors are read whole; callers iterate experts of one layer, so read once per
    // call is acceptable only for small models. Large models use the per-expert layout.
    let gu = ck.tensor(&gate_up, &[m.num_experts, 2 * inter, h])?;
    let dn = ck.tensor(&down, &[m.num_experts, h, inter])?;
    let slab = |t: &HostTensor, start: usize, rows: usize, cols: usize| {
        HostTensor::new(vec![rows, cols], t.data[start * cols..(start + rows) * cols].to_vec())
    };
    Ok(MlpWeights {
        gate: slab(&gu, e * 2 * inter, inter, h),
        up: slab(&gu, e * 2 * inter + inter, inter, h),
        down: slab(&dn, e * h, h, inter),
    })
}

/// Embedding `[vocab, hidden]`, final norm `[hidden]` and lm_head `[vocab, hidden]` (the
/// embedding again when tied).
pub fn globals(ck: &Checkpoint, spec: &ArchSpec) -> Result<(HostTensor, HostTensor, HostTensor)> {
    globals_read(ck, spec, Checkpoint::tensor)
}

/// [`globals`] for the GPU: a GGUF embedding and lm_head as their blocks alone
/// ([`Checkpoint::tensor_to_upload`], no f32 values on the host).
pub fn globals_to_upload(ck: &Checkpoint, spec: &ArchSpec) -> Result<(HostTensor, HostTensor, HostTensor)> {
    globals_read(ck, spec, Checkpoint::tensor_to_upload)
}

type Read = fn(&Checkpoint, &str, &[usize]) -> Result<HostTensor>;

fn globals_read(ck: &Checkpoint, spec: &ArchSpec, read: Read) -> Result<(HostTensor, HostTensor, HostTensor)> {
    let embed = read(ck, names::EMBED, &[spec.vocab, spec.hidden])?;
    let norm = centred(spec, ck.tensor(names::FINAL_NORM, &[spec.hidden])?);
    let head = if spec.tie_embeddings && !ck.contains(names::LM_HEAD) {
        embed.clone()
    } else {
        read(ck, names::LM_HEAD, &[spec.vocab, spec.hidden])?
    };
    Ok((embed, norm, head))
}
