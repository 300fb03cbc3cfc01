//! `moestream convert`: turns a Hugging Face checkpoint directory into a moestream model
//! directory, streaming so that memory stays bounded by one expert or one resident tensor.
//!
//! # Output directory
//!
//! | file | content |
//! | --- | --- |
//! | `experts.bin` | every routed expert of every MoE layer ([`crate::store`]), int4 or f16; absent for dense models |
//! | `resident.safetensors` | every other tensor under its Hugging Face name (see below) |
//! | `config.json`, `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`, `special_tokens_map.json`, `prerouter.safetensors` | copied when present |
//! | `model.json` | the [`ModelManifest`], written last and atomically |
//!
//! In `resident.safetensors`, 1-D tensors (norms, biases) and MLA's `kv_b_proj` (read by the
//! MLA kernel in f32) are F32; the embedding and the
//! routers are F16 (never int4, as in [`crate::decoder::DecoderOptions::format_of`]);
//! every other matrix (attention, dense MLP, shared expert and its gate, lm_head) follows
//! [`ConvertOptions::dense`]: F16, or an int4 blob stored as a U8 tensor of shape `[blob_len]`
//! with the parameters in the `__metadata__` key [`crate::model::weights::INT4_METADATA_KEY`],
//! which [`crate::model::Checkpoint`] reads back.
//!
//! A GGUF file converts into `experts.bin` (its experts' ggml blocks, unchanged) and
//! `model.json` naming the file, which keeps the other tensors and the tokenizer (see
//! `gguf.rs`).
//!
//! A directory without `model.json` is not a converted model: an interrupted conversion never
//! looks finished. [`cached_conversion`] converts a Hugging Face directory once into a cache
//! and reuses it while the source is unchanged.

mod cache;
mod experts;
mod extra_files;
mod fingerprint;
mod gguf;
mod manifest;
mod resident;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

pub use cache::{cached_conversion, default_cache_root, model_key};
pub use fingerprint::source_fingerprint;
pub use manifest::{
    ExpertsEntry, FileEntry, ModelManifest, SourceInfo, MANIFEST_FILE, MANIFEST_FORMAT, MANIFEST_VERSION,
};

use crate::error::{Error, Result};
use crate::model::{gpt_oss_weights, ArchSpec, Checkpoint};
use crate::ops::WeightFormat;
use crate::quant::GgmlType;
use crate::quant::QuantParams;

pub use crate::util::model_files::{EXPERTS_FILE, RESIDENT_FILE};

/// How a checkpoint is converted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvertOptions {
    /// Encoding of the routed experts in `experts.bin`: int4 or f16.
    pub experts: WeightFormat,
    /// Encoding of the resident matrices other than embeddings and routers: int4 or f16.
    pub dense: WeightFormat,
    /// Threads encoding routed experts (0: one per core). The output is byte-identical
    /// whatever the count.
    pub threads: usize,
}

impl Default for ConvertOptions {
    /// Everything int4 with the default parameters (affine, groups of 32).
    fn default() -> Self {
        let int4 = WeightFormat::Int4(QuantParams::default());
        ConvertOptions { experts: int4, dense: int4, threads: 0 }
    }
}

impl ConvertOptions {
    /// Options from bit widths (4 = int4 with `params`, 16 = f16) for experts and for the
    /// dense (attention, MLP, lm_head) matrices; other widths are an invalid argument.
    pub fn from_bits(expert_bits: u32, dense_bits: u32, params: QuantParams) -> Result<ConvertOptions> {
        params.validate().map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let format = |bits: u32| match bits {
            4 => Ok(WeightFormat::Int4(params)),
            16 => Ok(WeightFormat::F16),
            other => Err(Error::InvalidArgument(format!("{other} bits is not supported (use 4 or 16)"))),
        };
        Ok(ConvertOptions { experts: format(expert_bits)?, dense: format(dense_bits)?, threads: 0 })
    }

