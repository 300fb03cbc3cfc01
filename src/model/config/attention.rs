//! The attention kind of a model: grouped-query heads, or DeepSeek's multi-head latent attention.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fields::{get, opt_usize, usize_field};
use super::rope::{rope_factor, rope_object, yarn_mscale};
use crate::error::{Error, Result};

/// How a layer attends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AttentionKind {
    /// Grouped-query attention: `heads` query heads share `kv_heads` key/value heads of
    /// `head_dim`; the KV cache holds every position's keys and values.
    Grouped,
    /// Multi-head latent attention (DeepSeek-V2/V3): keys and values are decompressed from one
    /// latent per position, which is all the KV cache holds.
    Mla(MlaSpec),
}

/// The ranks and head widths of multi-head latent attention.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MlaSpec {
    /// Rank of the query compression (`q_a_proj` → `q_a_layernorm` → `q_b_proj`); `None` for a
    /// plain `q_proj` (DeepSeek-V2-Lite).
    pub q_lora_rank: Option<usize>,
    /// Width of the normalised key/value latent `c` (`kv_a_layernorm`).
    pub kv_lora_rank: usize,
    /// Per-head query/key width without position (decompressed from `c` by `kv_b_proj`).
    pub qk_nope_head_dim: usize,
    /// Per-head query width with RoPE; the key's rotary part is one vector shared by all heads.
    pub qk_rope_head_dim: usize,
    /// Per-head value width.
    pub v_head_dim: usize,
    /// The attention logits' scale: `qk_head_dim^-0.5`, times `mscale(factor, mscale_all_dim)^2`
    /// when the RoPE block is scaled and has `mscale_all_dim` (DeepSeek's YaRN correction).
    pub softmax_scale: f32,
    /// What the engine caches per position (`EngineOptions::mla_cache`; never read from a
    /// config nor serialised, so [`super::ArchSpec::hash`] does not depend on it).
    #[serde(skip)]
    pub cache: MlaCacheKind,
}

/// What an MLA layer's KV cache holds per position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MlaCacheKind {
    /// The normalised latent and the shared rotary key (`kv_lora_rank + qk_rope_head_dim`
    /// values); attention runs in the absorbed form.
    #[default]
    Latent,
    /// Every head's key (`qk_nope_head_dim + qk_rope_head_dim`) and value (`v_head_dim`),
    /// decompressed from the latent by `kv_b_proj` as transformers caches them; attention runs
    /// as plain multi-head attention (a benchmark and cross-check of the latent cache).
    Decompressed,
}

impl MlaSpec {
    /// Query/key head width (`qk_nope_head_dim + qk_rope_head_dim`).
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Width of `kv_a_proj_with_mqa`'s output: the latent and the shared rotary key.
    pub fn latent_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Bytes cached per position and layer in `dtype`: the latent and the shared rotary key
    /// (rows of their own), or with [`MlaCacheKind::Decompressed`] every head's key and value
    /// for `n_heads` heads.
    pub fn cached_row_bytes(&self, n_heads: usize, dtype: crate::quant::KvDtype) -> usize {
        match self.cache {
            MlaCacheKind::Latent => dtype.row_bytes(self.kv_lora_rank) + dtype.row_bytes(self.qk_rope_head_dim),
            MlaCacheKind::Decompressed => {
                n_heads * (dtype.row_bytes(self.qk_head_dim()) + dtype.row_bytes(self.v_head_dim))
            }
        }
    }
}

/// Parses the MLA fields of a DeepSeek config.
pub(super) fn parse_mla(cfg: &Value) -> Result<MlaSpec> {
    let positive = |key: &str| -> Result<usize> {
        match usize_field(cfg, key)? {
            0 => Err(Error::UnsupportedConfig(format!("{key} must be positive"))),
            v => Ok(v),
        }
    };
    let q_lora_rank = match opt_usize(cfg, "q_lora_rank")? {
        Some(0) => return Err(Error::UnsupportedConfig("q_lora_rank must be positive (or null)".into())),
        r => r,
    };
    let (kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) = (
        positive("kv_lora_rank")?,
        positive("qk_nope_head_dim")?,
        positive("qk_rope_head_dim")?,
        positive("v_head_dim")?,
    );
    if qk_rope_head_dim % 2 != 0 {
        return Err(Error::UnsupportedConfig(format!("qk_rope_head_dim {qk_rope_head_dim} must be even for RoPE")));
    }
    let p = rope_object(cfg);
    let scaled =
        p.and_then(|p| p.get("rope_type").or_else(|| p.get("type"))).and_then(Value::as_str).unwrap_or("default")
            != "default";
    let mscale_all_dim = p.and_then(|p| get(p, "mscale_all_dim")).and_then(Value::as_f64).unwrap_or(0.0);
    let mut scale = ((qk_nope_head_dim + qk_rope_head_dim) as f64).powf(-0.5);
    if scaled && mscale_all_dim != 0.0 {
        let factor = rope_factor(p)?.ok_or_else(|| Error::ConfigField("rope factor".into()))?;
        let m = yarn_mscale(factor, mscale_all_dim as f32) as f64;
        scale *= m * m;
    }
    Ok(MlaSpec {
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim,
        softmax_scale: scale as f32,
        cache: MlaCacheKind::Latent,
    })
}
