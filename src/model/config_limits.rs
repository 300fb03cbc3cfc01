//! Sane bounds on every size a model description carries, and the cross-checks between its
//! sizes and against the tensors a checkpoint actually holds.
//!
//! Sizes come from files a user downloaded (`config.json`, a converted `model.json`); a broken
//! or hostile one must give a typed error naming the field and value before any size is used in
//! arithmetic or an allocation. The bounds are far above every released model (largest today:
//! hidden 16384, 126 layers, vocab 262144, 384 experts, intermediate 53248, head_dim 256) and
//! low enough that any product the engine forms from them (KV cache bytes, slot bytes, expert
//! counts) fits in 64 bits with room to spare, so only sizes read from data files need checked
//! arithmetic downstream.

use serde_json::Value;

use super::config::{ArchSpec, Family};
use super::names;
use super::weights::Checkpoint;
use crate::error::{Error, Result};

/// Most decoder layers (`num_hidden_layers`).
pub const MAX_LAYERS: usize = 1 << 10;
/// Largest hidden size (`hidden_size`).
pub const MAX_HIDDEN: usize = 1 << 16;
/// Largest intermediate size of a dense MLP, a routed or a shared expert.
pub const MAX_INTERMEDIATE: usize = 1 << 18;
/// Largest vocabulary (`vocab_size`); token ids are u32.
pub const MAX_VOCAB: usize = 1 << 22;
/// Most attention or key/value heads.
pub const MAX_HEADS: usize = 1 << 10;
/// Largest `head_dim`.
pub const MAX_HEAD_DIM: usize = 1 << 10;
/// Most routed experts per layer (ids fit a u16 in prerouter datasets).
pub const MAX_EXPERTS: usize = 1 << 12;
/// Longest `max_position_embeddings`.
pub const MAX_POSITIONS: usize = 1 << 24;
/// Bound of any other integer field of a config (they are u32 in every reader).
pub const MAX_OTHER: usize = u32::MAX as usize;

/// The accepted range of an integer `config.json` field, by key.
fn field_range(key: &str) -> (usize, usize) {
    match key {
        "num_hidden_layers" => (1, MAX_LAYERS),
        "hidden_size" => (1, MAX_HIDDEN),
        "intermediate_size" | "moe_intermediate_size" | "shared_expert_intermediate_size" => (0, MAX_INTERMEDIATE),
        "vocab_size" => (1, MAX_VOCAB),
        "num_attention_heads" | "num_key_value_heads" => (1, MAX_HEADS),
        "head_dim" => (1, MAX_HEAD_DIM),
        "num_local_experts" | "num_experts" | "num_experts_per_tok" => (1, MAX_EXPERTS),
        "max_position_embeddings" => (1, MAX_POSITIONS),
        "decoder_sparse_step" => (0, MAX_LAYERS),
        _ => (0, MAX_OTHER),
    }
}

fn out_of_range(field: &str, value: impl ToString, expected: String) -> Error {
    Error::ConfigValue { field: field.into(), value: value.to_string(), expected }
}

/// Checks an integer read from `config.json` field `key` against that field's range.
pub fn check_field(key: &str, value: &Value) -> Result<usize> {
    let (lo, hi) = field_range(key);
    let v = value.as_u64().ok_or_else(|| Error::ConfigField(key.into()))?;
    match usize::try_from(v) {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(out_of_range(key, v, format!("{lo}..={hi}"))),
    }
}

fn in_range(field: &str, value: usize, lo: usize, hi: usize) -> Result<()> {
    match (lo..=hi).contains(&value) {
        true => Ok(()),
        false => Err(out_of_range(field, value, format!("{lo}..={hi}"))),
    }
}

