//! Streams every routed expert of a checkpoint into an `experts.bin` store, one at a time.

use std::path::Path;

use super::{stored_len, Phase, Reporter};
use crate::error::{Error, Result};
use crate::model::{layer_weights, names, ArchSpec, Checkpoint};
use crate::ops::WeightFormat;
use crate::store::{StoreEncoding, StoreInfo, StoreWriter};

/// Writes the store at `path` (nothing for a model without MoE layers) and returns how many
/// experts it holds. Memory stays bounded by one expert: each is read, encoded, written, and
/// its source pages released before the next.
pub(super) fn write_store(
    ckpt: &Checkpoint,
    spec: &ArchSpec,
    format: WeightFormat,
    path: &Path,
    reporter: &mut Reporter,
) -> Result<usize> {
    let layers: Vec<usize> = (0..spec.layers).filter(|&i| spec.is_moe_layer(i)).collect();
    let Some(moe) = spec.moe.as_ref().filter(|_| !layers.is_empty()) else {
        return Ok(0);
    };
    let encoding = format.encoding().ok_or_else(|| Error::InvalidArgument("experts cannot be stored as f32".into()))?;
    let mut writer = StoreWriter::create(
        path,
        StoreInfo {
            arch_hash: spec.hash(),
            layers: layers.iter().map(|&l| l as u32).collect(),
            experts_per_layer: moe.num_experts,
            hidden: spec.hidden,
            intermediate: moe.expert_intermediate,
            encoding: StoreEncoding::Uniform(encoding),
        },
    )?;
    for &layer in &layers {
        let per_expert = names::expert(spec.family, layer, 0);
        let fused = !ckpt.contains(&per_expert[0]);
        for e in 0..moe.num_experts {
            let w = layer_weights::expert(ckpt, spec, layer, e)?;
            writer.write_expert(layer, e, &w.gate.data, &w.up.data, &w.down.data)?;
            drop(w);
            let sources: Vec<String> = if fused {
                names::fused_experts(spec.family, layer).into()
            } else {
                names::expert(spec.family, layer, e).into()
            };
            let mut bytes = 0;
            for name in &sources {
                ckpt.release(name);
                bytes += stored_len(ckpt, name);
            }
            // A fused tensor holds every expert of the layer: count one share per expert.
            let bytes = if fused { bytes / moe.num_experts as u64 } else { bytes };
            reporter.advance(Phase::Experts, bytes);
        }
    }
    writer.finish()?;
    Ok(layers.len() * moe.num_experts)
}
