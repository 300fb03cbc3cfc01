//! GGUF tensors as a [`Checkpoint`]: llama.cpp's names and layouts mapped back to the Hugging
//! Face ones (per-expert slices, reordered rows, changed values undone, MLA's split `kv_b`).

use std::borrow::Cow;
use std::collections::HashMap;

use super::{Checkpoint, Entry, GgmlBlob, HostTensor, SplitKvB, StoredDtype};
use crate::error::{Error, Result};
use crate::model::gguf::names::{Fix, Values};
use crate::quant::GgmlType;

impl Checkpoint {
    /// The tensors of a GGUF model under their Hugging Face names (per-expert slices of the
    /// stacked expert tensors included), for `spec` ([`crate::model::gguf::arch`]). A GGUF
    /// tensor moestream has no use for is refused by name rather than ignored.
    pub fn from_gguf(model: crate::model::gguf::GgufModel, spec: &crate::model::ArchSpec) -> Result<Checkpoint> {
        let mut entries = HashMap::new();
        for name in model.tensor_names() {
            let info = model.info(name).expect("listed tensors exist");
            if name.ends_with(".attn_v_b.weight") {
                continue; // read with its attn_k_b
            }
            if let Some(block) = name.strip_suffix(".attn_k_b.weight") {
                let (hf, entry) = split_kv_b(&model, block, spec)?;
                entries.insert(hf, entry);
                continue;
            }
            let mapped = crate::model::gguf::names::hf_tensors(spec, name, &info.shape).ok_or_else(|| {
                Error::UnsupportedConfig(format!(
                    "GGUF tensor `{name}` {:?} is not used by {:?}",
                    info.shape, spec.family
                ))
            })?;
            let rows = info.shape[..info.shape.len() - 1].iter().product::<usize>();
            let row_bytes = info.bytes / rows;
            for m in mapped {
                let start = info.offset + m.first_row * row_bytes;
                // Reordered rows may come from anywhere after the first.
                let len = match m.fix.rows {
                    Some(_) => info.bytes - m.first_row * row_bytes,
                    None => m.shape[..m.shape.len() - 1].iter().product::<usize>() * row_bytes,
                };
                let entry = Entry {
                    file: model.part_of(name).expect("listed tensors have a part"),
                    dtype: StoredDtype::Ggml(info.ggml_type),
                    shape: m.shape,
                    start,
                    end: start + len,
                    fix: m.fix,
                    split_kv_b: None,
                };
                entries.insert(m.name, entry);
            }
        }
        Ok(Checkpoint { files: model.into_files(), entries, int4: None, mlx: None })
    }
}

/// The rows of a GGUF tensor of type `t` and `shape` (`bytes` from its first row) in Hugging
/// Face order: reordered where llama.cpp moved them (`fix.rows`), borrowed as stored otherwise.
fn rows_in_order<'a>(t: GgmlType, bytes: &'a [u8], shape: &[usize], fix: &Fix) -> Cow<'a, [u8]> {
    match &fix.rows {
        Some(rows) => {
            let row_bytes = t.row_bytes(shape[1..].iter().product());
            let mut out = Vec::with_capacity(rows.len() * row_bytes);
            for &src in rows {
                out.extend_from_slice(&bytes[src * row_bytes..(src + 1) * row_bytes]);
            }
            Cow::Owned(out)
        }
        None => Cow::Borrowed(bytes),
    }
}

/// Whether a GGUF tensor of `shape` read with `fix` keeps its blocks as a [`GgmlBlob`]: a
/// matrix whose values llama.cpp left unchanged.
fn keeps_blocks(shape: &[usize], fix: &Fix) -> bool {
    shape.len() == 2 && fix.values == Values::Same
}

impl Checkpoint {
    /// The blocks of the GGUF matrix `name` (shape `expected`, rows in Hugging Face order), not
    /// dequantized: the [`HostTensor::ggml`] that [`Checkpoint::tensor`] would give, without
    /// its f32 values (copying GGUF experts into slots or a store needs only the blocks).
    /// `None` where `tensor` keeps none (not a GGUF matrix, or values llama.cpp changed).
    pub fn ggml_blob(&self, name: &str, expected: &[usize]) -> Result<Option<GgmlBlob>> {
        self.check_shape(name, expected)?;
        let e = &self.entries[name];
        match e.dtype {
            StoredDtype::Ggml(t) if e.split_kv_b.is_none() && keeps_blocks(&e.shape, &e.fix) => {
                let bytes = &self.files[e.file].1[e.start..e.end];
                Ok(Some(GgmlBlob { ggml_type: t, bytes: rows_in_order(t, bytes, &e.shape, &e.fix).into_owned() }))
            }
            _ => Ok(None),
        }
    }
}

