//! The reference model: every weight of a small checkpoint in host memory, as f32.

use std::path::Path;

use super::ops::{argmax, log_softmax};
use super::session::ReferenceSession;
use crate::error::{Error, Result};
use crate::model::layer_weights::{self, LayerWeights, MlpWeights};
use crate::model::lora::LoraAdapter;
use crate::model::{ArchSpec, Checkpoint, HostTensor};
use crate::quant::KvDtype;

/// A whole model held in host memory as f32, run on the CPU one token at a time.
///
/// Meant for tiny test checkpoints only: it reads every routed expert up front.
pub struct ReferenceModel {
    pub(super) spec: ArchSpec,
    pub(super) embed: HostTensor,
    pub(super) final_norm: HostTensor,
    pub(super) lm_head: HostTensor,
    pub(super) layers: Vec<LayerWeights>,
    /// `experts[layer][expert]`; empty for dense layers.
    pub(super) experts: Vec<Vec<MlpWeights>>,
    /// What sessions round keys and values to as they cache them.
    pub(super) kv_dtype: KvDtype,
}

impl ReferenceModel {
    /// Reads `dir/config.json` and every tensor of the checkpoint in `dir`, checking all shapes.
    pub fn load(dir: &Path) -> Result<ReferenceModel> {
        let spec = ArchSpec::from_dir(dir)?;
        let ck = Checkpoint::open(dir)?;
        ReferenceModel::from_checkpoint(spec, &ck)
    }

    /// Builds the model from an already parsed spec and opened checkpoint.
    pub fn from_checkpoint(spec: ArchSpec, ck: &Checkpoint) -> Result<ReferenceModel> {
        let (embed, final_norm, lm_head) = layer_weights::globals(ck, &spec)?;
        let mut layers = Vec::with_capacity(spec.layers);
        let mut experts = Vec::with_capacity(spec.layers);
        for i in 0..spec.layers {
            layers.push(layer_weights::layer(ck, &spec, i)?);
            let n = match &spec.moe {
                Some(m) if spec.is_moe_layer(i) => m.num_experts,
                _ => 0,
            };
            experts.push((0..n).map(|e| layer_weights::expert(ck, &spec, i, e)).collect::<Result<Vec<_>>>()?);
        }
        Ok(ReferenceModel { spec, embed, final_norm, lm_head, layers, experts, kv_dtype: KvDtype::F32 })
    }

    /// The model with `adapter` merged into its weights ([`LoraAdapter::merge_into`]), to
    /// check the GPU's unmerged deltas against. Merge after [`ReferenceModel::rounded_like`]:
    /// the GPU rounds the base weights, never the f32 deltas.
    pub fn with_lora(mut self, adapter: &LoraAdapter) -> Result<ReferenceModel> {
        adapter.merge_into(&mut self.layers)?;
        Ok(self)
    }

    /// The same model with every session's cache rounded to `dtype` as the GPU's cache of that
    /// type holds it (see [`crate::reference::KvCache::with_rounding`]): grouped attention's
    /// keys and values head by head, MLA's latent and rotary key before they are decompressed.
    /// What that KV cache alone does to the output.
    pub fn with_kv_dtype(mut self, dtype: KvDtype) -> ReferenceModel {
        self.kv_dtype = dtype;
        self
    }

    /// The architecture.
    pub fn spec(&self) -> &ArchSpec {
        &self.spec
    }

    /// Token embedding `[vocab, hidden]`.
    pub fn embed(&self) -> &HostTensor {
        &self.embed
    }

    /// Final RMSNorm weight `[hidden]`.
    pub fn final_norm(&self) -> &HostTensor {
        &self.final_norm
    }

    /// Output projection `[vocab, hidden]` (a copy of the embedding when tied).
    pub fn lm_head(&self) -> &HostTensor {
        &self.lm_head
    }

    /// Non-expert weights of every layer.
    pub fn layers(&self) -> &[LayerWeights] {
        &self.layers
    }

    /// Routed experts of layer `layer` (empty for dense layers).
    pub fn experts(&self, layer: usize) -> &[MlpWeights] {
        &self.experts[layer]
    }

    /// A fresh incremental-decoding session.
    pub fn session(&self) -> ReferenceSession<'_> {
        ReferenceSession::new(self)
    }

    /// Checks a prompt: non-empty ([`Error::EmptyPrompt`]), every id in the vocabulary
    /// ([`Error::TokenOutOfRange`]) and `total` positions within `max_positions`
    /// ([`Error::ContextOverflow`]).
    fn validate(&self, tokens: &[u32], total: usize) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.spec.vocab) {
            return Err(Error::TokenOutOfRange { id, vocab: self.spec.vocab });
        }
        if total > self.spec.max_positions {
            return Err(Error::ContextOverflow { requested: total, context: self.spec.max_positions });
        }
        Ok(())
    }

    /// Logits `[vocab]` after every position of `tokens` (causal), one vector per token.
    pub fn forward(&self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.validate(tokens, tokens.len())?;
        let mut session = self.session();
        tokens.iter().map(|&t| session.step(t)).collect()
    }

    /// `log p(tokens[i + 1] | tokens[..=i])` for every `i`: `tokens.len() - 1` values.
    pub fn log_probs(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let logits = self.forward(tokens)?;
        Ok(logits.iter().zip(&tokens[1..]).map(|(l, &next)| log_softmax(l)[next as usize]).collect())
    }

    /// Greedy (argmax, lowest id on ties) continuation of `tokens` by `n` new tokens, without
    /// stopping at end-of-sequence. Returns only the new tokens. The whole sequence
    /// (`tokens.len() + n`) must fit in `max_positions`.
    pub fn greedy(&self, tokens: &[u32], n: usize) -> Result<Vec<u32>> {
        self.validate(tokens, tokens.len() + n)?;
        let mut session = self.session();
        let mut logits = Vec::new();
        for &t in tokens {
            logits = session.step(t)?;
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let next = argmax(&logits) as u32;
            out.push(next);
            if i + 1 < n {
                logits = session.step(next)?;
            }
        }
        Ok(out)
    }
}
