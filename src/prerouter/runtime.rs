//! Attaching trained heads to a model for generation: load the heads file, check it against
//! the model, and bind the heads on the GPU (see the decoder's prerouter: captures per MoE
//! layer, every head in one batch after each step).

use std::path::Path;

use super::compat::ModelDims;
use super::heads_file::Heads;
use crate::error::Result;
use crate::decoder::{GpuModel, RoutingMode};

/// Loads the heads in `path`, checks them against `model`'s dimensions and attaches them:
/// with `routing` [`RoutingMode::Predicted`] they route one-token steps; with `publish` their
/// predictions feed the expert prefetcher (`--prefetch prerouter`).
pub fn attach(model: &mut GpuModel, path: &Path, routing: RoutingMode, publish: bool) -> Result<()> {
    let heads = Heads::load(path)?;
    ModelDims::of(model.spec())?.check(&heads.config.dims(), path)?;
    model.attach_prerouter(&heads, routing, publish)
}
