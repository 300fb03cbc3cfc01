//! Streams every non-expert tensor of a checkpoint into `resident.safetensors`.
//!
//! `safetensors::serialize_to_file` asks each tensor for its bytes only when it writes them, so
//! [`LazyTensor::data`] reads, encodes and releases one source tensor at a time: memory stays
//! bounded by the largest tensor (its f32 copy plus its encoding).

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use safetensors::{Dtype, SafeTensorError, View};

use super::{stored_len, Phase, Reporter};
use crate::error::{Error, Result};
use crate::model::weights::{int4_metadata, INT4_METADATA_KEY};
use crate::model::{names, ArchSpec, Checkpoint};
use crate::ops::WeightFormat;
use crate::quant::Int4Layout;

/// How one tensor is stored.
#[derive(Clone, Copy, Debug)]
enum Encoding {
    /// Little-endian f32, shape kept (vectors).
    F32,
    /// Little-endian f16, shape kept.
    F16,
    /// An int4 blob of `len` bytes, stored as U8 `[len]`.
    Int4 { layout: Int4Layout },
}

/// State shared by every lazy tensor of one file.
struct Shared<'a, 'r> {
    ckpt: &'a Checkpoint,
    reporter: RefCell<&'a mut Reporter<'r>>,
    /// The first failure; later tensors are skipped and the file is discarded.
    error: RefCell<Option<Error>>,
}

/// A tensor whose bytes are produced when the writer asks for them.
struct LazyTensor<'s, 'a, 'r> {
    shared: &'s Shared<'a, 'r>,
    /// The checkpoint tensor the bytes come from (the embedding for a tied lm_head).
    name: String,
    /// Shape in the source checkpoint.
    source_shape: Vec<usize>,
    /// Shape as stored.
    shape: Vec<usize>,
    encoding: Encoding,
}

impl LazyTensor<'_, '_, '_> {
    fn encode(&self) -> Result<Vec<u8>> {
        let ckpt = self.shared.ckpt;
        let t = ckpt.tensor(&self.name, &self.source_shape)?;
        ckpt.release(&self.name);
        let with_name = |e: Error| match e {
            Error::UnsupportedConfig(m) => Error::UnsupportedConfig(format!("tensor {}: {m}", self.name)),
            other => other,
        };
        let bytes = match self.encoding {
            Encoding::F32 => t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Encoding::F16 => {
                let (rows, cols) = (self.shape[0], self.shape[1]);
                let mut b = WeightFormat::F16.encode(&t.data, rows, cols).map_err(with_name)?;
                b.truncate(rows * cols * 2);
                b
            }
            Encoding::Int4 { layout } => {
                WeightFormat::Int4(layout.params).encode(&t.data, layout.rows, layout.cols).map_err(with_name)?
            }
        };
        self.shared.reporter.borrow_mut().advance(Phase::Resident, stored_len(ckpt, &self.name));
        Ok(bytes)
    }
}

impl View for LazyTensor<'_, '_, '_> {
    fn dtype(&self) -> Dtype {
        match self.encoding {
            Encoding::F32 => Dtype::F32,
            Encoding::F16 => Dtype::F16,
            Encoding::Int4 { .. } => Dtype::U8,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        if self.shared.error.borrow().is_some() {
            // The file is discarded; writing nothing keeps a failed conversion fast.
            return Cow::Borrowed(&[]);
        }
        match self.encode() {
            Ok(bytes) => {
                debug_assert_eq!(bytes.len(), self.data_len(), "{}", self.name);
                Cow::Owned(bytes)
            }
            Err(e) => {
                *self.shared.error.borrow_mut() = Some(e);
                Cow::Borrowed(&[])
            }
        }
    }

    fn data_len(&self) -> usize {
        match self.encoding {
            Encoding::F32 => self.shape.iter().product::<usize>() * 4,
            Encoding::F16 => self.shape.iter().product::<usize>() * 2,
            Encoding::Int4 { layout } => layout.total_len,
        }
    }
}

