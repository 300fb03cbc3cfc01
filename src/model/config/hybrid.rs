//! The hybrid layer pattern of Qwen3-Next and Qwen3.5/3.6-MoE (Gated DeltaNet layers between
//! gated full-attention layers) and of Ling (Kimi Delta Attention layers between MLA layers),
//! and the linear layers' sizes and recurrence.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fields::{bool_field, f32_field, get, opt_str, opt_usize, usize_field};
use super::Family;
use crate::error::{Error, Result};

/// Largest `linear_conv_kernel_dim` the causal conv kernel takes.
pub const MAX_CONV_KERNEL: usize = 8;
/// Largest DeltaNet key head width (the delta-rule kernel keeps one key and query in
/// workgroup memory).
pub const MAX_LINEAR_KEY_DIM: usize = 256;

/// The recurrence of a hybrid model's linear-attention layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum LinearKind {
    /// Gated DeltaNet (Qwen3-Next, Qwen3.5): one decay per value head,
    /// `g = -exp(A_log) * softplus(a + dt_bias)`; the output norm is gated by `silu(z)`.
    #[default]
    GatedDeltaNet,
    /// Kimi Delta Attention (Ling): one decay per key channel from `f_proj`,
    /// `g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias))` with the safe gate
    /// (`kda_safe_gate`, `kda_lower_bound`), else `g = -exp(A_log) * softplus(f + dt_bias)`
    /// (`dt_bias` per channel, `A_log` per head); the output norm is gated by `sigmoid(g_proj x)`.
    Kda {
        /// The safe gate's lower bound of `g`; `None` for the softplus gate.
        lower_bound: Option<f32>,
    },
}

impl LinearKind {
    /// Whether this is Gated DeltaNet.
    pub fn is_gated_delta_net(&self) -> bool {
        *self == LinearKind::GatedDeltaNet
    }
}

/// The linear-attention block of a hybrid model and where it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HybridSpec {
    /// Per layer: `true` for a linear-attention layer, `false` for full attention (gated
    /// grouped attention, or Ling's MLA).
    pub linear_layers: Vec<bool>,
    /// The linear layers' recurrence.
    #[serde(default, skip_serializing_if = "LinearKind::is_gated_delta_net")]
    pub kind: LinearKind,
    /// Key (and query) heads of the DeltaNet.
    pub num_k_heads: usize,
    /// Value heads; each key head serves `num_v_heads / num_k_heads` consecutive ones.
    pub num_v_heads: usize,
    /// Width of one key head.
    pub head_k_dim: usize,
    /// Width of one value head.
    pub head_v_dim: usize,
    /// Taps of the short causal depthwise convolution over q, k and v.
    pub conv_kernel: usize,
    /// Qwen3-Next's fused in-projections (`in_proj_qkvz`, `in_proj_ba`, rows grouped by key
    /// head); Qwen3.5's are split (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`).
    pub fused_projection: bool,
    /// The full-attention output is multiplied by the sigmoid of a gate: a per-channel one
    /// from the rows `q_proj` adds (gated grouped attention), or one per head from `g_proj`
    /// (Ling's MLA).
    pub attn_output_gate: bool,
}

impl HybridSpec {
    /// `num_k_heads * head_k_dim`.
    pub fn key_dim(&self) -> usize {
        self.num_k_heads * self.head_k_dim
    }

    /// `num_v_heads * head_v_dim`.
    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.head_v_dim
    }

    /// Channels of the causal convolution: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Decay inputs per token: `a`, one per value head (Gated DeltaNet), or KDA's `f`, one per
    /// key channel.
    pub fn decay_inputs(&self) -> usize {
        match self.kind {
            LinearKind::GatedDeltaNet => self.num_v_heads,
            LinearKind::Kda { .. } => self.key_dim(),
        }
    }

    /// Width of the in-projection as the decoder lays it out: `[q | k | v | z | b | a]`
    /// (KDA: `z` is `g_proj`'s output gate, `a` is `f_proj`'s decay input).
    pub fn in_width(&self) -> usize {
        self.conv_dim() + self.value_dim() + self.num_v_heads + self.decay_inputs()
    }

    /// f32 values of one layer's state: the conv window (`conv_kernel - 1` past inputs per
    /// channel) and the recurrent state (`head_k_dim x head_v_dim` per value head).
    pub fn state_floats(&self) -> usize {
        self.conv_dim() * (self.conv_kernel - 1) + self.num_v_heads * self.head_k_dim * self.head_v_dim
    }

    /// Whether layer `i` is a linear-attention layer.
    pub fn is_linear(&self, i: usize) -> bool {
        self.linear_layers.get(i).copied().unwrap_or(false)
    }
}

