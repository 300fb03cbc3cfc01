//! Checking that a model has the dimensions a dataset or heads file was made for.

use std::path::Path;

use super::error::PrerouterError;
use crate::model::ArchSpec;

/// The model dimensions prerouter files depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDims {
    /// Hidden size.
    pub hidden: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Model layer indices of the MoE layers.
    pub moe_layers: Vec<usize>,
}

impl ModelDims {
    /// The dimensions of `spec` (an error for a model without MoE layers).
    pub fn of(spec: &ArchSpec) -> Result<ModelDims, PrerouterError> {
        let m =
            spec.moe.as_ref().ok_or_else(|| PrerouterError::InvalidArgument("the model has no MoE layers".into()))?;
        Ok(ModelDims {
            hidden: spec.hidden,
            experts: m.num_experts,
            top_k: m.top_k,
            moe_layers: (0..spec.layers).filter(|&i| spec.is_moe_layer(i)).collect(),
        })
    }

    /// `Ok` when `self` (the model's) equals `file`'s dimensions recorded in `path`, else the
    /// first difference as [`PrerouterError::Mismatch`].
    pub fn check(&self, file: &ModelDims, path: &Path) -> Result<(), PrerouterError> {
        let pairs = [
            ("hidden_size", self.hidden, file.hidden),
            ("experts", self.experts, file.experts),
            ("top_k", self.top_k, file.top_k),
            ("MoE layer count", self.moe_layers.len(), file.moe_layers.len()),
        ];
        for (what, expected, found) in pairs {
            if expected != found {
                return Err(PrerouterError::Mismatch { path: path.to_path_buf(), what, expected, found });
            }
        }
        if let Some((&expected, &found)) = self.moe_layers.iter().zip(&file.moe_layers).find(|(a, b)| a != b) {
            return Err(PrerouterError::Mismatch {
                path: path.to_path_buf(),
                what: "MoE layer index",
                expected,
                found,
            });
        }
        Ok(())
    }
}
