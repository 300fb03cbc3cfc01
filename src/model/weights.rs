//! Memory-mapped checkpoints: safetensors (single file or sharded with an index, MLX 4-bit, int4
//! conversions) and GGUF files (`gguf.rs`), read by Hugging Face tensor name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::model::gguf::names::Fix;
use crate::quant::GgmlType;
use crate::quant::{Int4Layout, Int4Matrix, Int4Scheme, QuantParams};

mod gguf;

use gguf::{ggml_tensor, joined_kv_b};

/// Element type of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredDtype {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// An int4 blob (see [`crate::quant`]) written by `moestream convert`.
    Int4Blob,
    /// A GGUF tensor of this ggml type (see [`crate::model::gguf`]).
    Ggml(GgmlType),
    /// Packed 4-bit codes of an MLX-quantized tensor (see [`crate::model::mlx`]).
    MlxWords,
    /// Raw bytes (gpt-oss's MXFP4 `*_blocks` / `*_scales`), read only as bytes
    /// ([`Checkpoint::u8_slab`]).
    U8,
}

struct Entry {
    file: usize,
    dtype: StoredDtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
    /// What llama.cpp's converter changed in a GGUF tensor (reordered rows or columns, changed
    /// values), undone on reading.
    fix: Fix,
    /// MLA's `kv_b_proj` of a GGUF file that splits it (llama.cpp's `attn_k_b` here, read
    /// with this `attn_v_b`), put back together on reading.
    split_kv_b: Option<SplitKvB>,
}

/// The `attn_v_b` half of a split `kv_b_proj` (the entry's own bytes are `attn_k_b`,
/// `[heads, kv_lora_rank, qk_nope]`); `v` is `[heads, v_head, kv_lora_rank]`.
#[derive(Clone, Copy, Debug)]
struct SplitKvB {
    file: usize,
    start: usize,
    end: usize,
    ggml_type: GgmlType,
    heads: usize,
    nope: usize,
    v_head: usize,
    rank: usize,
}

impl Entry {
    /// Bytes the tensor takes in its file(s).
    fn stored_len(&self) -> usize {
        self.end - self.start + self.split_kv_b.map_or(0, |v| v.end - v.start)
    }
}

/// A tensor read into host memory as f32.
#[derive(Clone, Debug)]
pub struct HostTensor {
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Row-major values (dequantized when the tensor is stored in int4).
    pub data: Vec<f32>,
    /// The stored int4 form, when the checkpoint holds this tensor quantized (a converted
    /// model's `resident.safetensors`), so uploads need not quantize again.
    pub int4: Option<Int4Matrix>,
    /// The GGUF bytes of a matrix read from a GGUF file, which the GPU reads as they are
    /// (`data` is their dequantization).
    pub ggml: Option<GgmlBlob>,
}

/// A matrix's bytes in a ggml type, rows of blocks back to back.
#[derive(Clone, Debug, PartialEq)]
pub struct GgmlBlob {
    /// Element type.
    pub ggml_type: GgmlType,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl HostTensor {
    /// A plain f32 tensor.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> HostTensor {
        HostTensor { shape, data, int4: None, ggml: None }
    }

    /// The rows of `parts` one after the other (matrices of equal width), keeping the int4 form
    /// when every part has one with the same parameters (the ggml form likewise). Built in one
    /// pass, so stacking three matrices holds no stack of the first two beside the result.
    pub fn concat_rows(parts: &[&HostTensor]) -> HostTensor {
        let (first, rest) = parts.split_first().expect("concat_rows needs a matrix");
        assert!(rest.iter().all(|p| p.shape[1] == first.shape[1]), "concat_rows needs equal widths");
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        for p in parts {
            data.extend_from_slice(&p.data);
        }
        let int4 = match parts.iter().map(|p| p.int4.as_ref()).collect::<Option<Vec<_>>>() {
            Some(ms) if ms.iter().all(|m| m.params == ms[0].params) => {
                let mut m = ms[0].clone();
                m.packed.reserve(ms[1..].iter().map(|y| y.packed.len()).sum());
                for y in &ms[1..] {
                    m.rows += y.rows;
                    m.packed.extend_from_slice(&y.packed);
                    m.scales.extend_from_slice(&y.scales);
                    m.mins.extend_from_slice(&y.mins);
                }
                Some(m)
            }
            _ => None,
        };
        let ggml = match parts.iter().map(|p| p.ggml.as_ref()).collect::<Option<Vec<_>>>() {
            Some(gs) if gs.iter().all(|g| g.ggml_type == gs[0].ggml_type) => Some(GgmlBlob {
                ggml_type: gs[0].ggml_type,
                bytes: gs.iter().map(|g| &g.bytes[..]).collect::<Vec<_>>().concat(),
            }),
            _ => None,
        };
        let rows = parts.iter().map(|p| p.shape[0]).sum();
        HostTensor { shape: vec![rows, first.shape[1]], data, int4, ggml }
    }
}

