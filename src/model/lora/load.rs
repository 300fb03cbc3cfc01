//! Reading `adapter_model.safetensors`: every tensor must be the `lora_A` or `lora_B` weight of
//! a projection the model has, both halves of each pair present, with the shapes the model and
//! the rank imply.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::config::AdapterConfig;
use super::target::{LoraTarget, MLP_PROJS};
use super::{LoraAdapter, LoraPair};
use crate::error::{Error, Result};
use crate::model::{ArchSpec, Checkpoint};

/// The file holding the adapter's weights.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// What PEFT puts before a causal LM's module paths.
const PEFT_PREFIX: &str = "base_model.model.";

impl LoraAdapter {
    /// Reads the PEFT adapter in `dir` (`adapter_config.json`, `adapter_model.safetensors`) for
    /// a model described by `spec`, checking every tensor name and shape.
    pub fn load(dir: &Path, spec: &ArchSpec) -> Result<LoraAdapter> {
        let config = AdapterConfig::load(dir)?;
        let path = dir.join(WEIGHTS_FILE);
        let ck = Checkpoint::open_file(&path)?;
        let lora_error = |message: String| Error::Lora { path: path.clone(), message };
        let known: HashMap<String, (usize, LoraTarget)> = (0..spec.layers)
            .flat_map(|i| LoraTarget::of_layer(spec, i).into_iter().map(move |t| (t.module(spec, i), (i, t))))
            .collect();
        let mut tensor_names: Vec<&str> = ck.names().collect();
        tensor_names.sort_unstable();
        // (layer, target) → the module path as stored (with PEFT's prefix).
        let mut stored = BTreeMap::new();
        for name in tensor_names {
            let module = name
                .strip_suffix(".lora_A.weight")
                .or_else(|| name.strip_suffix(".lora_B.weight"))
                .ok_or_else(|| Error::UnsupportedLoraTensor(name.into()))?;
            let bare = module.strip_prefix(PEFT_PREFIX).unwrap_or(module);
            let Some(&key) = known.get(bare) else {
                return Err(match misplaced(spec, name, bare) {
                    Some(message) => lora_error(message),
                    None => Error::UnsupportedLoraTensor(name.into()),
                });
            };
            if !config.targets(bare) {
                return Err(lora_error(format!("tensor `{name}` adapts a module target_modules does not name")));
            }
            stored.insert(key, module.to_string());
        }
        if stored.is_empty() {
            return Err(lora_error("holds no LoRA tensors".into()));
        }
        let r = config.rank;
        let mut pairs = BTreeMap::new();
        for ((layer, target), module) in stored {
            let (out, inp) = target.shape(spec);
            let pair = LoraPair {
                a: ck.tensor(&format!("{module}.lora_A.weight"), &[r, inp])?,
                b: ck.tensor(&format!("{module}.lora_B.weight"), &[out, r])?,
            };
            pairs.insert((layer, target), pair);
        }
        Ok(LoraAdapter { rank: r, scale: config.scale, pairs })
    }
}

/// Why the supported-looking module `bare` of tensor `name` is not in the model: a layer
/// beyond the last, or a projection its layer does not have. `None` for other modules.
fn misplaced(spec: &ArchSpec, name: &str, bare: &str) -> Option<String> {
    let rest = bare.strip_prefix("model.layers.")?;
    let (index, _) = rest.split_once('.')?;
    let layer: usize = index.parse().ok()?;
    if layer >= spec.layers {
        return Some(format!("tensor `{name}` is for layer {layer}; the model has {} layers", spec.layers));
    }
    if spec.mla().is_some() && rest.contains(".self_attn.") {
        return Some(format!(
            "tensor `{name}`: layer {layer} uses MLA attention, whose projections LoRA does not adapt"
        ));
    }
    let mut ffn = MLP_PROJS.into_iter().flat_map(|p| [LoraTarget::Mlp(p), LoraTarget::SharedExpert(p)]);
    let target = ffn.find(|t| t.module(spec, layer) == bare)?;
    let what = match target {
        LoraTarget::SharedExpert(_) => "no shared expert",
        _ => "no dense MLP (it is an MoE layer)",
    };
    Some(format!("tensor `{name}`: layer {layer} has {what}"))
}
