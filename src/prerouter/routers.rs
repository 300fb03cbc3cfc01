//! Reading the routers of a model directory: they initialise the heads' skips and give the
//! router-only baseline.

use std::path::Path;

use super::compat::ModelDims;
use super::error::PrerouterError;
use crate::model::{names, ArchSpec, Checkpoint};

/// Each MoE layer's router `[experts, hidden]` (row-major), in MoE-layer order, from the model
/// in `dir`, after checking the model has the dimensions `expected` (a dataset's).
pub fn read_routers(dir: &Path, expected: &ModelDims, dataset: &Path) -> Result<Vec<Vec<f32>>, PrerouterError> {
    let spec = ArchSpec::from_dir(dir)?;
    let dims = ModelDims::of(&spec)?;
    dims.check(expected, dataset)?;
    let ckpt = Checkpoint::open(dir)?;
    dims.moe_layers
        .iter()
        .map(|&l| Ok(ckpt.tensor(&names::router(spec.family, l), &[dims.experts, dims.hidden])?.data))
        .collect()
}