/// The blocks of a matrix of type `t` (rows of `bytes`, `shape` `[rows, cols]`) with its columns
/// moved as `cols` says (Hugging Face column `c` is stored column `cols[c]`), where they move in
/// whole blocks: every block of `t`'s width comes from one whole stored block. `None` otherwise.
/// `qwen35moe`'s `ssm_out` moves whole value heads (128 columns: 4 Q4_0 blocks), so it keeps
/// its type instead of being read as f32.
fn columns_in_blocks(t: GgmlType, bytes: &[u8], shape: &[usize], cols: &[usize]) -> Option<Vec<u8>> {
    let (&[rows, width], b) = (shape, t.block_size()) else { return None };
    if cols.len() != width || !width.is_multiple_of(b) {
        return None;
    }
    // The stored block each Hugging Face block comes from.
    let sources: Vec<usize> = (0..width / b)
        .map(|j| {
            let first = cols[j * b];
            let whole = first.is_multiple_of(b) && (0..b).all(|i| cols[j * b + i] == first + i);
            whole.then_some(first / b)
        })
        .collect::<Option<_>>()?;
    let (size, row_bytes) = (t.type_size(), t.row_bytes(width));
    let mut out = Vec::with_capacity(rows * row_bytes);
    for row in bytes.chunks_exact(row_bytes).take(rows) {
        for &s in &sources {
            out.extend_from_slice(&row[s * size..(s + 1) * size]);
        }
    }
    Some(out)
}

impl Checkpoint {
    /// `name` (shape `expected`) to upload and nothing else: a GGUF matrix that keeps its
    /// blocks as those blocks alone, its `data` left empty, else [`Checkpoint::tensor`]. The
    /// f32 values of a 248,320-row GGUF lm_head or embedding would be 2 GB each on the host.
    pub fn tensor_to_upload(&self, name: &str, expected: &[usize]) -> Result<HostTensor> {
        match self.ggml_blob(name, expected)? {
            Some(blob) => Ok(HostTensor { shape: expected.to_vec(), data: Vec::new(), int4: None, ggml: Some(blob) }),
            None => self.tensor(name, expected),
        }
    }
}

/// A GGUF tensor of type `t` (`bytes` from its first row), with llama.cpp's changes undone
/// (`fix`): dequantized, and for matrices whose columns stay in place (or move in whole
/// blocks) also kept as stored.
pub(super) fn ggml_tensor(t: GgmlType, bytes: &[u8], shape: &[usize], fix: &Fix) -> HostTensor {
    let bytes = rows_in_order(t, bytes, shape, fix);
    let mut data = crate::model::gguf::dequant::dequantize(t, &bytes);
    let ggml = match &fix.values {
        Values::Columns(cols) => columns_in_blocks(t, &bytes, shape, cols).map(|b| GgmlBlob { ggml_type: t, bytes: b }),
        _ => keeps_blocks(shape, fix).then(|| GgmlBlob { ggml_type: t, bytes: bytes.into_owned() }),
    };
    match &fix.values {
        Values::Same => {}
        Values::PlusOne => data.iter_mut().for_each(|v| *v -= 1.0),
        Values::NegExp => data.iter_mut().for_each(|v| *v = (-*v).ln()),
        Values::Columns(cols) => {
            let width = cols.len();
            data = data.chunks_exact(width).flat_map(|row| cols.iter().map(move |&c| row[c])).collect();
        }
    }
    HostTensor { shape: shape.to_vec(), data, int4: None, ggml }
}

