//! PEFT LoRA adapters: `W' = W + s·B·A` for some projections, with `A` `[r, in]`, `B` `[out, r]`
//! and `s = lora_alpha / r` (`/ sqrt(r)` with rsLoRA).
//!
//! The GPU decoder applies them unmerged (`decoder` records `y += (s·B)(A x)` after each
//! adapted projection, in f32, whatever the base weights' format); [`LoraAdapter::merge_into`]
//! is the one place the product is folded into host weights, for the CPU reference.

mod config;
mod load;
mod target;

pub use config::CONFIG_FILE;
pub use load::WEIGHTS_FILE;
pub use target::{LoraTarget, MlpProj};

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::model::layer_weights::LayerWeights;
use crate::model::HostTensor;

/// The two factors adapting one projection.
#[derive(Clone, Debug)]
pub struct LoraPair {
    /// `lora_A`, `[r, in]`.
    pub a: HostTensor,
    /// `lora_B`, `[out, r]` (unscaled).
    pub b: HostTensor,
}

/// A loaded adapter: one scale and rank, and the pairs by `(layer, target)`.
#[derive(Clone, Debug)]
pub struct LoraAdapter {
    rank: usize,
    scale: f32,
    pairs: BTreeMap<(usize, LoraTarget), LoraPair>,
}

impl LoraAdapter {
    /// The rank `r` of every pair.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The factor `s` the product `B·A` is multiplied by.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The pair adapting `target` of layer `layer`, if the adapter has one.
    pub fn pair(&self, layer: usize, target: LoraTarget) -> Option<&LoraPair> {
        self.pairs.get(&(layer, target))
    }

    /// Adds `s·B·A` to every adapted weight of `layers` (indexed by layer), dropping their
    /// stored int4 form, which no longer matches. Errors when a weight is absent or has
    /// another shape than the pair.
    pub fn merge_into(&self, layers: &mut [LayerWeights]) -> Result<()> {
        for (&(layer, target), pair) in &self.pairs {
            let w = layers.get_mut(layer).and_then(|l| target.weight_mut(l)).ok_or_else(|| {
                Error::InvalidArgument(format!("LoRA merge: layer {layer} has no {target:?} projection"))
            })?;
            let (out, inp, r) = (pair.b.shape[0], pair.a.shape[1], self.rank);
            if w.shape != [out, inp] {
                return Err(Error::InvalidArgument(format!(
                    "LoRA merge: layer {layer} {target:?} is {:?}, the pair makes [{out}, {inp}]",
                    w.shape
                )));
            }
            for (o, row) in w.data.chunks_exact_mut(inp).enumerate() {
                let b_row = &pair.b.data[o * r..(o + 1) * r];
                for (k, wk) in row.iter_mut().enumerate() {
                    let ba: f32 = b_row.iter().enumerate().map(|(j, bj)| bj * pair.a.data[j * inp + k]).sum();
                    *wk += self.scale * ba;
                }
            }
            w.int4 = None;
        }
        Ok(())
    }
}
