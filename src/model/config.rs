//! Parsing Hugging Face `config.json` into one architecture description.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config_limits::check_field;
use crate::error::{Error, Result};

/// The model families moestream runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Family {
    /// `MixtralForCausalLM`.
    Mixtral,
    /// `Qwen2MoeForCausalLM`.
    Qwen2Moe,
    /// `Qwen3MoeForCausalLM`.
    Qwen3Moe,
    /// `OlmoeForCausalLM`.
    Olmoe,
    /// `LlamaForCausalLM` (dense).
    Llama,
    /// `Qwen2ForCausalLM` (dense).
    Qwen2,
    /// `Qwen3ForCausalLM` (dense).
    Qwen3,
}

impl Family {
    /// The `architectures[0]` string of this family.
    pub fn hf_name(self) -> &'static str {
        match self {
            Family::Mixtral => "MixtralForCausalLM",
            Family::Qwen2Moe => "Qwen2MoeForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Olmoe => "OlmoeForCausalLM",
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    fn from_hf_name(name: &str) -> Result<Family> {
        Ok(match name {
            "MixtralForCausalLM" => Family::Mixtral,
            "Qwen2MoeForCausalLM" => Family::Qwen2Moe,
            "Qwen3MoeForCausalLM" => Family::Qwen3Moe,
            "OlmoeForCausalLM" => Family::Olmoe,
            "LlamaForCausalLM" => Family::Llama,
            "Qwen2ForCausalLM" => Family::Qwen2,
            "Qwen3ForCausalLM" => Family::Qwen3,
            other => return Err(Error::UnsupportedArchitecture(other.to_string())),
        })
    }
}

/// Where query/key RMSNorm is applied, if at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QkNorm {
    /// No q/k norm.
    None,
    /// One norm of `head_dim` shared by all heads (Qwen3).
    PerHead,
    /// One norm over the whole projection (OLMoE): `heads * head_dim` for q, `kv_heads * head_dim` for k.
    Full,
}

/// The routed-expert part of an MoE architecture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeSpec {
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Intermediate size of one routed expert.
    pub expert_intermediate: usize,
    /// Renormalise the top-k router probabilities to sum to one.
    pub norm_topk_prob: bool,
    /// Intermediate size of the always-on shared expert with its sigmoid gate (Qwen2-MoE).
    pub shared_expert_intermediate: Option<usize>,
}

/// Everything the engine needs to know about a model's shape, for every supported family.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArchSpec {
    /// The model family.
    pub family: Family,
    /// Hidden size.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// Key/value heads (GQA).
    pub kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Longest sequence the model supports.
    pub max_positions: usize,
    /// q/k/v projections have biases.
    pub qkv_bias: bool,
    /// Query/key normalisation.
    pub qk_norm: QkNorm,
    /// lm_head shares the embedding matrix.
    pub tie_embeddings: bool,
    /// Intermediate size of dense FFN layers (0 when the model has none).
    pub dense_intermediate: usize,
    /// Routed-expert configuration (`None` for dense models).
    pub moe: Option<MoeSpec>,
    /// For each layer, whether its FFN is an MoE block.
    pub moe_layers: Vec<bool>,
    /// End-of-sequence token ids.
    pub eos_token_ids: Vec<u32>,
}

fn get<'a>(cfg: &'a Value, key: &str) -> Option<&'a Value> {
    cfg.get(key).filter(|v| !v.is_null())
}

fn usize_field(cfg: &Value, key: &str) -> Result<usize> {
    opt_usize(cfg, key)?.ok_or_else(|| Error::ConfigField(key.into()))
}

fn opt_usize(cfg: &Value, key: &str) -> Result<Option<usize>> {
    get(cfg, key).map(|v| check_field(key, v)).transpose()
}

fn f32_field(cfg: &Value, key: &str, default: f32) -> Result<f32> {
    match get(cfg, key) {
        None => Ok(default),
        Some(v) => v.as_f64().map(|v| v as f32).ok_or_else(|| Error::ConfigField(key.into())),
    }
}

fn bool_field(cfg: &Value, key: &str, default: bool) -> Result<bool> {
    match get(cfg, key) {
        None => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| Error::ConfigField(key.into())),
    }
}

/// RoPE base and a check that no unsupported scaling is requested. Reads `rope_theta` or the
/// transformers-5 `rope_parameters` object.
fn rope(cfg: &Value, default_theta: f32) -> Result<f32> {
    let params = get(cfg, "rope_parameters").or_else(|| get(cfg, "rope_scaling"));
    if let Some(p) = params {
        let kind = p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default");
        if kind != "default" {
            return Err(Error::UnsupportedConfig(format!("rope scaling type {kind:?} (only plain RoPE is supported)")));
        }
        if let Some(theta) = p.get("rope_theta").and_then(Value::as_f64) {
            return Ok(theta as f32);
        }
    }
    f32_field(cfg, "rope_theta", default_theta)
}

fn eos_ids(cfg: &Value) -> Vec<u32> {
    match get(cfg, "eos_token_id") {
        Some(Value::Number(n)) => n.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|v| v as u32).collect(),
        _ => Vec::new(),
    }
}

