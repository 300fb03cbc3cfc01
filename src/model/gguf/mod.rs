//! GGUF checkpoints (llama.cpp's format): the container ([`container`]), one file or a split set
//! `NAME-0000K-of-0000N.gguf` ([`GgufModel`]), the ggml tensor types ([`GgmlType`]) and their
//! CPU dequantization ([`dequant`]), the CPU reference of the GPU readers.
//!
//! The container parser is hand-written (about 200 lines): the GGUF crates on crates.io either
//! come with a whole ML framework (candle) or are young single-author crates, and the format is
//! small and fixed (<https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>).

pub mod arch;
pub mod container;
pub mod dequant;
pub mod error;
pub mod hf_config;
pub mod names;
pub mod tokenizer;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

pub use crate::quant::GgmlType;
pub use container::{Container, GgufValue, TensorInfo};
pub use error::GgufError;

/// A GGUF model: one file or every part of a split set, mapped, with the metadata of the first
/// part and the tensors of all.
pub struct GgufModel {
    files: Vec<(PathBuf, Mmap)>,
    /// Metadata of the first part (llama.cpp's `gguf-split` keeps every key there).
    pub metadata: BTreeMap<String, GgufValue>,
    tensors: HashMap<String, (usize, TensorInfo)>,
    order: Vec<String>,
}

/// `(prefix, part number, part count)` of a split part name `PREFIX-0000K-of-0000N.gguf`.
fn split_name(path: &Path) -> Option<(String, usize, usize)> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    Some((prefix.to_string(), no.parse().ok()?, count.parse().ok()?))
}

/// The files of the GGUF model `path` names: every part of a split set (from the name alone,
/// existing or not), else `path` itself.
pub fn part_paths(path: &Path) -> Vec<PathBuf> {
    match split_name(path) {
        Some((prefix, _, count)) if count > 1 => {
            let dir = path.parent().unwrap_or(Path::new("."));
            (1..=count).map(|k| dir.join(format!("{prefix}-{k:05}-of-{count:05}.gguf"))).collect()
        }
        _ => vec![path.to_path_buf()],
    }
}

fn map(path: &Path) -> Result<Mmap, GgufError> {
    let io = |source| GgufError::Io { path: path.into(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the file is opened read-only; moestream never writes a checkpoint while running it.
    unsafe { Mmap::map(&file) }.map_err(io)
}

impl GgufModel {
    /// Opens `path`; a split part (any of them) opens the whole set, which must be complete and
    /// consistent (`split.count`, `split.no`, `split.tensors.count`).
    pub fn open(path: &Path) -> Result<GgufModel, GgufError> {
        let parts = part_paths(path);
        let mut model =
            GgufModel { files: Vec::new(), metadata: BTreeMap::new(), tensors: HashMap::new(), order: Vec::new() };
        let n_parts = parts.len();
        for (k, part) in parts.into_iter().enumerate() {
            let mmap = map(&part)?;
            let c = Container::parse(&mmap, &part)?;
            let split_err = |message: String| GgufError::Split { path: part.clone(), message };
            if n_parts > 1 {
                let count = c.metadata.get("split.count").and_then(GgufValue::as_u64);
                let no = c.metadata.get("split.no").and_then(GgufValue::as_u64);
                if count != Some(n_parts as u64) || no != Some(k as u64) {
                    return Err(split_err(format!(
                        "split.count {count:?} / split.no {no:?}, expected {n_parts} / {k} from the file name"
                    )));
                }
            }
            if k == 0 {
                model.metadata = c.metadata;
            }
            for t in c.tensors {
                if model.tensors.contains_key(&t.name) {
                    return Err(split_err(format!("tensor `{}` appears twice", t.name)));
                }
                model.order.push(t.name.clone());
                model.tensors.insert(t.name.clone(), (k, t));
            }
            model.files.push((part, mmap));
        }
        if let Some(expected) = model.metadata.get("split.tensors.count").and_then(GgufValue::as_u64) {
            if n_parts > 1 && expected != model.order.len() as u64 {
                return Err(GgufError::Split {
                    path: path.into(),
                    message: format!("{} tensors in the parts, split.tensors.count says {expected}", model.order.len()),
                });
            }
        }
        Ok(model)
    }

    /// The part (index into [`GgufModel::into_files`]) holding tensor `name`.
    pub fn part_of(&self, name: &str) -> Option<usize> {
        self.tensors.get(name).map(|(k, _)| *k)
    }

    /// The mapped parts, in order.
    pub fn into_files(self) -> Vec<(PathBuf, Mmap)> {
        self.files
    }

    /// The paths of the parts, in order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }

    /// Tensor names in file order.
    pub fn tensor_names(&self) -> &[String] {
        &self.order
    }

    /// The table entry of tensor `name`.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name).map(|(_, t)| t)
    }

    /// The stored bytes of tensor `name`.
    pub fn bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        let (file, t) = self.tensors.get(name).ok_or_else(|| GgufError::MissingTensor(name.into()))?;
        Ok(&self.files[*file].1[t.offset..t.offset + t.bytes])
    }

    /// Tensor `name` dequantized to f32 (row-major, shape as [`GgufModel::info`]).
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let t = self.info(name).ok_or_else(|| GgufError::MissingTensor(name.into()))?;
        Ok(dequant::dequantize(t.ggml_type, self.bytes(name)?))
    }

    /// Metadata value `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// Metadata `key` as an unsigned integer, or [`GgufError::MissingKey`].
    pub fn u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get(key).and_then(GgufValue::as_u64).ok_or_else(|| GgufError::MissingKey(key.into()))
    }

    /// Metadata `key` as a float, or [`GgufError::MissingKey`].
    pub fn f64(&self, key: &str) -> Result<f64, GgufError> {
        self.get(key).and_then(GgufValue::as_f64).ok_or_else(|| GgufError::MissingKey(key.into()))
    }

    /// Metadata `key` as a string, or [`GgufError::MissingKey`].
    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        self.get(key).and_then(GgufValue::as_str).ok_or_else(|| GgufError::MissingKey(key.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::split_name;
    use std::path::Path;

    #[test]
    fn split_names() {
        assert_eq!(split_name(Path::new("/m/a-b-00002-of-00003.gguf")), Some(("a-b".into(), 2, 3)));
        assert_eq!(split_name(Path::new("model.gguf")), None);
        assert_eq!(split_name(Path::new("x-2-of-3.gguf")), None);
    }
}
