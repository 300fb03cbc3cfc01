//! The config and tensors of a synthetic Mixtral-layout checkpoint of any size, for tests that
//! need a model the fixtures do not have (large experts, tileable shapes).

use moestream::model::{names, Family};

/// Sizes of a synthetic Mixtral-layout checkpoint (head_dim = hidden / heads, top-2 routing).
#[derive(Clone, Copy, Debug)]
pub struct MixtralShape {
    pub hidden: usize,
    pub inter: usize,
    pub layers: usize,
    pub experts: usize,
    pub vocab: usize,
    pub heads: usize,
    pub kv_heads: usize,
}

impl MixtralShape {
    /// Its `config.json`.
    pub fn config(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["MixtralForCausalLM"], "hidden_size": self.hidden, "intermediate_size": self.inter,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "num_local_experts": self.experts, "num_experts_per_tok": 2,
            "vocab_size": self.vocab, "rms_norm_eps": 1e-5, "rope_theta": 1e4, "max_position_embeddings": 512,
            "tie_word_embeddings": false,
        })
    }

    /// Every tensor's name and shape, and whether it is a norm weight (one value per channel).
    pub fn tensors(&self) -> Vec<(String, Vec<usize>, bool)> {
        let (h, i) = (self.hidden, self.inter);
        let kv = h / self.heads * self.kv_heads;
        let mut out = vec![
            (names::EMBED.to_string(), vec![self.vocab, h], false),
            (names::LM_HEAD.to_string(), vec![self.vocab, h], false),
            (names::FINAL_NORM.to_string(), vec![h], true),
        ];
        for l in 0..self.layers {
            let p = names::layer(l);
            for (w, rows) in [("q_proj", h), ("k_proj", kv), ("v_proj", kv), ("o_proj", h)] {
                out.push((format!("{p}.self_attn.{w}.weight"), vec![rows, h], false));
            }
            out.push((format!("{p}.input_layernorm.weight"), vec![h], true));
            out.push((format!("{p}.post_attention_layernorm.weight"), vec![h], true));
            out.push((format!("{p}.block_sparse_moe.gate.weight"), vec![self.experts, h], false));
            for e in 0..self.experts {
                let [w1, w3, w2] = names::expert(Family::Mixtral, l, e);
                out.extend([(w1, vec![i, h], false), (w3, vec![i, h], false), (w2, vec![h, i], false)]);
            }
        }
        out
    }
}