    /// The expert-encoding thread count: `threads`, or one per core when 0.
    fn worker_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    fn validate(&self) -> Result<()> {
        for (what, f) in [("experts", self.experts), ("dense", self.dense)] {
            match f {
                WeightFormat::F32 | WeightFormat::Ggml(_) | WeightFormat::Padded(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "{what} cannot be stored as {} (use int4 or f16)",
                        f.name()
                    )))
                }
                WeightFormat::Int4(p) => p.validate().map_err(|e| Error::InvalidArgument(e.to_string()))?,
                WeightFormat::F16 => {}
            }
        }
        Ok(())
    }
}

/// The part of the conversion a [`Progress`] report is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Phase {
    /// Quantizing routed experts into `experts.bin`.
    Experts,
    /// Encoding the other tensors into `resident.safetensors`.
    Resident,
    /// Copying small files, checksumming the outputs, writing `model.json`.
    Finishing,
}

/// A progress report: source bytes processed so far out of the checkpoint's total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// What is being done.
    pub phase: Phase,
    /// Source tensor bytes processed.
    pub done_bytes: u64,
    /// Source tensor bytes in all (the checkpoint's stored size).
    pub total_bytes: u64,
}

/// What a conversion did, reported by `moestream convert`.
#[derive(Clone, Debug, Serialize)]
pub struct ConvertSummary {
    /// The output directory.
    pub out_dir: PathBuf,
    /// Bytes of all tensors in the source checkpoint.
    pub source_bytes: u64,
    /// Size of `resident.safetensors`.
    pub resident_bytes: u64,
    /// Size of `experts.bin` (0 for dense models).
    pub experts_bytes: u64,
    /// Size of every file of the output directory together.
    pub output_bytes: u64,
    /// Tensors written to `resident.safetensors`.
    pub resident_tensors: usize,
    /// Experts written to `experts.bin`.
    pub experts: usize,
    /// Encoding of the experts.
    pub experts_encoding: String,
    /// Encoding of the dense matrices.
    pub dense_encoding: String,
    /// Wall-clock time of the conversion in seconds.
    pub seconds: f64,
    /// Peak resident set size of the whole process so far, in bytes (0 where unknown).
    pub peak_rss_bytes: u64,
    /// Source bytes converted per second.
    pub throughput_bytes_per_s: f64,
}

/// Whether `dir` holds a converted model (its `model.json` exists).
pub fn is_converted(dir: &Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}

/// Tracks source bytes done and forwards reports to the caller's callback.
struct Reporter<'a> {
    done: u64,
    total: u64,
    callback: &'a mut dyn FnMut(Progress),
}

impl Reporter<'_> {
    fn advance(&mut self, phase: Phase, bytes: u64) {
        self.done = self.done.saturating_add(bytes).min(self.total);
        (self.callback)(Progress { phase, done_bytes: self.done, total_bytes: self.total });
    }
}

/// Bytes a source tensor occupies as stored (0 when absent).
fn stored_len(ckpt: &Checkpoint, name: &str) -> u64 {
    let elems: usize = ckpt.shape(name).map_or(0, |s| s.iter().product());
    elems as u64 * if ckpt.is_f32(name) { 4 } else { 2 }
}