impl ArchSpec {
    /// Reads and parses `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<ArchSpec> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| Error::Json { path: path.clone(), message: e.to_string() })?;
        ArchSpec::from_config(&value)
    }

    /// Parses a `config.json` value.
    pub fn from_config(cfg: &Value) -> Result<ArchSpec> {
        let arch = get(cfg, "architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .ok_or_else(|| Error::ConfigField("architectures".into()))?;
        let family = Family::from_hf_name(arch)?;
        let hidden = usize_field(cfg, "hidden_size")?;
        let layers = usize_field(cfg, "num_hidden_layers")?;
        let heads = usize_field(cfg, "num_attention_heads")?;
        let kv_heads = opt_usize(cfg, "num_key_value_heads")?.unwrap_or(heads);
        let head_dim = opt_usize(cfg, "head_dim")?.unwrap_or(hidden / heads.max(1));
        if hidden == 0 || head_dim == 0 {
            return Err(Error::UnsupportedConfig(format!(
                "hidden_size {hidden} and head_dim {head_dim} must be positive"
            )));
        }
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Error::UnsupportedConfig(format!(
                "num_attention_heads {heads} must be a positive multiple of num_key_value_heads {kv_heads}"
            )));
        }
        if head_dim % 2 != 0 {
            return Err(Error::UnsupportedConfig(format!("head_dim {head_dim} must be even for RoPE")));
        }
        if get(cfg, "clip_qkv").is_some() {
            return Err(Error::UnsupportedConfig("clip_qkv is not supported".into()));
        }
        if family == Family::Mixtral && get(cfg, "sliding_window").is_some() {
            log::warn!("sliding_window is ignored: attention is full-context (exact up to the window)");
        }
        let vocab = usize_field(cfg, "vocab_size")?;
        if vocab == 0 {
            return Err(Error::UnsupportedConfig("vocab_size must be positive".into()));
        }
        let default_theta = if family == Family::Mixtral { 1e6 } else { 10000.0 };
        let moe_family = matches!(family, Family::Mixtral | Family::Qwen2Moe | Family::Qwen3Moe | Family::Olmoe);
        let dense_intermediate = opt_usize(cfg, "intermediate_size")?.unwrap_or(0);
        let (moe, moe_layers) = if moe_family {
            let num_experts = opt_usize(cfg, "num_local_experts")?
                .or(opt_usize(cfg, "num_experts")?)
                .ok_or_else(|| Error::ConfigField("num_experts".into()))?;
            let top_k = usize_field(cfg, "num_experts_per_tok")?;
            if top_k == 0 || top_k > num_experts {
                return Err(Error::UnsupportedConfig(format!("num_experts_per_tok {top_k} not in 1..={num_experts}")));
            }
            let expert_intermediate = match family {
                Family::Mixtral | Family::Olmoe => dense_intermediate,
                _ => usize_field(cfg, "moe_intermediate_size")?,
            };
            let shared = if family == Family::Qwen2Moe {
                opt_usize(cfg, "shared_expert_intermediate_size")?.filter(|&s| s > 0)
            } else {
                None
            };
            let norm_default = matches!(family, Family::Mixtral);
            let norm_topk_prob = match family {
                Family::Mixtral => true,
                _ => bool_field(cfg, "norm_topk_prob", norm_default)?,
            };
            let step = opt_usize(cfg, "decoder_sparse_step")?.unwrap_or(1).max(1);
            let mlp_only: Vec<usize> = get(cfg, "mlp_only_layers")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).map(|v| v as usize).collect())
                .unwrap_or_default();
            let uses_step = matches!(family, Family::Qwen2Moe | Family::Qwen3Moe);
            let moe_layers =
                (0..layers).map(|i| !uses_step || (!mlp_only.contains(&i) && (i + 1) % step == 0)).collect::<Vec<_>>();
            (
                Some(MoeSpec {
                    num_experts,
                    top_k,
                    expert_intermediate,
                    norm_topk_prob,
                    shared_expert_intermediate: shared,
                }),
                moe_layers,
            )
        } else {
            (None, vec![false; layers])
        };
        if moe_layers.iter().any(|m| !m) && dense_intermediate == 0 {
            return Err(Error::ConfigField("intermediate_size".into()));
        }
        let qkv_bias = match family {
            Family::Qwen2 | Family::Qwen2Moe => bool_field(cfg, "qkv_bias", true)?,
            _ => bool_field(cfg, "attention_bias", false)?,
        };
        if bool_field(cfg, "mlp_bias", false)? {
            return Err(Error::UnsupportedConfig("mlp_bias is not supported".into()));
        }
        let qk_norm = match family {
            Family::Qwen3 | Family::Qwen3Moe => QkNorm::PerHead,
            Family::Olmoe => QkNorm::Full,
            _ => QkNorm::None,
        };
        let tie_default = false;
        let spec = ArchSpec {
            family,
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab,
            rms_eps: f32_field(cfg, "rms_norm_eps", 1e-6)?,
            rope_theta: rope(cfg, default_theta)?,
            max_positions: opt_usize(cfg, "max_position_embeddings")?.unwrap_or(4096),
            qkv_bias,
            qk_norm,
            tie_embeddings: bool_field(cfg, "tie_word_embeddings", tie_default)?,
            dense_intermediate,
            moe,
            moe_layers,
            eos_token_ids: eos_ids(cfg),
        };
        spec.check_limits()?;
        Ok(spec)
    }

    /// Query projection width (`heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Key/value projection width (`kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Bytes of one routed expert's gate, up and down weights at `bytes_per_weight` (2 for f16).
    pub fn expert_params(&self) -> usize {
        self.moe.as_ref().map_or(0, |m| 3 * self.hidden * m.expert_intermediate)
    }

    /// Whether layer `i` runs routed experts.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.moe_layers.get(i).copied().unwrap_or(false)
    }

    /// A stable 64-bit hash of the architecture (FNV-1a over its JSON), tying stores to models.
    pub fn hash(&self) -> u64 {
        let json = serde_json::to_vec(self).expect("ArchSpec serialises");
        json.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
    }
}
