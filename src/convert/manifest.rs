//! [`ModelManifest`]: `model.json`, the description of a converted model directory.
//!
//! ```json
//! {"format": "moestream-model", "version": 1,
//!  "arch": { ...ArchSpec... },
//!  "experts": {"file": "experts.bin", "encoding": "int4-affine-g32"},
//!  "dense": "int4-affine-g32",
//!  "files": {"resident.safetensors": {"bytes": 123, "crc32": "0a1b2c3d"}, ...},
//!  "source": {"path": "/models/Mixtral-8x7B", "fingerprint": "89ab..."}}
//! ```
//!
//! A converted GGUF model (`moestream convert FILE.gguf`) adds `"gguf": "/models/m.gguf"`, the
//! file holding its other tensors and tokenizer; its `experts.encoding` is the arena's format
//! (each layer's ggml types are in the store) and `dense` is `"f32"` (GGUF matrices are read
//! in their own types):
//!
//! ```json
//! {"experts": {"file": "experts.bin", "encoding": "q4_k"}, "dense": "f32",
//!  "files": {"experts.bin": {...}}, "gguf": "/models/m.gguf", ...}
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fingerprint::file_crc32;
use super::ConvertOptions;
use crate::error::{Error, Result};
use crate::model::ArchSpec;
use crate::ops::WeightFormat;
use crate::quant::GgmlType;
use crate::quant::{Int4Scheme, QuantParams};

pub use crate::util::model_files::MANIFEST_FILE;
/// Value of the manifest's `format` field.
pub const MANIFEST_FORMAT: &str = "moestream-model";
/// The manifest version this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// The expert store of a converted model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertsEntry {
    /// File name of the store within the directory (`None` for dense models, which have none).
    pub file: Option<String>,
    /// Encoding of the experts (`"f16"` or `"int4-<scheme>-g<group>"` in JSON).
    #[serde(with = "format_name")]
    pub encoding: WeightFormat,
}

/// Size and checksum of one file of a converted model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Length in bytes.
    pub bytes: u64,
    /// crc32 (IEEE, as `crc32fast`) of the whole file, 8 lowercase hex digits.
    pub crc32: String,
}

/// Where a converted model came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// Canonical path of the Hugging Face directory.
    pub path: PathBuf,
    /// [`super::source_fingerprint`] of that directory at conversion time.
    pub fingerprint: String,
}

/// The contents of `model.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelManifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// Always [`MANIFEST_VERSION`] for manifests this build accepts.
    pub version: u32,
    /// The model's architecture.
    pub arch: ArchSpec,
    /// The expert store.
    pub experts: ExpertsEntry,
    /// Encoding of the resident matrices other than embeddings and routers (`"f16"` or
    /// `"int4-<scheme>-g<group>"` in JSON).
    #[serde(with = "format_name")]
    pub dense: WeightFormat,
    /// Every file of the directory except `model.json`, by name.
    pub files: BTreeMap<String, FileEntry>,
    /// The source checkpoint.
    pub source: SourceInfo,
    /// For a converted GGUF model: the GGUF file (canonical path) whose non-expert tensors,
    /// tokenizer and chat template the model uses (the directory holds only its experts);
    /// `None` for Hugging Face conversions, whose `resident.safetensors` holds them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gguf: Option<PathBuf>,
    /// Whether the model's MTP layer was stored with it (its experts in the store, its other
    /// tensors beside the model's): `Some(false)` where it has none this build runs, `None` in
    /// manifests written before MTP layers were stored (a cached conversion of a model with MTP
    /// layers is then made again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp_layer: Option<bool>,
}

impl ModelManifest {
    /// Describes a freshly converted directory, checksumming each of `files` (names in `dir`).
    pub(super) fn build(
        dir: &Path,
        arch: ArchSpec,
        options: &ConvertOptions,
        experts_file: Option<String>,
        files: &[String],
        source: SourceInfo,
    ) -> Result<ModelManifest> {
        let mut entries = BTreeMap::new();
        for name in files {
            let (bytes, crc) = file_crc32(&dir.join(name))?;
            entries.insert(name.clone(), FileEntry { bytes, crc32: format!("{crc:08x}") });
        }
        Ok(ModelManifest {
            format: MANIFEST_FORMAT.into(),
            version: MANIFEST_VERSION,
            arch,
            experts: ExpertsEntry { file: experts_file, encoding: options.experts },
            dense: options.dense,
            files: entries,
            source,
            gguf: None,
            mtp_layer: None,
        })
    }

