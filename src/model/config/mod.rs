//! Parsing Hugging Face `config.json` into one architecture description, with its parameter
//! blocks in their own files: `rope` (RoPE base, scaling, rotary width, pair layout),
//! `attention` (grouped vs multi-head latent attention), `routing` (the router's rule),
//! `window` (which layers attend through a sliding window).

mod attention;
mod cache_size;
mod fields;
mod gpt_oss;
mod hybrid;
mod linear_shapes;
mod ling;
mod moe;
mod rope;
mod routing;
mod window;

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use attention::{AttentionKind, MlaCacheKind, MlaSpec};
pub use cache_size::CacheShape;
pub use hybrid::{HybridSpec, LinearKind, MAX_CONV_KERNEL, MAX_LINEAR_KEY_DIM};
pub use linear_shapes::{DeltaShape, GateAct};
pub use moe::{ExpertAct, MoeSpec};
pub use rope::{yarn_mscale, RopeScaling, RopeSpec};
pub use routing::RoutingKind;

use crate::error::{Error, Result};
use fields::{bool_field, f32_field, get, opt_usize, usize_field};

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
    /// `DeepseekV2ForCausalLM` (MLA, softmax routing, shared experts).
    DeepseekV2,
    /// `DeepseekV3ForCausalLM` (MLA, sigmoid + bias routing, shared experts).
    DeepseekV3,
    /// `Glm4MoeForCausalLM` (grouped attention with partial rotary, sigmoid + bias routing).
    Glm4Moe,
    /// `Qwen3NextForCausalLM` (Gated DeltaNet + gated attention, shared expert with a gate).
    Qwen3Next,
    /// `Qwen3_5MoeForCausalLM` (Qwen3.5/3.6-MoE text model: as Qwen3-Next, split DeltaNet
    /// projections).
    Qwen35Moe,
    /// `GptOssForCausalLM` (attention sinks, alternating sliding/full layers, router bias,
    /// biased experts with a clamped SwiGLU, MXFP4 or bf16 experts).
    GptOss,
    /// `BailingHybridForCausalLM` (Ling 2.x linear: Kimi Delta Attention layers between MLA
    /// layers with a per-head output gate, sigmoid + bias group-limited routing, shared
    /// experts; Ling's own tensor names).
    BailingHybrid,
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
            Family::DeepseekV2 => "DeepseekV2ForCausalLM",
            Family::DeepseekV3 => "DeepseekV3ForCausalLM",
            Family::Glm4Moe => "Glm4MoeForCausalLM",
            Family::Qwen3Next => "Qwen3NextForCausalLM",
            Family::Qwen35Moe => "Qwen3_5MoeForCausalLM",
            Family::GptOss => "GptOssForCausalLM",
            Family::BailingHybrid => "BailingHybridForCausalLM",
        }
    }

    /// The family `dir/config.json` names, `None` when it cannot be read or names none known
    /// (what to do then is the config parser's to say).
    pub fn of_dir(dir: &Path) -> Option<Family> {
        let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
        let cfg: Value = serde_json::from_str(&text).ok()?;
        Family::from_hf_name(get(&cfg, "architectures")?.get(0)?.as_str()?).ok()
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
            "DeepseekV2ForCausalLM" => Family::DeepseekV2,
            "DeepseekV3ForCausalLM" => Family::DeepseekV3,
            "Glm4MoeForCausalLM" => Family::Glm4Moe,
            "Qwen3NextForCausalLM" => Family::Qwen3Next,
            // The multimodal checkpoint's text model (its vision tower is not read).
            "Qwen3_5MoeForCausalLM" | "Qwen3_5MoeForConditionalGeneration" => Family::Qwen35Moe,
            "GptOssForCausalLM" => Family::GptOss,
            "BailingHybridForCausalLM" => Family::BailingHybrid,
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
    /// Rotary embedding.
    pub rope: RopeSpec,
    /// Attention kind (for MLA, `head_dim` is the query/key head width and `kv_heads == heads`).
    pub attention: AttentionKind,
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
    /// Each layer's sliding window (a query sees its last `window` keys, its own included;
    /// `None`: every earlier key); empty when no layer is windowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_windows: Vec<Option<usize>>,
    /// The Gated DeltaNet layers of a hybrid model (Qwen3-Next, Qwen3.5-MoE).
    #[serde(default)]
    pub hybrid: Option<HybridSpec>,
    /// `o_proj` has a bias (gpt-oss's `attention_bias` covers all four projections).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub o_bias: bool,
    /// Each attention layer has a learned sink logit per query head (`self_attn.sinks`,
    /// gpt-oss) that joins the softmax denominator.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_sinks: bool,
    /// Multi-token-prediction ("nextn") layers the checkpoint ships after its decoder layers
    /// (`num_nextn_predict_layers`: DeepSeek-V3, GLM-4.5, Ling; `mtp_num_hidden_layers`:
    /// Qwen3-Next, Qwen3.5; GGUF `nextn_predict_layers`). Not run nor stored: `info` reports
    /// them; left out of [`ArchSpec::hash`] (and of the JSON when 0), so stores made before the
    /// field existed stay valid.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtp_layers: usize,
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
    pub fn from_config(top: &Value) -> Result<ArchSpec> {
        let arch = get(top, "architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .ok_or_else(|| Error::ConfigField("architectures".into()))?;
        let family = Family::from_hf_name(arch)?;
        let with_defaults;
        let cfg = match family {
            Family::GptOss => {
                with_defaults = gpt_oss::with_defaults(hybrid::text_config(top));
                &with_defaults
            }
            Family::BailingHybrid => {
                with_defaults = ling::with_defaults(top);
                &with_defaults
            }
            _ => hybrid::text_config(top),
        };
        let hidden = usize_field(cfg, "hidden_size")?;
        let layers = usize_field(cfg, "num_hidden_layers")?;
        let heads = usize_field(cfg, "num_attention_heads")?;
        let mla = matches!(family, Family::DeepseekV2 | Family::DeepseekV3 | Family::BailingHybrid);
        let attention = if mla { AttentionKind::Mla(attention::parse_mla(cfg)?) } else { AttentionKind::Grouped };
        let (kv_heads, head_dim) = match &attention {
            // Every query head has its own decompressed key and value.
            AttentionKind::Mla(m) => (heads, m.qk_head_dim()),
            AttentionKind::Grouped => (
                opt_usize(cfg, "num_key_value_heads")?.unwrap_or(heads),
                opt_usize(cfg, "head_dim")?.unwrap_or(hidden / heads.max(1)),
            ),
        };
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
        if let Some(act) = fields::opt_str(cfg, "hidden_act")?.filter(|a| *a != "silu") {
            return Err(Error::UnsupportedConfig(format!("hidden_act {act:?} is not implemented (SwiGLU with silu)")));
        }
        if let Some(q) = get(cfg, "quantization_config") {
            let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("unknown");
            // gpt-oss's MXFP4 experts are read natively (`layer_weights::gpt_oss`).
            if !(family == Family::GptOss && method == "mxfp4") {
                return Err(Error::UnsupportedConfig(format!(
                    "quantization_config ({method}) is not implemented: use a bf16/f16/f32 checkpoint"
                )));
            }
        }
        if get(cfg, "clip_qkv").is_some() {
            return Err(Error::UnsupportedConfig("clip_qkv is not supported".into()));
        }
        let vocab = usize_field(cfg, "vocab_size")?;
        if vocab == 0 {
            return Err(Error::UnsupportedConfig("vocab_size must be positive".into()));
        }
        let max_positions = opt_usize(cfg, "max_position_embeddings")?.unwrap_or(4096);
        let default_theta = match family {
            Family::Mixtral => 1e6,
            Family::GptOss => 150000.0,
            _ => 10000.0,
        };
        let (rope_width, default_partial) = match (&attention, family) {
            (AttentionKind::Mla(m), _) => (m.qk_rope_head_dim, 1.0),
            (_, Family::Glm4Moe) => (head_dim, 0.5),
            (_, Family::Qwen3Next | Family::Qwen35Moe) => (head_dim, 0.25),
            _ => (head_dim, 1.0),
        };
        // DeepSeek-V2 and Ling rotate adjacent pairs (complex multiplication); V3 does unless
        // `rope_interleave` is false; every other family rotates halves.
        let interleaved = match family {
            Family::DeepseekV2 | Family::BailingHybrid => true,
            Family::DeepseekV3 => bool_field(cfg, "rope_interleave", true)?,
            _ => false,
        };
        let rope = rope::parse(cfg, rope_width, default_theta, default_partial, interleaved, max_positions)?;
        if mla && rope.rotary_dim != rope_width {
            return Err(Error::UnsupportedConfig("partial_rotary_factor with MLA is not implemented".into()));
        }
        let dense_intermediate = opt_usize(cfg, "intermediate_size")?.unwrap_or(0);
        let (moe, moe_layers) = moe::parse(cfg, family, layers, dense_intermediate)?;
        if moe_layers.iter().any(|m| !m) && dense_intermediate == 0 {
            return Err(Error::ConfigField("intermediate_size".into()));
        }
        let qkv_bias = match family {
            Family::Qwen2 | Family::Qwen2Moe => bool_field(cfg, "qkv_bias", true)?,
            Family::GptOss => bool_field(cfg, "attention_bias", true)?,
            _ => bool_field(cfg, "attention_bias", false)?,
        };
        if mla && qkv_bias {
            return Err(Error::UnsupportedConfig("attention_bias with MLA is not implemented".into()));
        }
        if bool_field(cfg, "mlp_bias", false)? {
            return Err(Error::UnsupportedConfig("mlp_bias is not supported".into()));
        }
        let qk_norm = match family {
            Family::Qwen3 | Family::Qwen3Moe | Family::Qwen3Next | Family::Qwen35Moe => QkNorm::PerHead,
            Family::Glm4Moe if bool_field(cfg, "use_qk_norm", false)? => QkNorm::PerHead,
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
            rms_eps: f32_field(cfg, "rms_norm_eps", if family == Family::GptOss { 1e-5 } else { 1e-6 })?,
            rope,
            attention,
            max_positions,
            qkv_bias,
            qk_norm,
            tie_embeddings: bool_field(cfg, "tie_word_embeddings", tie_default)?,
            dense_intermediate,
            moe,
            moe_layers,
            eos_token_ids: eos_ids(cfg),
            layer_windows: window::parse(cfg, family, layers)?,
            hybrid: hybrid::parse(cfg, family, layers)?,
            o_bias: family == Family::GptOss && qkv_bias,
            attention_sinks: family == Family::GptOss,
            mtp_layers: match opt_usize(cfg, "num_nextn_predict_layers")? {
                Some(n) => n,
                None => opt_usize(cfg, "mtp_num_hidden_layers")?.unwrap_or(0),
            },
        };
        spec.check_limits()?;
        Ok(spec)
    }

    /// The widest input of any dense matrix a step multiplies (the routed experts aside): the
    /// hidden size, attention outputs, low-rank latents, dense and shared MLP intermediates,
    /// the linear attention's values.
    pub fn widest_dense_input(&self) -> usize {
        let mla =
            self.mla().map_or(0, |m| (self.heads * m.v_head_dim).max(m.kv_lora_rank).max(m.q_lora_rank.unwrap_or(0)));
        let shared = self.moe.as_ref().and_then(|m| m.shared_expert_intermediate).unwrap_or(0);
        let linear = self.hybrid.as_ref().map_or(0, |h| h.value_dim());
        [self.hidden, self.q_dim(), mla, self.dense_intermediate, shared, linear].into_iter().max().unwrap_or(0)
    }

    /// Query projection width (`heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Key/value projection width (`kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// The scale of the attention logits: `1/sqrt(head_dim)`, or MLA's (with DeepSeek's YaRN
    /// correction).
    pub fn attention_scale(&self) -> f32 {
        match &self.attention {
            AttentionKind::Grouped => 1.0 / (self.head_dim as f32).sqrt(),
            AttentionKind::Mla(m) => m.softmax_scale,
        }
    }

    /// The MLA block, when attention is latent.
    pub fn mla(&self) -> Option<&MlaSpec> {
        match &self.attention {
            AttentionKind::Mla(m) => Some(m),
            AttentionKind::Grouped => None,
        }
    }

    /// Whether layer `i` is a linear-attention (Gated DeltaNet or KDA) layer.
    pub fn is_linear_layer(&self, i: usize) -> bool {
        self.hybrid.as_ref().is_some_and(|h| h.is_linear(i))
    }

    /// Whether the RMSNorm weights are zero-centred (`x * (1 + w)`, Qwen3-Next / Qwen3.5):
    /// the weight readers add the 1 so every norm kernel computes `x * w`.
    pub fn zero_centred_norms(&self) -> bool {
        matches!(self.family, Family::Qwen3Next | Family::Qwen35Moe)
    }

    /// Bytes of one routed expert's gate, up and down weights at `bytes_per_weight` (2 for f16).
    pub fn expert_params(&self) -> usize {
        self.moe.as_ref().map_or(0, |m| 3 * self.hidden * m.expert_intermediate)
    }

    /// Layer `i`'s sliding window, `None` for full causal attention.
    pub fn window(&self, i: usize) -> Option<usize> {
        self.layer_windows.get(i).copied().flatten()
    }

    /// Whether layer `i` runs routed experts.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.moe_layers.get(i).copied().unwrap_or(false)
    }

    /// A stable 64-bit hash of the architecture (FNV-1a over its JSON), tying stores to models;
    /// the MTP layers, which no store holds, are left out.
    pub fn hash(&self) -> u64 {
        let stored = ArchSpec { mtp_layers: 0, ..self.clone() };
        let json = serde_json::to_vec(&stored).expect("ArchSpec serialises");
        json.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
    }
}

/// `n == 0` (serde's `skip_serializing_if`).
fn is_zero(n: &usize) -> bool {
    *n == 0
}
