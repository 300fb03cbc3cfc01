//! Streams every routed expert of a checkpoint into an `experts.bin` store, a batch of experts
//! at a time: one thread reads and encodes each expert of the batch, then they are written in
//! order, so the store is byte-identical whatever the thread count.

use std::path::Path;

use super::{stored_len, Phase, Reporter};
use crate::error::{Error, Result};
use crate::model::{layer_weights, names, ArchSpec, Checkpoint};
use crate::ops::WeightFormat;
use crate::store::{EncodedExpert, StoreEncoding, StoreInfo, StoreWriter};

/// Writes the store of `spec`'s MoE layers (an MTP module's among them where `spec` has it
/// appended) at `path`, tied to the model's `arch_hash` (nothing for a model without MoE
/// layers), and returns how many experts it holds, encoding up to `threads` experts at once.
/// Memory stays bounded by `threads` experts: a batch is read, encoded, written, and its source
/// pages released before the next.
pub(super) fn write_store(
    ckpt: &Checkpoint,
    (spec, arch_hash): (&ArchSpec, u64),
    format: WeightFormat,
    threads: usize,
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
            arch_hash,
            layers: layers.iter().map(|&l| l as u32).collect(),
            experts_per_layer: moe.num_experts,
            hidden: spec.hidden,
            intermediate: moe.expert_intermediate,
            encoding: StoreEncoding::Uniform(encoding),
        },
    )?;
    for &layer in &layers {
        let per_expert = names::expert(spec.family, layer, 0);
        // A fused tensor holds every expert of the layer.
        let fused = (!ckpt.contains(&per_expert[0])).then_some(moe.num_experts);
        let experts: Vec<usize> = (0..moe.num_experts).collect();
        for batch in experts.chunks(threads.max(1)) {
            for (&e, encoded) in batch.iter().zip(encode_batch(ckpt, spec, &writer, layer, batch)?) {
                writer.write_encoded(encoded)?;
                release_sources(ckpt, spec, layer, e, fused, reporter);
            }
        }
    }
    writer.finish()?;
    Ok(layers.len() * moe.num_experts)
}

/// Reads and encodes the experts `batch` of `layer`, one thread each (the calling thread for
/// a batch of one), in the batch's order.
fn encode_batch(
    ckpt: &Checkpoint,
    spec: &ArchSpec,
    writer: &StoreWriter,
    layer: usize,
    batch: &[usize],
) -> Result<Vec<EncodedExpert>> {
    let encode = |e: usize| -> Result<EncodedExpert> {
        let w = layer_weights::expert(ckpt, spec, layer, e)?;
        Ok(writer.encode_expert(layer, e, &w.gate.data, &w.up.data, &w.down.data)?)
    };
    if let [e] = batch {
        return Ok(vec![encode(*e)?]);
    }
    let encode = &encode;
    std::thread::scope(|s| {
        let handles: Vec<_> = batch.iter().map(|&e| s.spawn(move || encode(e))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// Releases the source pages of expert `e` of `layer` and reports its source bytes done (one
/// share of each tensor when the layer's `experts` are `fused` into one).
fn release_sources(
    ckpt: &Checkpoint,
    spec: &ArchSpec,
    layer: usize,
    e: usize,
    fused: Option<usize>,
    reporter: &mut Reporter,
) {
    let sources: Vec<String> = match fused {
        Some(_) => names::fused_experts(spec.family, layer).into(),
        None => names::expert(spec.family, layer, e).into(),
    };
    let mut bytes = 0;
    for name in &sources {
        ckpt.release(name);
        bytes += stored_len(ckpt, name);
    }
    reporter.advance(Phase::Experts, bytes / fused.unwrap_or(1) as u64);
}