/// The encoding of tensor `name` of shape `shape`: vectors (and empty tensors) and the
/// matrices in `keep_f32` (MLA's `kv_b_proj`, which the MLA kernel reads in f32) stay f32; the
/// embedding and routers become f16; other matrices follow `dense`.
fn encoding_of(
    name: &str,
    shape: &[usize],
    (routers, keep_f32): (&HashSet<String>, &HashSet<String>),
    dense: WeightFormat,
) -> Result<Encoding> {
    let [rows, cols] = shape[..] else {
        return Ok(Encoding::F32);
    };
    if rows * cols == 0 || keep_f32.contains(name) {
        return Ok(Encoding::F32);
    }
    if name == names::EMBED || routers.contains(name) {
        return Ok(Encoding::F16);
    }
    match dense {
        WeightFormat::Int4(p) => Int4Layout::new(rows, cols, p)
            .map(|layout| Encoding::Int4 { layout })
            .map_err(|e| Error::UnsupportedConfig(format!("tensor {name} {shape:?} cannot be stored in int4: {e}"))),
        _ => Ok(Encoding::F16),
    }
}

/// Writes every tensor whose name has no `.experts.` component (but gpt-oss's expert biases)
/// and is not in `skip` to `path` and returns how many. On failure the file is removed.
pub(super) fn write_resident(
    ckpt: &Checkpoint,
    spec: &ArchSpec,
    (dense, skip): (WeightFormat, &[String]),
    path: &Path,
    reporter: &mut Reporter,
) -> Result<usize> {
    let routers: HashSet<String> =
        (0..spec.layers).filter(|&i| spec.is_moe_layer(i)).map(|i| names::router(spec.family, i)).collect();
    let mut keep_f32: HashSet<String> = match spec.mla() {
        Some(_) => (0..spec.layers).map(|i| format!("{}.self_attn.kv_b_proj.weight", names::layer(i))).collect(),
        None => HashSet::new(),
    };
    // gpt-oss's expert biases stay resident, in f32 as the experts' kernels read them.
    let expert_bias = |n: &str| n.contains(".experts.") && n.ends_with("_proj_bias");
    keep_f32.extend(ckpt.names().filter(|n| expert_bias(n)).map(String::from));
    let mut names: Vec<&str> =
        ckpt.names().filter(|n| (!n.contains(".experts.") || expert_bias(n)) && !skip.iter().any(|c| c == n)).collect();
    names.sort_unstable();
    let shared = Shared { ckpt, reporter: RefCell::new(reporter), error: RefCell::new(None) };
    let mut tensors = Vec::with_capacity(names.len());
    for name in names {
        let source_shape = ckpt.shape(name)?.to_vec();
        let encoding = encoding_of(name, &source_shape, (&routers, &keep_f32), dense)?;
        let shape = match encoding {
            Encoding::Int4 { layout } => vec![layout.total_len],
            _ => source_shape.clone(),
        };
        tensors.push((
            name.to_string(),
            LazyTensor { shared: &shared, name: name.to_string(), source_shape, shape, encoding },
        ));
    }
    // A tied lm_head stored in int4 must be quantized from the original embedding, not from
    // its f16 copy, so that converted and directly loaded models hold the same weights.
    if spec.tie_embeddings && !ckpt.contains(names::LM_HEAD) && matches!(dense, WeightFormat::Int4(_)) {
        let source_shape = vec![spec.vocab, spec.hidden];
        let encoding = encoding_of(names::LM_HEAD, &source_shape, (&routers, &keep_f32), dense)?;
        let shape = match encoding {
            Encoding::Int4 { layout } => vec![layout.total_len],
            _ => source_shape.clone(),
        };
        let lazy = LazyTensor { shared: &shared, name: names::EMBED.to_string(), source_shape, shape, encoding };
        tensors.push((names::LM_HEAD.to_string(), lazy));
    }
    let count = tensors.len();
    let metadata = match dense {
        WeightFormat::Int4(p) if tensors.iter().any(|(_, t)| matches!(t.encoding, Encoding::Int4 { .. })) => {
            Some(HashMap::from([(INT4_METADATA_KEY.to_string(), int4_metadata(p))]))
        }
        _ => None,
    };
    let written = safetensors::serialize_to_file(tensors, metadata, path).map_err(|e| match e {
        SafeTensorError::IoError(io) => Error::io(path, io),
        other => Error::Safetensors { path: path.to_path_buf(), message: other.to_string() },
    });
    if let Some(e) = shared.error.into_inner() {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    if let Err(e) = written {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(count)
}
