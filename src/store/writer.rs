//! [`StoreWriter`]: streams experts into a new `experts.bin`, one extent at a time.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::header::{encode_region, region_len, Extent, MAX_DIM};
use super::positioned::PositionedIo;
use super::{ExpertLayout, IndexEntry, StoreEncoding, StoreError, StoreInfo, EXTENT_ALIGN};

/// Writes an expert store. Memory use is bounded by one expert (its f32 inputs are the
/// caller's; the writer holds one extent buffer and one quantized projection at a time).
///
/// Data goes to `<path>.partial`, renamed to `path` by [`StoreWriter::finish`]; a writer
/// dropped without finishing removes the partial file, so `path` never holds half a store.
#[derive(Debug)]
pub struct StoreWriter {
    path: PathBuf,
    partial: PathBuf,
    file: File,
    info: StoreInfo,
    extent: Extent,
    data_offset: u64,
    next_offset: u64,
    index: Vec<Option<IndexEntry>>,
    buf: Vec<u8>,
    finished: bool,
}

impl StoreWriter {
    /// Starts a store at `path` for the experts described by `info`.
    ///
    /// Fails if `info` is inconsistent (no layers or experts, duplicate layers, shapes the
    /// encoding cannot hold) or the file cannot be created.
    pub fn create(path: impl AsRef<Path>, info: StoreInfo) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let invalid = |detail: String| StoreError::InvalidSpec { path: path.clone(), detail };
        if info.layers.is_empty() || info.experts_per_layer == 0 {
            return Err(invalid("a store needs at least one layer and one expert".into()));
        }
        if info.experts_per_layer > u32::MAX as usize || info.layers.len() > u32::MAX as usize {
            return Err(invalid("too many layers or experts".into()));
        }
        if info.hidden > MAX_DIM || info.intermediate > MAX_DIM {
            return Err(invalid(format!("hidden/intermediate sizes above {MAX_DIM}")));
        }
        let mut sorted = info.layers.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(format!("layer {} listed twice", w[0])));
        }
        if let StoreEncoding::Uniform(e) = info.encoding {
            // The quantizer's own error for shapes an encoding cannot hold.
            ExpertLayout::new(e, info.hidden, info.intermediate).map_err(|source| StoreError::Quant {
                context: format!("expert shape for {}", path.display()),
                source,
            })?;
        }
        let extent = Extent::of(&info).map_err(invalid)?;
        let ggml = matches!(info.encoding, StoreEncoding::Ggml(_));
        let region = region_len(info.layers.len() as u64, info.experts_per_layer as u64, ggml) as u64;
        let data_offset = region.div_ceil(EXTENT_ALIGN as u64) * EXTENT_ALIGN as u64;
        let mut partial = path.clone().into_os_string();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let file = File::create(&partial).map_err(|e| StoreError::io(&partial, e))?;
        let count = info.layers.len() * info.experts_per_layer;
        Ok(StoreWriter {
            buf: vec![0; extent.extent_len],
            path,
            partial,
            file,
            info,
            extent,
            data_offset,
            next_offset: data_offset,
            index: vec![None; count],
            finished: false,
        })
    }

    /// The per-expert layout every extent of a uniform store follows (`None` for GGUF stores).
    pub fn layout(&self) -> Option<&ExpertLayout> {
        self.extent.layout.as_ref()
    }

    /// The index position of (model `layer`, `expert`), not yet written.
    fn position(&self, layer: usize, expert: usize) -> Result<usize, StoreError> {
        let slot = self
            .info
            .layers
            .iter()
            .position(|&l| l as usize == layer)
            .filter(|_| expert < self.info.experts_per_layer)
            .ok_or_else(|| StoreError::IndexOutOfRange { path: self.path.clone(), layer, expert })?;
        let i = slot * self.info.experts_per_layer + expert;
        if self.index[i].is_some() {
            return Err(StoreError::DuplicateExpert { path: self.path.clone(), layer, expert });
        }
        Ok(i)
    }

    /// Encodes (quantizes) one expert of a uniform store and appends its extent.
    ///
    /// `layer` is a model layer index listed in `info.layers`; `gate` and `up` are row-major
    /// `[intermediate, hidden]`, `down` is `[hidden, intermediate]`. Experts may come in any
    /// order; each exactly once. A GGUF store takes [`StoreWriter::write_ggml_expert`] instead.
    pub fn write_expert(
        &mut self,
        layer: usize,
        expert: usize,
        gate: &[f32],
        up: &[f32],
        down: &[f32],
    ) -> Result<(), StoreError> {
        let Some(layout) = self.extent.layout else {
            let detail = "a GGUF store holds the source's blocks: use write_ggml_expert".into();
            return Err(StoreError::InvalidSpec { path: self.path.clone(), detail });
        };
        let i = self.position(layer, expert)?;
        self.buf.fill(0);
        for ((name, p), w) in layout.projections().into_iter().zip([gate, up, down]) {
            layout.encoding.encode(w, p.rows, p.cols, &mut self.buf[p.offset..p.offset + p.len]).map_err(|source| {
                StoreError::Quant { context: format!("layer {layer} expert {expert} {name}"), source }
            })?;
        }
        self.append(i)
    }

    /// Appends one expert of a GGUF store: `data` is its gate, up and down blobs as the GGUF
    /// file stores them, laid out by [`super::ggml_extent`] for the layer's types (exactly that
    /// data length), copied unchanged.
    pub fn write_ggml_expert(&mut self, layer: usize, expert: usize, data: &[u8]) -> Result<(), StoreError> {
        let i = self.position(layer, expert)?;
        let StoreEncoding::Ggml(types) = &self.info.encoding else {
            let detail = "only a GGUF store takes ggml blocks".into();
            return Err(StoreError::InvalidSpec { path: self.path.clone(), detail });
        };
        let types = types[i / self.info.experts_per_layer];
        let expected = super::ggml_extent(types, self.info.hidden, self.info.intermediate).map(|(_, len)| len);
        if expected != Some(data.len()) {
            let detail = format!("layer {layer} expert {expert}: {} bytes, its types need {expected:?}", data.len());
            return Err(StoreError::InvalidSpec { path: self.path.clone(), detail });
        }
        self.buf.fill(0);
        self.buf[..data.len()].copy_from_slice(data);
        self.append(i)
    }

    /// Writes the extent in the buffer as index entry `i`.
    fn append(&mut self, i: usize) -> Result<(), StoreError> {
        let offset = self.next_offset;
        self.file.write_all_at(&self.buf, offset).map_err(|e| StoreError::io(&self.partial, e))?;
        self.index[i] = Some(IndexEntry { offset, length: self.buf.len() as u64, crc32: crc32fast::hash(&self.buf) });
        self.next_offset += self.buf.len() as u64;
        Ok(())
    }

    /// Writes the header and index, syncs, and renames the file into place.
    ///
    /// Fails with [`StoreError::Incomplete`] if any (layer, expert) was not written.
    pub fn finish(mut self) -> Result<(), StoreError> {
        let e = self.info.experts_per_layer;
        let missing: Vec<usize> = (0..self.index.len()).filter(|&i| self.index[i].is_none()).collect();
        if let Some(&first) = missing.first() {
            return Err(StoreError::Incomplete {
                path: self.path.clone(),
                missing: missing.len(),
                layer: self.info.layers[first / e] as usize,
                expert: first % e,
            });
        }
        let index: Vec<IndexEntry> = self.index.iter().map(|x| x.expect("all written")).collect();
        let region = encode_region(&self.info, &self.extent, self.data_offset, &index);
        let io = |e| StoreError::io(&self.partial, e);
        self.file.write_all_at(&region, 0).map_err(io)?;
        self.file.set_len(self.next_offset).map_err(io)?;
        self.file.sync_all().map_err(io)?;
        std::fs::rename(&self.partial, &self.path).map_err(|e| StoreError::io(&self.path, e))?;
        self.finished = true;
        Ok(())
    }
}

impl Drop for StoreWriter {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}