/// The entry of `{block}.attn_k_b.weight` + `{block}.attn_v_b.weight` as Hugging Face's
/// `kv_b_proj` `[heads · (qk_nope + v_head), kv_lora_rank]`, with its name.
fn split_kv_b(
    model: &crate::model::gguf::GgufModel,
    block: &str,
    spec: &crate::model::ArchSpec,
) -> Result<(String, Entry)> {
    let (k_name, v_name) = (format!("{block}.attn_k_b.weight"), format!("{block}.attn_v_b.weight"));
    let k = model.info(&k_name).expect("listed tensors exist");
    let v = model.info(&v_name).ok_or_else(|| Error::MissingTensor(v_name.clone()))?;
    let layer: Option<usize> = block.strip_prefix("blk.").and_then(|i| i.parse().ok()).filter(|&i| i < spec.layers);
    let (Some(layer), &[heads, rank, nope], &[v_heads, v_head, v_rank]) = (layer, &k.shape[..], &v.shape[..]) else {
        return Err(Error::UnsupportedConfig(format!("GGUF tensors {k_name} {:?} / {v_name} {:?}", k.shape, v.shape)));
    };
    if (v_heads, v_rank) != (heads, rank) {
        return Err(Error::UnsupportedConfig(format!(
            "GGUF {k_name} {:?} and {v_name} {:?} disagree on heads or rank",
            k.shape, v.shape
        )));
    }
    let part = |n: &str| model.part_of(n).expect("listed tensors have a part");
    let v_part = SplitKvB {
        file: part(&v_name),
        start: v.offset,
        end: v.offset + v.bytes,
        ggml_type: v.ggml_type,
        heads,
        nope,
        v_head,
        rank,
    };
    let entry = Entry {
        file: part(&k_name),
        dtype: StoredDtype::Ggml(k.ggml_type),
        shape: vec![heads * (nope + v_head), rank],
        start: k.offset,
        end: k.offset + k.bytes,
        fix: Fix::default(),
        split_kv_b: Some(v_part),
    };
    Ok((format!("{}.self_attn.kv_b_proj.weight", crate::model::names::layer(layer)), entry))
}

/// `kv_b_proj` from llama.cpp's `attn_k_b` (`k`, type `t`, `[heads, rank, nope]`: each head's
/// key rows transposed) and `attn_v_b` (`[heads, v_head, rank]`): per head its `nope` key rows
/// then its `v_head` value rows, each `rank` wide (f32; MLA reads `kv_b_proj` in f32).
pub(super) fn joined_kv_b(t: GgmlType, k: &[u8], v: SplitKvB, v_bytes: &[u8]) -> HostTensor {
    let (k, vv) =
        (crate::model::gguf::dequant::dequantize(t, k), crate::model::gguf::dequant::dequantize(v.ggml_type, v_bytes));
    let (heads, rank, nope, v_head) = (v.heads, v.rank, v.nope, v.v_head);
    let mut data = Vec::with_capacity(heads * (nope + v_head) * rank);
    for h in 0..heads {
        for r in 0..nope {
            data.extend((0..rank).map(|c| k[(h * rank + c) * nope + r]));
        }
        data.extend_from_slice(&vv[h * v_head * rank..(h + 1) * v_head * rank]);
    }
    HostTensor::new(vec![heads * (nope + v_head), rank], data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q4_0 rows whose columns move in whole blocks keep their blocks, moved; a move within a
    /// block does not.
    #[test]
    fn columns_moved_in_whole_blocks_keep_their_blocks() {
        let (rows, width) = (2, 128);
        let bytes: Vec<u8> = (0..rows * GgmlType::Q4_0.row_bytes(width)).map(|i| (i * 7 % 251) as u8).collect();
        // Hugging Face column c is stored column cols[c]: swap the two halves of each row.
        let cols: Vec<usize> = (0..width).map(|c| (c + 64) % width).collect();
        let fix = Fix { rows: None, values: Values::Columns(cols.clone()) };
        let t = ggml_tensor(GgmlType::Q4_0, &bytes, &[rows, width], &fix);
        let blob = t.ggml.expect("whole blocks move");
        assert_eq!(crate::model::gguf::dequant::dequantize(GgmlType::Q4_0, &blob.bytes), t.data);
        let mut within = cols;
        within.swap(0, 1);
        assert!(columns_in_blocks(GgmlType::Q4_0, &bytes, &[rows, width], &within).is_none());
    }
}