/// Parses the hybrid block of a Qwen3-Next / Qwen3.5-MoE text config or of a Ling config
/// (rewritten by `ling::with_defaults`), `None` for other families.
pub(super) fn parse(cfg: &Value, family: Family, layers: usize) -> Result<Option<HybridSpec>> {
    if !matches!(family, Family::Qwen3Next | Family::Qwen35Moe | Family::BailingHybrid) {
        return Ok(None);
    }
    let linear_layers = match get(cfg, "layer_types") {
        Some(Value::Array(types)) => {
            if types.len() != layers {
                return Err(Error::UnsupportedConfig(format!(
                    "layer_types has {} entries for {layers} layers",
                    types.len()
                )));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("linear_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    other => Err(Error::UnsupportedConfig(format!("layer type {other:?} is not implemented"))),
                })
                .collect::<Result<Vec<bool>>>()?
        }
        Some(_) => return Err(Error::ConfigField("layer_types".into())),
        None => {
            // Every `interval`-th layer is full attention: Qwen's `full_attention_interval`,
            // Ling's `layer_group_size`.
            let (key, default) = match family {
                Family::BailingHybrid => ("layer_group_size", 6),
                _ => ("full_attention_interval", 4),
            };
            let interval = match opt_usize(cfg, key)?.unwrap_or(default) {
                0 => return Err(Error::UnsupportedConfig(format!("{key} must be positive"))),
                n => n,
            };
            (0..layers).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    let positive = |key: &str| -> Result<usize> {
        match usize_field(cfg, key)? {
            0 => Err(Error::UnsupportedConfig(format!("{key} must be positive"))),
            v => Ok(v),
        }
    };
    let kind = match family {
        Family::BailingHybrid => {
            let lower_bound = f32_field(cfg, "kda_lower_bound", -5.0)?;
            if !lower_bound.is_finite() {
                return Err(Error::UnsupportedConfig(format!("kda_lower_bound {lower_bound} must be finite")));
            }
            LinearKind::Kda { lower_bound: bool_field(cfg, "kda_safe_gate", true)?.then_some(lower_bound) }
        }
        _ => LinearKind::GatedDeltaNet,
    };
    let spec = HybridSpec {
        linear_layers,
        kind,
        num_k_heads: positive("linear_num_key_heads")?,
        num_v_heads: positive("linear_num_value_heads")?,
        head_k_dim: positive("linear_key_head_dim")?,
        head_v_dim: positive("linear_value_head_dim")?,
        conv_kernel: positive("linear_conv_kernel_dim")?,
        fused_projection: family == Family::Qwen3Next,
        // Ling's MLA layers always have their `g_proj`.
        attn_output_gate: family == Family::BailingHybrid || bool_field(cfg, "attn_output_gate", true)?,
    };
    if !spec.num_v_heads.is_multiple_of(spec.num_k_heads) {
        return Err(Error::UnsupportedConfig(format!(
            "linear_num_value_heads {} must be a multiple of linear_num_key_heads {}",
            spec.num_v_heads, spec.num_k_heads
        )));
    }
    if spec.conv_kernel < 2 || spec.conv_kernel > MAX_CONV_KERNEL {
        return Err(Error::UnsupportedConfig(format!(
            "linear_conv_kernel_dim {} not in 2..={MAX_CONV_KERNEL}",
            spec.conv_kernel
        )));
    }
    if spec.head_k_dim > MAX_LINEAR_KEY_DIM {
        return Err(Error::UnsupportedConfig(format!(
            "linear_key_head_dim {} above the kernel's {MAX_LINEAR_KEY_DIM}",
            spec.head_k_dim
        )));
    }
    if let Some(act) = opt_str(cfg, "hidden_act")?.filter(|a| *a != "silu") {
        return Err(Error::UnsupportedConfig(format!("hidden_act {act:?} is not implemented (silu)")));
    }
    Ok(Some(spec))
}

/// The text part of a config: Qwen3.5's multimodal configs nest it under `text_config`
/// (architectures stay at the top).
pub(super) fn text_config(cfg: &Value) -> &Value {
    match get(cfg, "text_config") {
        Some(t @ Value::Object(_)) => t,
        _ => cfg,
    }
}
