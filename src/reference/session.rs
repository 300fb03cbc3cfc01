//! Incremental decoding with the reference model: one token per step over a growing KV cache.

use super::kv_cache::KvCache;
use super::layer::{attention_block, ffn_block};
use super::model::ReferenceModel;
use super::ops::{matvec, rms_norm};
use crate::error::{Error, Result};
use crate::model::ArchSpec;
use crate::quant::KvDtype;

/// A decoding session over a [`ReferenceModel`]: holds the KV cache and the position.
pub struct ReferenceSession<'m> {
    model: &'m ReferenceModel,
    cache: KvCache,
    pos: usize,
    routing: Vec<Vec<(usize, f32)>>,
    hidden: Vec<f32>,
}

/// An empty cache for every layer of `spec`, rounding what it caches to `dtype` as the GPU's
/// cache of that type does.
pub(super) fn new_cache(spec: &ArchSpec, dtype: KvDtype) -> KvCache {
    let (k, v) = kv_widths(spec);
    let cache = KvCache::new(spec.layers, k, v).with_linear_states(spec);
    cache.with_rounding(dtype, if spec.mla().is_some() { 0 } else { spec.head_dim })
}

/// Key and value row widths of the reference cache: MLA caches decompressed per-head keys
/// `[k_nope | k_rope]` and values.
fn kv_widths(spec: &ArchSpec) -> (usize, usize) {
    match spec.mla() {
        Some(m) => (spec.heads * m.qk_head_dim(), spec.heads * m.v_head_dim),
        None => (spec.kv_dim(), spec.kv_dim()),
    }
}

impl<'m> ReferenceSession<'m> {
    /// A fresh session at position 0.
    pub fn new(model: &'m ReferenceModel) -> ReferenceSession<'m> {
        let spec = model.spec();
        ReferenceSession {
            model,
            cache: new_cache(spec, model.kv_dtype),
            pos: 0,
            routing: vec![Vec::new(); spec.layers],
            hidden: Vec::new(),
        }
    }

    /// The last step's hidden state `[hidden]` after the final norm: what the lm_head reads,
    /// and an MTP module (empty before the first step).
    pub fn hidden(&self) -> &[f32] {
        &self.hidden
    }

    /// Tokens processed so far (the position the next token will take).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The routing of the last step: for each layer, the chosen `(expert, weight)` pairs in
    /// descending weight order (empty for dense layers and before the first step).
    pub fn routing(&self) -> &[Vec<(usize, f32)>] {
        &self.routing
    }

    /// Feeds one token at the current position and returns the next-token logits `[vocab]`.
    ///
    /// Errors with [`Error::TokenOutOfRange`] for an id outside the vocabulary and
    /// [`Error::ContextOverflow`] once the model's `max_positions` are used up; the session is
    /// unchanged on error.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        let model = self.model;
        let spec = model.spec();
        if token as usize >= spec.vocab {
            return Err(Error::TokenOutOfRange { id: token, vocab: spec.vocab });
        }
        if self.pos >= spec.max_positions {
            return Err(Error::ContextOverflow { requested: self.pos + 1, context: spec.max_positions });
        }
        let h = spec.hidden;
        let t = token as usize;
        let mut x = model.embed().data[t * h..(t + 1) * h].to_vec();
        for (i, lw) in model.layers().iter().enumerate() {
            attention_block(spec, lw, i, self.pos, &mut x, &mut self.cache);
            self.routing[i] = ffn_block(spec, lw, model.experts(i), &mut x);
        }
        let (normed, logits) = head(&x, &model.final_norm().data, model);
        self.hidden = normed;
        self.pos += 1;
        Ok(logits)
    }
}

/// `x` normalised by `norm`, and `model`'s lm_head on it: the logits.
pub(super) fn head(x: &[f32], norm: &[f32], model: &ReferenceModel) -> (Vec<f32>, Vec<f32>) {
    let (spec, h) = (model.spec(), model.spec().hidden);
    let mut normed = vec![0.0f32; h];
    rms_norm(x, norm, spec.rms_eps, &mut normed);
    let mut logits = vec![0.0f32; spec.vocab];
    matvec(&model.lm_head().data, spec.vocab, h, &normed, &mut logits);
    (normed, logits)
}
