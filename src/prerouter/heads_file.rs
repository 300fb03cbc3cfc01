//! Trained heads on disk: one safetensors file.
//!
//! Tensors (f32, row-major `[out, in]`), per head owned by MoE layer `N`:
//! `prerouter.layer{N}.fc1.weight` `[inner, dense + blocks·experts]` (dense: hidden, or 2·hidden
//! with the `deep` feature), `.fc1.bias` `[inner]`,
//! `.fc2.weight` `[experts, inner]`, `.fc2.bias` `[experts]`, `.skip.weight` `[experts, hidden]`.
//! `__metadata__` holds `prerouter`: the JSON [`HeadsConfig`] (dimensions, features, which
//! layers have heads), and optionally `metrics`: the JSON training report.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};

use super::compat::ModelDims;
use super::error::PrerouterError;
use super::features::Features;
use super::head::{Head, HeadDims, HeadParams};
use super::train::TrainedHead;

/// Name of the heads file inside a model directory, found without `--prerouter` (and copied
/// by `convert`).
pub use crate::util::model_files::HEADS_FILE;
/// Metadata key of the [`HeadsConfig`] JSON.
pub const CONFIG_KEY: &str = "prerouter";
/// Metadata key of the training report JSON.
pub const METRICS_KEY: &str = "metrics";
/// Version written into the config.
pub const HEADS_VERSION: u32 = 1;

const PARTS: [&str; 5] = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "skip.weight"];

/// What a heads file was made for and how its heads read their input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadsConfig {
    /// [`HEADS_VERSION`].
    pub version: u32,
    /// Model hidden size.
    pub hidden: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Model layer indices of the model's MoE layers.
    pub moe_layers: Vec<usize>,
    /// fc1's output width.
    pub inner: usize,
    /// Multi-hot inputs.
    pub features: Features,
    /// Owning (model) layer of each head, ascending.
    pub heads: Vec<usize>,
}

impl HeadsConfig {
    /// The model dimensions recorded.
    pub fn dims(&self) -> ModelDims {
        ModelDims { hidden: self.hidden, experts: self.experts, top_k: self.top_k, moe_layers: self.moe_layers.clone() }
    }

    fn head_dims(&self) -> HeadDims {
        HeadDims {
            hidden: self.hidden,
            dense: self.features.dense_dim(self.hidden),
            sparse: self.features.sparse_dim(self.experts),
            inner: self.inner,
            experts: self.experts,
        }
    }
}

/// A set of heads with their configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Heads {
    /// Dimensions and features.
    pub config: HeadsConfig,
    /// The heads, in layer order.
    pub heads: Vec<TrainedHead>,
    /// The training report JSON, when the file has one.
    pub metrics: Option<String>,
}

fn le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn shapes(d: HeadDims) -> [Vec<usize>; 5] {
    [vec![d.inner, d.input()], vec![d.inner], vec![d.experts, d.inner], vec![d.experts], vec![d.experts, d.hidden]]
}

impl Heads {
    /// Heads for a model of `dims`, reading `features`, of width `inner`.
    pub fn new(dims: &ModelDims, features: Features, inner: usize, heads: Vec<TrainedHead>) -> Heads {
        let config = HeadsConfig {
            version: HEADS_VERSION,
            hidden: dims.hidden,
            experts: dims.experts,
            top_k: dims.top_k,
            moe_layers: dims.moe_layers.clone(),
            inner,
            features,
            heads: heads.iter().map(|h| h.layer).collect(),
        };
        Heads { config, heads, metrics: None }
    }

    /// The head owned by model layer `layer`, if any.
    pub fn head_of(&self, layer: usize) -> Option<&TrainedHead> {
        self.heads.iter().find(|h| h.layer == layer)
    }

