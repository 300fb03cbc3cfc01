//! What the engine's options attach to a loaded model besides its weights: the EAMC
//! collection file, a routing trace and prerouter heads.

use std::path::Path;

use super::EngineOptions;
use crate::decoder::{GpuModel, RoutingMode};
use crate::error::{Error, Result};
use crate::experts::trace::TraceHeader;
use crate::model::ArchSpec;
use crate::prerouter::heads_file::HEADS_FILE;

/// What `options` attach to a loaded model: the EAMC collection file, a routing trace, and
/// prerouter heads (named, or shipped in `dir`) for prefetching or predicted routing.
pub(super) fn attach_to_model(
    model: &mut GpuModel,
    spec: &ArchSpec,
    dir: &Path,
    options: &EngineOptions,
) -> Result<()> {
    if let Some(mut r) = model.residency() {
        if let (Some(path), Some(cache)) = (&options.eamc_file, r.cache_mut()) {
            if path.exists() {
                cache
                    .tracker_mut()
                    .load(path)
                    .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))?;
            }
        }
        if let Some(path) = &options.trace {
            let m = spec.moe.as_ref().expect("residency implies MoE");
            let moe_layers = (0..spec.layers).filter(|&i| spec.is_moe_layer(i)).map(|i| i as u32).collect();
            let header =
                TraceHeader::new(spec.layers, m.num_experts, m.top_k, moe_layers, r.arena.layout.slot_bytes as u64);
            r.start_trace(path, &header)?;
        }
    }
    // Predictions are read back for a streaming prefetcher, or for a trace to record them.
    let publish =
        options.prefetch.uses_prerouter() && model.residency().is_some_and(|r| r.is_streaming() || r.is_tracing());
    // Heads shipped with the model (`prerouter.safetensors`) serve when none are named.
    let shipped = [&options.model_dir, dir].map(|d| d.join(HEADS_FILE)).into_iter().find(|p| p.exists());
    let heads_file = options.prerouter.clone().or(shipped);
    if publish || options.routing == RoutingMode::Predicted {
        let heads = heads_file.as_deref().ok_or_else(|| {
            let what = if publish { format!("prefetch `{}`", options.prefetch) } else { "predicted routing".into() };
            Error::InvalidArgument(format!("{what} needs a prerouter heads file (--prerouter FILE)"))
        })?;
        model.attach_prerouter_file(heads, options.routing, publish)?;
        if !publish && model.residency().is_some_and(|r| r.is_streaming()) {
            log::warn!(
                "predicted routing while streaming: add --prefetch prerouter to load the predicted experts ahead"
            );
        }
    } else if options.prerouter.is_some() {
        log::warn!("prerouter heads unused: they need --routing predicted or a streaming --prefetch prerouter");
    }
    Ok(())
}
