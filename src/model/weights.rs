//! Memory-mapped safetensors checkpoints (single file or sharded with an index).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};

/// Element type of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredDtype {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
}

struct Entry {
    file: usize,
    dtype: StoredDtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// A tensor read into host memory as f32.
#[derive(Clone, Debug)]
pub struct HostTensor {
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub data: Vec<f32>,
}

/// All tensors of a checkpoint directory, mapped but not yet read.
pub struct Checkpoint {
    files: Vec<(PathBuf, Mmap)>,
    entries: HashMap<String, Entry>,
}

fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Json { path: index.clone(), message: e.to_string() })?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::Json { path: index.clone(), message: "missing weight_map".into() })?;
        let mut files: Vec<PathBuf> = map.values().filter_map(|f| f.as_str()).map(|f| dir.join(f)).collect();
        files.sort();
        files.dedup();
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::NoWeights(dir.to_path_buf()));
    }
    Ok(files)
}

impl Checkpoint {
    /// Maps every safetensors file of `dir` and indexes its tensors.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let mut files = Vec::new();
        let mut entries = HashMap::new();
        for path in weight_files(dir)? {
            let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
            // SAFETY: the file is opened read-only; a concurrent writer would be a user error
            // that can only change values, which the readers below bounds-check.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
            let (header_len, meta) = SafeTensors::read_metadata(&mmap)
                .map_err(|e| Error::Safetensors { path: path.clone(), message: e.to_string() })?;
            let data_start = 8 + header_len;
            let file_index = files.len();
            for (name, info) in meta.tensors() {
                let dtype = match info.dtype {
                    Dtype::F32 => StoredDtype::F32,
                    Dtype::F16 => StoredDtype::F16,
                    Dtype::BF16 => StoredDtype::BF16,
                    other => return Err(Error::TensorDtype { name, dtype: format!("{other:?}") }),
                };
                let (a, b) = info.data_offsets;
                let (start, end) = (data_start + a, data_start + b);
                let elems: usize = info.shape.iter().product();
                let width = if dtype == StoredDtype::F32 { 4 } else { 2 };
                if end > mmap.len() || end - start != elems * width {
                    return Err(Error::Safetensors {
                        path: path.clone(),
                        message: format!("tensor {name} data range is out of bounds or mis-sized"),
                    });
                }
                entries.insert(name, Entry { file: file_index, dtype, shape: info.shape.clone(), start, end });
            }
            files.push((path, mmap));
        }
        Ok(Checkpoint { files, entries })
    }

    /// Whether a tensor of that name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The stored shape of `name`.
    pub fn shape(&self, name: &str) -> Result<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice()).ok_or_else(|| Error::MissingTensor(name.into()))
    }

    /// Total bytes of all tensors as stored.
    pub fn stored_bytes(&self) -> u64 {
        self.entries.values().map(|e| (e.end - e.start) as u64).sum()
    }

    /// Reads `name` as f32, checking that its shape is `expected`.
    pub fn tensor(&self, name: &str, expected: &[usize]) -> Result<HostTensor> {
        let e = self.entries.get(name).ok_or_else(|| Error::MissingTensor(name.into()))?;
        if e.shape != expected {
            return Err(Error::TensorShape { name: name.into(), actual: e.shape.clone(), expected: expected.to_vec() });
        }
        let bytes = &self.files[e.file].1[e.start..e.end];
        let data = match e.dtype {
            StoredDtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            StoredDtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            StoredDtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        };
        Ok(HostTensor { shape: e.shape.clone(), data })
    }

    /// The files backing this checkpoint.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }
}