/// Converts the Hugging Face checkpoint in `src` into a moestream model directory `out`
/// (created if needed), calling `progress` as tensors are processed. A GGUF file `src` is
/// converted into its expert store (ggml blocks unchanged; `options` do not apply).
///
/// `out` must be new, empty, or hold only files a conversion writes (a previous or
/// interrupted conversion); its old `model.json` is removed first. Fails on a source that is
/// missing `config.json` ([`Error::Io`]), has an unsupported architecture, missing or
/// mis-shaped tensors, or matrices the chosen encoding cannot hold; partial outputs are
/// removed and no `model.json` is written then.
pub fn convert(
    src: &Path,
    out: &Path,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<ConvertSummary> {
    if crate::model::gguf::arch::is_gguf(src) {
        // Experts are stored as the GGUF holds them: the encoding options do not apply.
        return gguf::convert_gguf(src, out, progress);
    }
    let start = Instant::now();
    options.validate()?;
    if crate::model::mlx::params(src)?.is_some() {
        // Its int4 would be re-quantized from the dequantized values, no longer lossless.
        return Err(Error::UnsupportedConfig(format!(
            "converting an MLX-quantized directory is not implemented yet; run {} directly",
            src.display()
        )));
    }
    let spec = ArchSpec::from_dir(src)?;
    if is_converted(src) {
        return Err(Error::InvalidArgument(format!("{} is already a converted moestream model", src.display())));
    }
    let fingerprint = source_fingerprint(src)?;
    let ckpt = std::sync::Arc::new(Checkpoint::open(src)?);
    spec.check_against(&ckpt)?;
    let src_canonical = src.canonicalize().map_err(|e| Error::io(src, e))?;
    extra_files::prepare_output(&src_canonical, out)?;

    // An MTP module this crate runs is converted with the model: its layer's experts join the
    // store, its other tensors the resident file (the model's own spec and hash stay).
    // The MTP layer's copies of the embedding and lm_head are left out (the module reads the
    // model's).
    let (stored, skip) = match crate::model::mtp::available(&ckpt, &spec) {
        Ok(full) => (full, crate::model::mtp::copies(&spec).to_vec()),
        Err(_) => (spec.clone(), Vec::new()),
    };
    let mut reporter = Reporter { done: 0, total: ckpt.stored_bytes(), callback: progress };
    let mxfp4 = gpt_oss_weights::experts_are_mxfp4(&ckpt, &spec);
    let (experts, options) = match mxfp4 {
        // gpt-oss's MXFP4 experts are stored as they are (ggml MXFP4 blocks, lossless): the
        // expert encoding option does not apply.
        true => {
            let types: Vec<_> =
                (0..spec.layers).map(|i| spec.is_moe_layer(i).then_some([GgmlType::Mxfp4; 2])).collect();
            let (n, format) =
                gguf::write_store(&ckpt, (&spec, spec.hash()), &types, &out.join(EXPERTS_FILE), &mut reporter)?;
            (n, &ConvertOptions { experts: format, ..*options })
        }
        false => {
            let path = out.join(EXPERTS_FILE);
            let threads = options.worker_threads();
            (
                experts::write_store(&ckpt, (&stored, spec.hash()), options.experts, threads, &path, &mut reporter)?,
                options,
            )
        }
    };
    let resident =
        resident::write_resident(&ckpt, &stored, (options.dense, &skip), &out.join(RESIDENT_FILE), &mut reporter)?;
    drop(ckpt);
    reporter.advance(Phase::Finishing, u64::MAX);

    let mut written = extra_files::copy_extra_files(src, out)?;
    written.push(RESIDENT_FILE.to_string());
    if experts > 0 {
        written.push(EXPERTS_FILE.to_string());
    }
    let mtp_layer = stored.layers > spec.layers;
    let mut manifest = ModelManifest::build(
        out,
        spec,
        options,
        (experts > 0).then(|| EXPERTS_FILE.to_string()),
        &written,
        SourceInfo { path: src_canonical, fingerprint },
    )?;
    manifest.mtp_layer = Some(mtp_layer);
    manifest.save(out)?;

    let size = |name: &str| manifest.files.get(name).map_or(0, |f| f.bytes);
    let output_bytes = manifest.files.values().map(|f| f.bytes).sum::<u64>()
        + std::fs::metadata(out.join(MANIFEST_FILE)).map_or(0, |m| m.len());
    let seconds = start.elapsed().as_secs_f64();
    Ok(ConvertSummary {
        out_dir: out.to_path_buf(),
        source_bytes: reporter.total,
        resident_bytes: size(RESIDENT_FILE),
        experts_bytes: size(EXPERTS_FILE),
        output_bytes,
        resident_tensors: resident,
        experts,
        experts_encoding: options.experts.name(),
        dense_encoding: options.dense.name(),
        seconds,
        peak_rss_bytes: crate::util::peak_rss::peak_rss_bytes(),
        throughput_bytes_per_s: reporter.total as f64 / seconds.max(1e-9),
    })
}
