//! Reading what of a model the heads read besides a dataset: the routers (they initialise the
//! heads' skips and give the router-only baseline) and, for the `token` feature, the input
//! embeddings.

use std::path::Path;

use super::compat::ModelDims;
use super::error::PrerouterError;
use crate::model::{names, ArchSpec, Checkpoint};

/// Each MoE layer's router `[experts, hidden]` (row-major), in MoE-layer order, from the model
/// in `dir`, after checking the model has the dimensions `expected` (a dataset's, read from
/// `dataset`).
pub fn read_routers(dir: &Path, expected: &ModelDims, dataset: &Path) -> Result<Vec<Vec<f32>>, PrerouterError> {
    Ok(ModelTables::read(dir, expected, dataset, false)?.routers)
}

/// The model's tables a head reads besides the dataset.
pub struct ModelTables {
    /// Each MoE layer's router `[experts, hidden]`, in MoE-layer order.
    pub routers: Vec<Vec<f32>>,
    /// The input embeddings `[vocab, hidden]`, for heads reading the next token.
    pub embeddings: Option<Vec<f32>>,
}

impl ModelTables {
    /// Routers only (heads without the `token` feature).
    pub fn routers(routers: Vec<Vec<f32>>) -> ModelTables {
        ModelTables { routers, embeddings: None }
    }

    /// The routers and, with `embeddings` (heads reading the next token), the input embeddings
    /// of the model in `dir`, after checking it has the dimensions `expected` (a dataset's, read
    /// from `dataset`).
    pub fn read(
        dir: &Path,
        expected: &ModelDims,
        dataset: &Path,
        embeddings: bool,
    ) -> Result<ModelTables, PrerouterError> {
        let spec = ArchSpec::from_dir(dir)?;
        let dims = ModelDims::of(&spec)?;
        dims.check(expected, dataset)?;
        let ckpt = Checkpoint::open(dir)?;
        let routers = dims
            .moe_layers
            .iter()
            .map(|&l| Ok(ckpt.tensor(&names::router(spec.family, l), &[dims.experts, dims.hidden])?.data))
            .collect::<Result<_, PrerouterError>>()?;
        let embeddings = match embeddings {
            false => None,
            true => Some(ckpt.tensor(names::EMBED, &[spec.vocab, spec.hidden])?.data),
        };
        Ok(ModelTables { routers, embeddings })
    }
}
