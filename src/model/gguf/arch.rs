//! GGUF metadata (`general.architecture` and `{arch}.*` keys) → [`ArchSpec`], for the
//! llama.cpp architectures moestream runs: `llama` (dense, or Mixtral when it has experts),
//! `qwen2`, `qwen3`, `qwen2moe`, `qwen3moe`, `olmoe`, and `glm4moe`, `deepseek2`, `gpt-oss`,
//! `qwen3next` and `qwen35moe` (through [`super::hf_config`]). Keys that change the math and are not
//! implemented (RoPE scaling, sliding windows, logit soft-capping...) are refused by name.

use super::{GgmlType, GgufModel, GgufValue};
use crate::error::{Error, Result};
use crate::model::config::{ArchSpec, AttentionKind, Family, MoeSpec, QkNorm, RopeSpec, RoutingKind};

fn key_err(e: super::GgufError) -> Error {
    Error::UnsupportedConfig(e.to_string())
}

/// The architecture of a GGUF model, checked against its tensors' presence where the metadata
/// is silent (q/k/v biases, tied output).
pub fn spec_from_gguf(m: &GgufModel) -> Result<ArchSpec> {
    let arch = m.str("general.architecture").map_err(key_err)?.to_string();
    let key = |k: &str| format!("{arch}.{k}");
    if matches!(arch.as_str(), "glm4moe" | "deepseek2" | "gpt-oss" | "qwen3next" | "qwen35moe") {
        let spec = match arch.as_str() {
            "glm4moe" => super::hf_config::glm4moe(m)?,
            "deepseek2" => super::hf_config::deepseek2(m)?,
            "gpt-oss" => super::hf_config::gpt_oss(m)?,
            "qwen3next" => super::hf_config::hybrid(m, "qwen3next")?,
            _ => super::hf_config::hybrid(m, "qwen35moe")?,
        };
        // The blocks after the main layers are multi-token-prediction ones.
        check_blocks(m, &key("block_count"), spec.layers, m.u64(&key("block_count")).map_err(key_err)? as usize)?;
        spec.check_limits()?;
        return Ok(spec);
    }
    let n = |k: &str| m.u64(&key(k)).map(|v| v as usize).map_err(key_err);
    let opt_n = |k: &str| m.get(&key(k)).and_then(GgufValue::as_u64).map(|v| v as usize);
    let experts = opt_n("expert_count").unwrap_or(0);
    let family = match (arch.as_str(), experts > 0) {
        ("llama", false) => Family::Llama,
        ("llama", true) => Family::Mixtral,
        ("qwen2", _) => Family::Qwen2,
        ("qwen3", _) => Family::Qwen3,
        ("qwen2moe", _) => Family::Qwen2Moe,
        ("qwen3moe", _) => Family::Qwen3Moe,
        ("olmoe", _) => Family::Olmoe,
        (other, _) => return Err(Error::UnsupportedArchitecture(format!("GGUF architecture {other}"))),
    };
    for refused in
        ["rope.scaling.type", "attention.sliding_window", "final_logit_softcapping", "attn_logit_softcapping"]
    {
        match m.get(&key(refused)) {
            None => {}
            Some(GgufValue::String(s)) if s == "none" => {}
            Some(v) => return Err(Error::UnsupportedConfig(format!("GGUF {}: {v:?} is not supported", key(refused)))),
        }
    }
    let hidden = n("embedding_length")?;
    let layers = n("block_count")?;
    check_blocks(m, &key("block_count"), layers, layers)?;
    let heads = n("attention.head_count")?;
    let kv_heads = opt_n("attention.head_count_kv").unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 || hidden == 0 {
        return Err(Error::UnsupportedConfig(format!("GGUF heads {heads} / kv heads {kv_heads} / hidden {hidden}")));
    }
    let head_dim = opt_n("attention.key_length").unwrap_or(hidden / heads);
    if opt_n("attention.value_length").is_some_and(|v| v != head_dim) || head_dim % 2 != 0 {
        return Err(Error::UnsupportedConfig(format!("GGUF head dims of {arch} (key {head_dim}, even, = value)")));
    }
    let embd = m.info("token_embd.weight").ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))?;
    let vocab = embd.shape[0];
    let dense_intermediate = opt_n("feed_forward_length").unwrap_or(0);
    let (moe, moe_layers) = if experts > 0 {
        let top_k = n("expert_used_count")?;
        if top_k == 0 || top_k > experts {
            return Err(Error::UnsupportedConfig(format!("GGUF expert_used_count {top_k} not in 1..={experts}")));
        }
        let expert_intermediate = match family {
            Family::Mixtral | Family::Olmoe => opt_n("expert_feed_forward_length").unwrap_or(dense_intermediate),
            _ => n("expert_feed_forward_length")?,
        };
        // llama.cpp normalizes the top-k weights of these families unless told otherwise.
        let norm_default = matches!(family, Family::Mixtral | Family::Qwen3Moe);
        let norm_topk_prob = m.get(&key("expert_weights_norm")).map_or(Some(norm_default), |v| match v {
            GgufValue::Bool(b) => Some(*b),
            _ => None,
        });
        let shared = opt_n("expert_shared_feed_forward_length").filter(|&s| s > 0);
        // A layer is an MoE layer when its stacked experts are present (Qwen's mlp_only_layers
        // and decoder_sparse_step are not GGUF keys).
        let moe_layers: Vec<bool> =
            (0..layers).map(|i| m.info(&format!("blk.{i}.ffn_gate_exps.weight")).is_some()).collect();
        (
            Some(MoeSpec {
                num_experts: experts,
                top_k,
                expert_intermediate,
                routing: RoutingKind::Softmax,
                norm_topk_prob: norm_topk_prob.ok_or_else(|| Error::ConfigField(key("expert_weights_norm")))?,
                routed_scaling_factor: 1.0,
                shared_expert_intermediate: shared.filter(|_| family == Family::Qwen2Moe),
                shared_expert_gate: family == Family::Qwen2Moe,
                router_logit_bias: false,
                expert_act: Default::default(),
            }),
            moe_layers,
        )
    } else {
        (None, vec![false; layers])
    };
    if moe_layers.iter().any(|x| !x) && dense_intermediate == 0 {
        return Err(Error::ConfigField(key("feed_forward_length")));
    }
    let eos = m.get("tokenizer.ggml.eos_token_id").and_then(GgufValue::as_u64);
    let spec = ArchSpec {
        family,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        vocab,
        rms_eps: m.f64(&key("attention.layer_norm_rms_epsilon")).map_err(key_err)? as f32,
        rope: RopeSpec::plain(
            m.get(&key("rope.freq_base")).and_then(GgufValue::as_f64).unwrap_or(10000.0) as f32,
            head_dim,
        ),
        attention: AttentionKind::Grouped,
        max_positions: opt_n("context_length").unwrap_or(4096),
        qkv_bias: m.info("blk.0.attn_q.bias").is_some(),
        qk_norm: match family {
            Family::Qwen3 | Family::Qwen3Moe => QkNorm::PerHead,
            Family::Olmoe => QkNorm::Full,
            _ => QkNorm::None,
        },
        tie_embeddings: m.info("output.weight").is_none(),
        dense_intermediate,
        moe,
        moe_layers,
        eos_token_ids: eos.map(|e| vec![e as u32]).unwrap_or_default(),
        // `attention.sliding_window` is refused above.
        layer_windows: Vec::new(),
        hybrid: None,
        o_bias: false,
        attention_sinks: false,
        mtp_layers: opt_n("nextn_predict_layers").unwrap_or(0),
    };
    spec.check_limits()?;
    Ok(spec)
}