    /// Writes the heads (and `metrics`, if set) to `path`.
    pub fn save(&self, path: &Path) -> Result<(), PrerouterError> {
        let mut bytes: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for h in &self.heads {
            let tensors = h.head.params.tensors();
            for ((part, shape), data) in PARTS.iter().zip(shapes(h.head.dims)).zip(tensors) {
                bytes.push((format!("prerouter.layer{}.{part}", h.layer), shape, le_bytes(data)));
            }
        }
        let views = bytes
            .iter()
            .map(|(name, shape, data)| {
                TensorView::new(Dtype::F32, shape.clone(), data)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| PrerouterError::InvalidArgument(format!("{name}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut meta = HashMap::new();
        meta.insert(CONFIG_KEY.to_string(), serde_json::to_string(&self.config).expect("serialisable"));
        if let Some(m) = &self.metrics {
            meta.insert(METRICS_KEY.to_string(), m.clone());
        }
        safetensors::serialize_to_file(views, Some(meta), path).map_err(|e| match e {
            safetensors::SafeTensorError::IoError(e) => PrerouterError::io(path, e),
            other => PrerouterError::InvalidArgument(format!("{}: {other}", path.display())),
        })
    }

    /// Reads and checks a heads file: header, config, every tensor's presence, dtype, shape and
    /// finiteness.
    pub fn load(path: &Path) -> Result<Heads, PrerouterError> {
        let bytes = std::fs::read(path).map_err(|e| PrerouterError::io(path, e))?;
        let corrupt = |d: String| PrerouterError::corrupt(path, d);
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| corrupt(e.to_string()))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let config: HeadsConfig = serde_json::from_str(
            meta.get(CONFIG_KEY).ok_or_else(|| corrupt(format!("no `{CONFIG_KEY}` entry in __metadata__")))?,
        )
        .map_err(|e| corrupt(format!("`{CONFIG_KEY}` metadata: {e}")))?;
        if config.version != HEADS_VERSION {
            return Err(corrupt(format!("heads format version {} (this build reads {HEADS_VERSION})", config.version)));
        }
        if config.hidden == 0 || config.inner == 0 || config.top_k == 0 || config.top_k > config.experts {
            return Err(corrupt("zero or inconsistent dimensions in the config".into()));
        }
        let tensors = SafeTensors::deserialize(&bytes).map_err(|e| corrupt(e.to_string()))?;
        let dims = config.head_dims();
        let mut heads = Vec::with_capacity(config.heads.len());
        for &layer in &config.heads {
            let pos = config.moe_layers.iter().position(|&l| l == layer);
            let target_layer = pos
                .and_then(|p| config.moe_layers.get(p + 1))
                .copied()
                .ok_or_else(|| corrupt(format!("head of layer {layer} has no next MoE layer")))?;
            // Every tensor is checked before the head is allocated: the config's sizes are
            // only trusted once the file holds tensors that large.
            let mut parts = Vec::with_capacity(PARTS.len());
            for (part, shape) in PARTS.iter().zip(shapes(dims)) {
                let name = format!("prerouter.layer{layer}.{part}");
                let t = tensors.tensor(&name).map_err(|_| corrupt(format!("missing tensor {name}")))?;
                if t.dtype() != Dtype::F32 || t.shape() != shape.as_slice() {
                    return Err(corrupt(format!("{name} is {:?} {:?}, expected F32 {shape:?}", t.dtype(), t.shape())));
                }
                parts.push((name, t));
            }
            let mut params = HeadParams::zeros(dims);
            for ((name, t), dst) in parts.into_iter().zip(params.tensors_mut()) {
                for (d, c) in dst.iter_mut().zip(t.data().chunks_exact(4)) {
                    *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
                if dst.iter().any(|v| !v.is_finite()) {
                    return Err(corrupt(format!("{name} holds non-finite values")));
                }
            }
            heads.push(TrainedHead { layer, target_layer, head: Head { dims, params } });
        }
        Ok(Heads { config, heads, metrics: meta.get(METRICS_KEY).cloned() })
    }
}
