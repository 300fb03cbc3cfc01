//! The reference forward pass of a checkpoint's MTP module ([`crate::model::mtp`]): one
//! position at a time over its own KV cache, from the main model's hidden state and the next
//! token.

use std::path::Path;

use super::kv_cache::KvCache;
use super::layer::{attention_block, ffn_block};
use super::model::ReferenceModel;
use super::ops::{matvec, rms_norm};
use super::session::{head, new_cache};
use crate::error::{Error, Result};
use crate::model::layer_weights::{self, MlpWeights};
use crate::model::mtp::{self, MtpWeights};
use crate::model::{ArchSpec, Checkpoint};

/// A checkpoint's MTP module in host memory as f32, beside its [`ReferenceModel`].
pub struct ReferenceMtp {
    /// The model's spec with the MTP layer appended ([`mtp::read`]).
    spec: ArchSpec,
    weights: MtpWeights,
    /// The MTP layer's routed experts.
    experts: Vec<MlpWeights>,
}

impl ReferenceMtp {
    /// Reads the MTP module of the checkpoint in `dir` (that of `model`).
    pub fn load(dir: &Path, model: &ReferenceModel) -> Result<ReferenceMtp> {
        let ck = Checkpoint::open(dir)?;
        let (spec, weights) = mtp::read(&ck, model.spec())?;
        let layer = model.spec().layers;
        let n = spec.moe.as_ref().map_or(0, |m| m.num_experts);
        let experts = (0..n).map(|e| layer_weights::expert(&ck, &spec, layer, e)).collect::<Result<_>>()?;
        Ok(ReferenceMtp { spec, weights, experts })
    }

    /// A fresh MTP session at position 0, running beside a session of `model`.
    pub fn session<'m>(&'m self, model: &'m ReferenceModel) -> ReferenceMtpSession<'m> {
        ReferenceMtpSession { mtp: self, model, cache: new_cache(&self.spec, model.kv_dtype), pos: 0 }
    }
}

/// The MTP module's decoding state: its KV cache and position.
pub struct ReferenceMtpSession<'m> {
    mtp: &'m ReferenceMtp,
    model: &'m ReferenceModel,
    cache: KvCache,
    pos: usize,
}

impl ReferenceMtpSession<'_> {
    /// Runs position `i` (the session's next): `hidden` is the main model's normalised hidden
    /// state after its token `t[i]` ([`super::ReferenceSession::hidden`]), `next` the token
    /// `t[i+1]`.
    /// Returns the logits predicting `t[i+2]`.
    pub fn step(&mut self, hidden: &[f32], next: u32) -> Result<Vec<f32>> {
        let (spec, w) = (&self.mtp.spec, &self.mtp.weights);
        let h = spec.hidden;
        if hidden.len() != h || next as usize >= spec.vocab {
            return Err(Error::InvalidArgument(format!(
                "an MTP step needs a hidden state of {h} values and a token below {}",
                spec.vocab
            )));
        }
        let t = next as usize;
        let mut e = vec![0.0f32; h];
        rms_norm(&self.model.embed().data[t * h..(t + 1) * h], &w.embed_norm.data, spec.rms_eps, &mut e);
        let mut g = vec![0.0f32; h];
        rms_norm(hidden, &w.hidden_norm.data, spec.rms_eps, &mut g);
        let (mut x, mut from_hidden) = (vec![0.0f32; h], vec![0.0f32; h]);
        matvec(&w.embed_proj.data, h, h, &e, &mut x);
        matvec(&w.hidden_proj.data, h, h, &g, &mut from_hidden);
        for (xi, gi) in x.iter_mut().zip(&from_hidden) {
            *xi += gi;
        }
        let layer = spec.layers - 1;
        attention_block(spec, &w.layer, layer, self.pos, &mut x, &mut self.cache);
        ffn_block(spec, &w.layer, &self.mtp.experts, &mut x);
        self.pos += 1;
        Ok(head(&x, &w.head_norm.data, self.model).1)
    }
}