impl ArchSpec {
    /// Checks every size against its bound and the sizes against each other. Run on every
    /// description read from a file: [`ArchSpec::from_config`] and a converted `model.json`.
    pub fn check_limits(&self) -> Result<()> {
        in_range("num_hidden_layers", self.layers, 1, MAX_LAYERS)?;
        in_range("hidden_size", self.hidden, 1, MAX_HIDDEN)?;
        in_range("vocab_size", self.vocab, 1, MAX_VOCAB)?;
        in_range("num_attention_heads", self.heads, 1, MAX_HEADS)?;
        in_range("num_key_value_heads", self.kv_heads, 1, self.heads)?;
        in_range("head_dim", self.head_dim, 1, MAX_HEAD_DIM)?;
        in_range("max_position_embeddings", self.max_positions, 1, MAX_POSITIONS)?;
        in_range("intermediate_size", self.dense_intermediate, 0, MAX_INTERMEDIATE)?;
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(out_of_range("num_key_value_heads", self.kv_heads, format!("a divisor of {}", self.heads)));
        }
        if self.moe_layers.len() != self.layers {
            return Err(out_of_range(
                "moe_layers",
                self.moe_layers.len(),
                format!("one entry per layer ({})", self.layers),
            ));
        }
        if !self.layer_windows.is_empty() && self.layer_windows.len() != self.layers {
            return Err(out_of_range(
                "layer_windows",
                self.layer_windows.len(),
                format!("none or one entry per layer ({})", self.layers),
            ));
        }
        if self.layer_windows.contains(&Some(0)) {
            return Err(out_of_range("sliding_window", 0, "≥ 1".into()));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return Err(out_of_range("rms_norm_eps", self.rms_eps, "a finite value ≥ 0".into()));
        }
        // Above 1 as config.json's reader requires: a GGUF `rope.freq_base` of 1.4e-45 gave NaN.
        if !(self.rope.theta.is_finite() && self.rope.theta > 1.0) {
            return Err(out_of_range("rope_theta", self.rope.theta, "a finite value > 1".into()));
        }
        if self.moe_layers.iter().any(|m| !m) && self.dense_intermediate == 0 {
            return Err(out_of_range("intermediate_size", 0, "≥ 1 (the model has dense layers)".into()));
        }
        match &self.moe {
            None if self.moe_layers.iter().any(|&m| m) => {
                Err(out_of_range("moe_layers", "MoE layers", "none in a dense model".into()))
            }
            None => Ok(()),
            Some(m) => {
                in_range("num_experts", m.num_experts, 1, MAX_EXPERTS)?;
                in_range("num_experts_per_tok", m.top_k, 1, m.num_experts)?;
                // Mixtral and OLMoE read it from `intermediate_size`.
                in_range("moe_intermediate_size", m.expert_intermediate, 1, MAX_INTERMEDIATE)?;
                match m.shared_expert_intermediate {
                    Some(s) => in_range("shared_expert_intermediate_size", s, 1, MAX_INTERMEDIATE),
                    None => Ok(()),
                }
            }
        }
    }

    /// Checks the sizes that buffers are allocated from against the tensors `ckpt` holds,
    /// reading headers only, so a config that lies about its checkpoint fails before any
    /// allocation it would size: the embedding `[vocab, hidden]`, the final norm, a tensor of
    /// the last layer, and where the checkpoint has them under the usual names, layer 0's q and
    /// k projections, the first dense MLP and the first MoE layer's router, shared expert and
    /// routed expert (tensors named otherwise are checked when their layer loads).
    pub fn check_against(&self, ckpt: &Checkpoint) -> Result<()> {
        let h = self.hidden;
        ckpt.check_shape(names::EMBED, &[self.vocab, h])?;
        ckpt.check_shape(names::FINAL_NORM, &[h])?;
        let last = format!("{}.", names::layer(self.layers - 1));
        if !ckpt.names().any(|n| n.starts_with(&last)) {
            return Err(Error::MissingTensor(format!("{last}* (num_hidden_layers is {})", self.layers)));
        }
        let if_present = |name: &str, shape: &[usize]| match ckpt.contains(name) {
            true => ckpt.check_shape(name, shape),
            false => Ok(()),
        };
        if let Some(full) = (0..self.layers).find(|&i| !self.is_linear_layer(i)) {
            let attn = format!("{}.self_attn", names::layer(full));
            // Gated grouped attention's q_proj also holds the output gate's rows.
            let gated = self.mla().is_none() && self.hybrid.as_ref().is_some_and(|hy| hy.attn_output_gate);
            if_present(&format!("{attn}.q_proj.weight"), &[self.q_dim() * if gated { 2 } else { 1 }, h])?;
            if self.mla().is_none() {
                if_present(&format!("{attn}.k_proj.weight"), &[self.kv_dim(), h])?;
            }
        }
        if let Some(dense) = (0..self.layers).find(|&i| !self.is_moe_layer(i)) {
            let [gate, _, _] = names::mlp(&format!("{}.mlp", names::layer(dense)));
            if_present(&gate, &[self.dense_intermediate, h])?;
        }
        if let (Some(m), Some(first)) = (&self.moe, (0..self.layers).find(|&i| self.is_moe_layer(i))) {
            if_present(&names::router(self.family, first), &[m.num_experts, h])?;
            if let Some(si) = m.shared_expert_intermediate {
                let [gate, _, _] = names::mlp(&format!("{}.shared_expert", names::ffn_prefix(self.family, first)));
                if_present(&gate, &[si, h])?;
            }
            // Converted models keep their experts in the store, whose header is checked on open.
            let [gate, _, _] = names::expert(self.family, first, 0);
            if_present(&gate, &[m.expert_intermediate, h])?;
            let [gate_up, _] = names::fused_experts(self.family, first);
            let (n, inter) = (m.num_experts, m.expert_intermediate);
            match self.family {
                // gpt-oss stacks `[experts, hidden, 2 * inter]` (x @ W), or MXFP4 blocks of the
                // transposed matrices.
                Family::GptOss => {
                    let t = |name: &str| names::gpt_oss_experts(first, name);
                    if_present(&gate_up, &[n, h, 2 * inter])?;
                    if_present(&t("down_proj"), &[n, inter, h])?;
                    if_present(&t("gate_up_proj_blocks"), &[n, 2 * inter, h / 32, 16])?;
                    if_present(&t("down_proj_blocks"), &[n, h, inter / 32, 16])?;
                }
                _ => if_present(&gate_up, &[n, 2 * inter, h])?,
            }
        }
        // Linear attention: the in-projection (Qwen3.5's split, Qwen3-Next's fused, KDA's q and
        // k) and out-projection of the first linear layer give the key and value widths.
        if let Some((hy, first)) = self.hybrid.as_ref().zip((0..self.layers).find(|&i| self.is_linear_layer(i))) {
            let lin = crate::model::hybrid_weights::module(hy, first);
            if_present(&format!("{lin}.in_proj_qkv.weight"), &[hy.conv_dim(), h])?;
            if_present(&format!("{lin}.in_proj_qkvz.weight"), &[hy.conv_dim() + hy.value_dim(), h])?;
            if_present(&format!("{lin}.out_proj.weight"), &[h, hy.value_dim()])?;
            if_present(&format!("{lin}.q_proj.weight"), &[hy.key_dim(), h])?;
            if_present(&format!("{lin}.o_proj.weight"), &[h, hy.value_dim()])?;
        }
        Ok(())
    }
}