    /// Reads `dir/model.json`.
    ///
    /// Fails with [`Error::Io`] when it is missing or unreadable, [`Error::Json`] when it is
    /// malformed (including an unknown encoding or another `format`), and
    /// [`Error::UnsupportedConfig`] when its version is not [`MANIFEST_VERSION`].
    pub fn load(dir: &Path) -> Result<ModelManifest> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let json = |message: String| Error::Json { path: path.clone(), message };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| json(e.to_string()))?;
        let format = value.get("format").and_then(|f| f.as_str());
        if format != Some(MANIFEST_FORMAT) {
            return Err(json(format!("`format` is {format:?}, expected {MANIFEST_FORMAT:?}")));
        }
        let version = value.get("version").and_then(|v| v.as_u64()).ok_or_else(|| json("missing `version`".into()))?;
        if version != MANIFEST_VERSION as u64 {
            return Err(Error::UnsupportedConfig(format!(
                "{} has manifest version {version}; this build reads version {MANIFEST_VERSION} (convert the model again)",
                path.display()
            )));
        }
        let manifest: ModelManifest = serde_json::from_value(value).map_err(|e| json(e.to_string()))?;
        manifest.arch.check_limits()?;
        Ok(manifest)
    }

    /// Writes `dir/model.json` atomically (a temporary file, synced, then renamed).
    pub(super) fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST_FILE);
        let tmp = dir.join(format!("{MANIFEST_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self).expect("a manifest serialises");
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()
        };
        write().map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
    }

    /// The format of the routed experts in the store.
    pub fn expert_format(&self) -> WeightFormat {
        self.experts.encoding
    }

    /// The format of the resident matrices other than embeddings and routers.
    pub fn dense_format(&self) -> WeightFormat {
        self.dense
    }

    /// Checks every listed file of `dir` against its recorded size and, when `full`, its crc32
    /// (which reads every byte). A missing file is [`Error::Io`]; a mismatch is
    /// [`Error::Corrupt`].
    pub fn verify_files(&self, dir: &Path, full: bool) -> Result<()> {
        for (name, entry) in &self.files {
            let path = dir.join(name);
            let len = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len();
            if len != entry.bytes {
                return Err(Error::Corrupt { path, detail: format!("{len} bytes, manifest says {}", entry.bytes) });
            }
            if full {
                let (_, crc) = file_crc32(&path)?;
                let crc = format!("{crc:08x}");
                if crc != entry.crc32 {
                    return Err(Error::Corrupt { path, detail: format!("crc32 {crc}, manifest says {}", entry.crc32) });
                }
            }
        }
        Ok(())
    }
}

/// Serde of a [`WeightFormat`] as its name (`"f16"`, `"int4-affine-g32"`, and for converted
/// GGUF models `"f32"` and the ggml types `"q4_k"`, `"q6_k"`, ...).
mod format_name {
    use super::*;

    pub fn serialize<S: serde::Serializer>(f: &WeightFormat, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&f.name())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<WeightFormat, D::Error> {
        let name = String::deserialize(d)?;
        parse(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown encoding {name:?} (expected f16, f32, int4-<scheme>-g<32|64> or a ggml type)"
            ))
        })
    }

    fn parse(name: &str) -> Option<WeightFormat> {
        match name {
            "f16" => return Some(WeightFormat::F16),
            "f32" => return Some(WeightFormat::F32),
            _ => {}
        }
        if let Some(t) = GgmlType::from_name(name) {
            return Some(WeightFormat::of_ggml(t));
        }
        let (scheme, group) = name.strip_prefix("int4-")?.split_once("-g")?;
        let scheme = match scheme {
            "affine" => Int4Scheme::Affine,
            "symmetric" => Int4Scheme::Symmetric,
            _ => return None,
        };
        QuantParams::new(scheme, group.parse().ok()?).ok().map(WeightFormat::Int4)
    }
}
