//! `moestream convert FILE.gguf OUT`: a GGUF model's routed experts into the expert store as
//! the GGUF file stores them (ggml blocks copied, never re-quantized), one extent per expert,
//! each layer in its own ggml types ([`crate::store::StoreEncoding::Ggml`]). The other tensors,
//! the tokenizer and the chat template stay in the GGUF file, which `model.json` names
//! ([`ModelManifest::gguf`]) and fingerprints: the directory is the GGUF file's expert store,
//! used with it (a changed or missing GGUF file is reported at load).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::{
    extra_files, source_fingerprint, ConvertOptions, ConvertSummary, ModelManifest, Phase, Progress, Reporter,
    SourceInfo, EXPERTS_FILE, MANIFEST_FILE,
};
use crate::error::{Error, Result};
use crate::experts::source::{CheckpointExperts, ExpertSource};
use crate::experts::SlotLayout;
use crate::model::gguf::{arch, GgufModel};
use crate::model::{ArchSpec, Checkpoint};
use crate::ops::WeightFormat;
use crate::store::{StoreEncoding, StoreInfo, StoreWriter};

/// Converts the GGUF model `src` (any part of a split set) into `out`; see the module docs.
pub(super) fn convert_gguf(src: &Path, out: &Path, progress: &mut dyn FnMut(Progress)) -> Result<ConvertSummary> {
    let start = Instant::now();
    let model = GgufModel::open(src)?;
    let spec = arch::spec_from_gguf(&model)?;
    let src_canonical = src.canonicalize().map_err(|e| Error::io(src, e))?;
    let fingerprint = source_fingerprint(&src_canonical)?;
    // The MTP layer's too (below).
    let types = arch::expert_types(&model, spec.layers + spec.mtp_layers.min(1));
    let ckpt = Arc::new(Checkpoint::from_gguf(model, &spec)?);
    spec.check_against(&ckpt)?;
    extra_files::prepare_output(&src_canonical, out)?;
    // An MTP layer this crate runs (`blk.N.nextn.*`) has its experts stored with the model's;
    // its other tensors are read from the GGUF file like the model's.
    let stored = crate::model::mtp::available(&ckpt, &spec).unwrap_or_else(|_| spec.clone());
    let mtp_layer = stored.layers > spec.layers;

    let mut reporter = Reporter { done: 0, total: ckpt.stored_bytes(), callback: progress };
    let (experts, gate_up_format) =
        write_store(&ckpt, (&stored, spec.hash()), &types, &out.join(EXPERTS_FILE), &mut reporter)?;
    reporter.advance(Phase::Finishing, u64::MAX);
    let written: Vec<String> = if experts > 0 { vec![EXPERTS_FILE.to_string()] } else { Vec::new() };
    // The manifest's expert encoding is the arena's (the largest layer's gate/up) format; each
    // layer's own types are in the store. Dense matrices are read as the GGUF stores them.
    let formats = ConvertOptions { experts: gate_up_format, dense: WeightFormat::F32, threads: 0 };
    let mut manifest = ModelManifest::build(
        out,
        spec,
        &formats,
        (experts > 0).then(|| EXPERTS_FILE.to_string()),
        &written,
        SourceInfo { path: src_canonical.clone(), fingerprint },
    )?;
    manifest.gguf = Some(src_canonical);
    manifest.mtp_layer = Some(mtp_layer);
    manifest.save(out)?;

    let experts_bytes = manifest.files.get(EXPERTS_FILE).map_or(0, |f| f.bytes);
    let output_bytes = experts_bytes + std::fs::metadata(out.join(MANIFEST_FILE)).map_or(0, |m| m.len());
    let seconds = start.elapsed().as_secs_f64();
    Ok(ConvertSummary {
        out_dir: out.to_path_buf(),
        source_bytes: reporter.total,
        resident_bytes: 0,
        experts_bytes,
        output_bytes,
        resident_tensors: 0,
        experts,
        experts_encoding: manifest_encoding(&types),
        dense_encoding: "gguf (read from the source file)".into(),
        seconds,
        peak_rss_bytes: crate::util::peak_rss::peak_rss_bytes(),
        throughput_bytes_per_s: reporter.total as f64 / seconds.max(1e-9),
    })
}

/// The store's encoding name for the MoE layers' `types`.
fn manifest_encoding(types: &[Option<[crate::quant::GgmlType; 2]>]) -> String {
    StoreEncoding::Ggml(types.iter().flatten().copied().collect()).name()
}

/// Writes every routed expert of `ckpt` into a GGUF store at `path` (nothing for a dense
/// model; `spec` may have an MTP layer appended, `arch_hash` is the model's); returns how many
/// experts it holds and the arena's gate/up format. Each extent is
/// the slot [`CheckpointExperts`] makes of the expert (the GGUF bytes placed as in a GPU slot).
pub(super) fn write_store(
    ckpt: &Arc<Checkpoint>,
    (spec, arch_hash): (&ArchSpec, u64),
    types: &[Option<[crate::quant::GgmlType; 2]>],
    path: &Path,
    reporter: &mut Reporter,
) -> Result<(usize, WeightFormat)> {
    let layers: Vec<usize> = (0..spec.layers).filter(|&i| spec.is_moe_layer(i)).collect();
    let Some(moe) = spec.moe.as_ref().filter(|_| !layers.is_empty()) else {
        return Ok((0, WeightFormat::F32));
    };
    let (h, inter) = (spec.hidden, moe.expert_intermediate);
    let mut pairs = Vec::new();
    let mut layouts = vec![None; spec.layers];
    for &i in &layers {
        let t = types[i].ok_or_else(|| Error::MissingTensor(format!("blk.{i}.ffn_{{gate,up,down}}_exps.weight")))?;
        layouts[i] = Some(SlotLayout::mixed(WeightFormat::of_ggml(t[0]), WeightFormat::of_ggml(t[1]), h, inter)?);
        pairs.push(t);
    }
    let source = CheckpointExperts::per_layer(ckpt.clone(), spec.clone(), layouts)?;
    let info = StoreInfo {
        arch_hash,
        layers: layers.iter().map(|&l| l as u32).collect(),
        experts_per_layer: moe.num_experts,
        hidden: h,
        intermediate: inter,
        encoding: StoreEncoding::Ggml(pairs),
    };
    let mut writer = StoreWriter::create(path, info)?;
    let mut buf = vec![0u8; source.read_len()];
    for &layer in &layers {
        let len = source.layer_layout(layer).slot_bytes;
        for e in 0..moe.num_experts {
            source.read(layer, e, &mut buf)?;
            writer.write_ggml_expert(layer, e, &buf[..len])?;
            reporter.advance(Phase::Experts, len as u64);
        }
    }
    writer.finish()?;
    Ok((layers.len() * moe.num_experts, source.layout().format))
}