/// Checks `block_count` (`blocks`, of which the first `layers` are decoder layers) against the
/// tensors before anything is sized by it (a wrapped count hangs here): `blk.{layers-1}` exists
/// and `blk.{blocks}` does not.
fn check_blocks(m: &GgufModel, field: &str, layers: usize, blocks: usize) -> Result<()> {
    let has_block = |i: usize| m.info(&format!("blk.{i}.attn_norm.weight")).is_some();
    if layers == 0 || layers > blocks || !has_block(layers - 1) || has_block(blocks) {
        return Err(Error::ConfigValue {
            field: field.into(),
            value: blocks.to_string(),
            expected: "the number of blk.N tensor groups in the file".into(),
        });
    }
    Ok(())
}

/// Per model layer (`layers` of them), the ggml types its routed experts' slots hold: gate and
/// up in the type of that layer's `ffn_gate_exps`/`ffn_up_exps`, down in its `ffn_down_exps`
/// type, read as stored, whatever the other layers use (Q4_K_M's down is Q6_K on some layers,
/// Q4_K on others). A layer whose gate and up differ in type (one format serves both) holds
/// them as F32, the exact dequantization. `None` for layers without stacked experts.
pub fn expert_types(m: &GgufModel, layers: usize) -> Vec<Option<[GgmlType; 2]>> {
    let ty = |i: usize, role: &str| m.info(&format!("blk.{i}.ffn_{role}_exps.weight")).map(|t| t.ggml_type);
    (0..layers)
        .map(|i| {
            let (gate, up, down) = (ty(i, "gate")?, ty(i, "up")?, ty(i, "down")?);
            if gate != up {
                log::warn!(
                    "GGUF layer {i}: ffn_gate_exps is {} and ffn_up_exps {}: their slots hold f32 dequantized weights",
                    gate.name(),
                    up.name()
                );
            }
            Some([if gate == up { gate } else { GgmlType::F32 }, down])
        })
        .collect()
}

/// The architecture of the model at `path`: a GGUF file's metadata, else a directory's
/// config.json.
pub fn spec_at(path: &std::path::Path) -> Result<ArchSpec> {
    match is_gguf(path) {
        true => spec_from_gguf(&GgufModel::open(path)?),
        false => ArchSpec::from_dir(path),
    }
}

/// Whether `path` names a GGUF file (by extension).
pub fn is_gguf(path: &std::path::Path) -> bool {
    path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}