/// The safetensors metadata key naming the int4 parameters of a file's U8 tensors.
pub const INT4_METADATA_KEY: &str = "moestream.int4";

/// All tensors of a checkpoint directory, mapped but not yet read.
pub struct Checkpoint {
    files: Vec<(PathBuf, Mmap)>,
    entries: HashMap<String, Entry>,
    int4: Option<QuantParams>,
    /// The int4 parameters of an MLX-quantized directory.
    mlx: Option<QuantParams>,
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
        let mut ck = Checkpoint::open_files(weight_files(dir)?)?;
        if crate::model::config::Family::of_dir(dir) == Some(crate::model::config::Family::BailingHybrid) {
            ck.rename(crate::model::names::from_ling);
        }
        // An MTP module in Qwen3-Next's `mtp.*` layout reads as the layer after the last one.
        if ck.entries.keys().any(|n| n.starts_with("mtp.")) {
            let layers = ck
                .entries
                .keys()
                .filter_map(|n| n.strip_prefix("model.layers.")?.split('.').next()?.parse::<usize>().ok())
                .max()
                .map_or(0, |last| last + 1);
            ck.rename(|n| crate::model::names::from_mtp(n, layers));
        }
        ck.mlx = crate::model::mlx::params(dir)?;
        if ck.mlx.is_some() {
            ck.alias_stacked_experts();
        }
        Ok(ck)
    }

    /// Maps the one safetensors file `path` (an adapter's weights, for example).
    pub fn open_file(path: &Path) -> Result<Checkpoint> {
        Checkpoint::open_files(vec![path.to_path_buf()])
    }

    fn open_files(paths: Vec<PathBuf>) -> Result<Checkpoint> {
        let mut files = Vec::new();
        let mut entries = HashMap::new();
        let mut int4 = None;
        for path in paths {
            let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
            // SAFETY: the file is opened read-only; a concurrent writer would be a user error
            // that can only change values, which the readers below bounds-check.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
            let (header_len, meta) = SafeTensors::read_metadata(&mmap)
                .map_err(|e| Error::Safetensors { path: path.clone(), message: e.to_string() })?;
            let data_start = 8 + header_len;
            let file_index = files.len();
            if let Some(spec) = meta.metadata().as_ref().and_then(|m| m.get(INT4_METADATA_KEY)) {
                int4 = Some(parse_int4(spec).ok_or_else(|| Error::Safetensors {
                    path: path.clone(),
                    message: format!("bad {INT4_METADATA_KEY} metadata {spec:?}"),
                })?);
            }
            for (name, info) in meta.tensors() {
                let dtype = match info.dtype {
                    Dtype::F32 => StoredDtype::F32,
                    Dtype::F16 => StoredDtype::F16,
                    Dtype::BF16 => StoredDtype::BF16,
                    Dtype::U8 if int4.is_some() => StoredDtype::Int4Blob,
                    Dtype::U8 => StoredDtype::U8,
                    Dtype::U32 => StoredDtype::MlxWords,
                    other => return Err(Error::TensorDtype { name, dtype: format!("{other:?}") }),
                };
                let (a, b) = info.data_offsets;
                let (start, end) = (data_start + a, data_start + b);
                let elems: usize = info.shape.iter().product();
                let width = match dtype {
                    StoredDtype::F32 | StoredDtype::MlxWords => 4,
                    StoredDtype::Int4Blob | StoredDtype::U8 => 1,
                    _ => 2,
                };
                if end > mmap.len() || end < start || end - start != elems * width {
                    return Err(Error::Safetensors {
                        path: path.clone(),
                        message: format!("tensor {name} data range is out of bounds or mis-sized"),
                    });
                }
                let entry = Entry {
                    file: file_index,
                    dtype,
                    shape: info.shape.clone(),
                    start,
                    end,
                    fix: Fix::default(),
                    split_kv_b: None,
                };
                entries.insert(name, entry);
            }
            files.push((path, mmap));
        }
        Ok(Checkpoint { files, entries, int4, mlx: None })
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
        self.entries.values().map(|e| e.stored_len() as u64).sum()
    }

    /// Checks that `name` exists with shape `expected` (an int4 blob: the length that shape
    /// takes), reading no data.
    pub fn check_shape(&self, name: &str, expected: &[usize]) -> Result<()> {
        let e = self.entries.get(name).ok_or_else(|| Error::MissingTensor(name.into()))?;
        if e.dtype == StoredDtype::Int4Blob {
            return self.int4_layout(name, e, expected).map(|_| ());
        }
        if e.dtype == StoredDtype::MlxWords {
            return self.mlx_shape(name, e, expected).map(|_| ());
        }
        if e.shape != expected {
            return Err(Error::TensorShape { name: name.into(), actual: e.shape.clone(), expected: expected.to_vec() });
        }
        Ok(())
    }

    /// Reads `name` as f32, checking that its shape is `expected`.
    pub fn tensor(&self, name: &str, expected: &[usize]) -> Result<HostTensor> {
        self.check_shape(name, expected)?;
        let e = &self.entries[name];
        match e.dtype {
            StoredDtype::Int4Blob => return self.int4_tensor(name, e, expected),
            StoredDtype::MlxWords => return self.mlx_tensor(name, e, expected),
            StoredDtype::U8 => return Err(Error::TensorDtype { name: name.into(), dtype: "U8".into() }),
            _ => {}
        }
        let bytes = &self.files[e.file].1[e.start..e.end];
        if let (StoredDtype::Ggml(t), Some(v)) = (e.dtype, e.split_kv_b) {
            let v_bytes = &self.files[v.file].1[v.start..v.end];
            return Ok(joined_kv_b(t, bytes, v, v_bytes));
        }
        if let StoredDtype::Ggml(t) = e.dtype {
            return Ok(ggml_tensor(t, bytes, &e.shape, &e.fix));
        }
        let data = match e.dtype {
            StoredDtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            StoredDtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            StoredDtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            StoredDtype::Int4Blob | StoredDtype::Ggml(_) | StoredDtype::MlxWords | StoredDtype::U8 => {
                unreachable!("handled above")
            }
        };
        Ok(HostTensor::new(e.shape.clone(), data))
    }

    /// Slab `index` of the outermost dimension of the f32/f16/bf16 or GGUF tensor `name` (whose
    /// shape must be `expected`), as f32: one expert of a stacked expert tensor, or one row of a
    /// matrix, without reading the others.
    pub fn slab(&self, name: &str, expected: &[usize], index: usize) -> Result<HostTensor> {
        let (e, bytes) = self.slab_bytes(name, expected, index)?;
        if let StoredDtype::Ggml(t) = e.dtype {
            return Ok(ggml_tensor(t, bytes, &expected[1..], &Fix::default()));
        }
        let data = match e.dtype {
            StoredDtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            StoredDtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            StoredDtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            other => return Err(Error::TensorDtype { name: name.into(), dtype: format!("{other:?}") }),
        };
        Ok(HostTensor::new(expected[1..].to_vec(), data))
    }

    /// The bytes of slab `index` of the U8 tensor `name` (shape `expected`).
    pub fn u8_slab(&self, name: &str, expected: &[usize], index: usize) -> Result<&[u8]> {
        match self.slab_bytes(name, expected, index)? {
            (e, bytes) if e.dtype == StoredDtype::U8 => Ok(bytes),
            (e, _) => Err(Error::TensorDtype { name: name.into(), dtype: format!("{:?} (U8 expected)", e.dtype) }),
        }
    }

    fn slab_bytes(&self, name: &str, expected: &[usize], index: usize) -> Result<(&Entry, &[u8])> {
        self.check_shape(name, expected)?;
        let e = &self.entries[name];
        let outer = expected.first().copied().unwrap_or(0);
        if index >= outer || e.fix != Fix::default() || e.split_kv_b.is_some() {
            return Err(Error::InvalidArgument(format!("{name}: no slab {index} of {expected:?}")));
        }
        let per = (e.end - e.start) / outer;
        let start = e.start + index * per;
        Ok((e, &self.files[e.file].1[start..start + per]))
    }

    /// The layout of int4 blob `name` as a matrix of shape `expected`, checked against its length.
    fn int4_layout(&self, name: &str, e: &Entry, expected: &[usize]) -> Result<Int4Layout> {
        let params = self.int4.expect("Int4Blob entries exist only with int4 metadata");
        let [rows, cols] = expected[..] else {
            return Err(self.bad_int4(e, format!("int4 tensor {name} must be a matrix, expected shape {expected:?}")));
        };
        let layout = Int4Layout::new(rows, cols, params).map_err(|err| self.bad_int4(e, format!("{name}: {err}")))?;
        if e.shape != [layout.total_len] {
            return Err(Error::TensorShape {
                name: name.into(),
                actual: e.shape.clone(),
                expected: vec![layout.total_len],
            });
        }
        Ok(layout)
    }

    fn bad_int4(&self, e: &Entry, message: String) -> Error {
        Error::Safetensors { path: self.files[e.file].0.clone(), message }
    }

    fn int4_tensor(&self, name: &str, e: &Entry, expected: &[usize]) -> Result<HostTensor> {
        let layout = self.int4_layout(name, e, expected)?;
        let m = Int4Matrix::read_from(&self.files[e.file].1[e.start..e.end], &layout)
            .map_err(|err| self.bad_int4(e, format!("{name}: {err}")))?;
        Ok(HostTensor { shape: expected.to_vec(), data: m.dequantize(), int4: Some(m), ggml: None })
    }

    /// Checks an MLX-quantized matrix's packed words against `[rows, cols]`: its parameters,
    /// rows, columns and the name its scales and biases hang off.
    fn mlx_shape<'n>(
        &self,
        name: &'n str,
        e: &Entry,
        expected: &[usize],
    ) -> Result<(QuantParams, usize, usize, &'n str)> {
        let (Some(params), &[rows, cols], Some(base)) = (self.mlx, expected, name.strip_suffix(".weight")) else {
            return Err(Error::TensorDtype { name: name.into(), dtype: "U32 (not an MLX-quantized matrix)".into() });
        };
        if e.shape != [rows, cols / 8] || cols % 8 != 0 {
            return Err(Error::TensorShape {
                name: name.into(),
                actual: e.shape.clone(),
                expected: vec![rows, cols / 8],
            });
        }
        Ok((params, rows, cols, base))
    }

    /// An MLX-quantized `[rows, cols]` matrix: `name` (`X.weight`, `[rows, cols / 8]` words)
    /// with `X.scales` and `X.biases`, read as int4 unchanged.
    fn mlx_tensor(&self, name: &str, e: &Entry, expected: &[usize]) -> Result<HostTensor> {
        let (params, rows, cols, base) = self.mlx_shape(name, e, expected)?;
        let groups = [rows, cols.div_ceil(params.group_size)];
        let scales = self.tensor(&format!("{base}.scales"), &groups)?.data;
        let biases = self.tensor(&format!("{base}.biases"), &groups)?.data;
        let words = &self.files[e.file].1[e.start..e.end];
        let m = crate::model::mlx::int4_matrix(name, params, rows, cols, words, &scales, &biases)?;
        Ok(HostTensor { shape: expected.to_vec(), data: m.dequantize(), int4: Some(m), ggml: None })
    }

    /// Moves every tensor that `rename` gives a new name to that name (a family's own names
    /// to the Hugging Face ones the readers use).
    fn rename(&mut self, rename: impl Fn(&str) -> Option<String>) {
        let moved: Vec<(String, String)> =
            self.entries.keys().filter_map(|n| rename(n).map(|to| (n.clone(), to))).collect();
        for (from, to) in moved {
            if let Some(e) = self.entries.remove(&from) {
                self.entries.insert(to, e);
            }
        }
    }

    /// Registers each expert of mlx_lm's stacked `mlp.switch_mlp.{gate,up,down}_proj.*`
    /// tensors (`[experts, ...]`) under its Hugging Face per-expert name
    /// (`mlp.experts.E.gate_proj.*`): a byte range of the stacked tensor, which is then known
    /// only by those names.
    fn alias_stacked_experts(&mut self) {
        let stacked: Vec<(String, usize, usize, usize, Vec<usize>, StoredDtype)> = self
            .entries
            .iter()
            .filter(|(name, e)| name.contains(".mlp.switch_mlp.") && e.shape.len() == 3)
            .map(|(name, e)| (name.clone(), e.file, e.start, e.end, e.shape.clone(), e.dtype))
            .collect();
        for (name, file, start, end, shape, dtype) in stacked {
            let per = (end - start) / shape[0];
            for x in 0..shape[0] {
                let alias = name.replace(".mlp.switch_mlp.", &format!(".mlp.experts.{x}."));
                let s = start + x * per;
                let entry = Entry {
                    file,
                    dtype,
                    shape: shape[1..].to_vec(),
                    start: s,
                    end: s + per,
                    fix: Fix::default(),
                    split_kv_b: None,
                };
                self.entries.insert(alias, entry);
            }
            self.entries.remove(&name);
        }
    }

    /// The int4 parameters of an MLX-quantized checkpoint.
    pub fn mlx_params(&self) -> Option<QuantParams> {
        self.mlx
    }

    /// Drops the pages of `name` from this process's memory (they are re-read from disk if
    /// touched again), so streaming over a large checkpoint keeps the resident set small. Unix
    /// only (`madvise`); elsewhere the OS reclaims the mapped pages under pressure on its own.
    pub fn release(&self, name: &str) {
        #[cfg(unix)]
        if let Some(e) = self.entries.get(name) {
            let mmap = &self.files[e.file].1;
            let page = 4096;
            let start = e.start / page * page;
            let end = e.end.next_multiple_of(page).min(mmap.len());
            // SAFETY: the mapping is private and read-only; dropping its pages only makes later
            // reads fetch them from the file again.
            let _ = unsafe { mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
        #[cfg(not(unix))]
        let _ = name;
    }

    /// Bytes `name` takes in its file (0 when absent).
    pub fn tensor_bytes(&self, name: &str) -> u64 {
        self.entries.get(name).map_or(0, |e| e.stored_len() as u64)
    }

    /// Every tensor name.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// The ggml type of `name` if it is a GGUF tensor.
    pub fn ggml_type(&self, name: &str) -> Option<GgmlType> {
        match self.entries.get(name)?.dtype {
            StoredDtype::Ggml(t) => Some(t),
            _ => None,
        }
    }

    /// Whether the checkpoint stores a tensor as f32 (else 16-bit or int4).
    pub fn is_f32(&self, name: &str) -> bool {
        self.entries.get(name).is_some_and(|e| e.dtype == StoredDtype::F32)
    }

    /// The files backing this checkpoint.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }
}

/// Parses `affine-g32` / `symmetric-g64`.
fn parse_int4(spec: &str) -> Option<QuantParams> {
    let (scheme, group) = spec.split_once("-g")?;
    let scheme = match scheme {
        "affine" => Int4Scheme::Affine,
        "symmetric" => Int4Scheme::Symmetric,
        _ => return None,
    };
    QuantParams::new(scheme, group.parse().ok()?).ok()
}

/// The metadata value naming `p` (inverse of the parser used by [`Checkpoint::open`]).
pub fn int4_metadata(p: QuantParams) -> String {
    format!("{}-g{}", p.scheme.name(), p.group_size)
}
