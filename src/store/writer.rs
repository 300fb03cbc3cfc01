//! [`StoreWriter`]: streams experts into a new `experts.bin`, one extent at a time.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::header::{encode_region, region_len, Extent, MAX_DIM};
use super::positioned::PositionedIo;
use super::{ExpertLayout, IndexEntry, StoreEncoding, StoreError, StoreInfo, EXTENT_ALIGN};

/// One expert's extent, encoded by [`StoreWriter::encode_expert`], not yet written.
#[derive(Debug)]
pub struct EncodedExpert {
    layer: usize,
    expert: usize,
    extent: Vec<u8>,
}

/// Writes an expert store. Memory use is bounded by the experts being encoded (their f32
/// inputs are the caller's; each [`EncodedExpert`] holds one extent until it is written).
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

    /// Encodes (quantizes) one expert of a uniform store and appends its extent:
    /// [`StoreWriter::encode_expert`] then [`StoreWriter::write_encoded`].
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
        let encoded = self.encode_expert(layer, expert, gate, up, down)?;
        self.write_encoded(encoded)
    }

    /// Encodes (quantizes) one expert of a uniform store into its extent without writing it,
    /// so that several threads can encode while one writes: the extent is the same whichever
    /// thread makes it. Arguments as in [`StoreWriter::write_expert`].
    pub fn encode_expert(
        &self,
        layer: usize,
        expert: usize,
        gate: &[f32],
        up: &[f32],
        down: &[f32],
    ) -> Result<EncodedExpert, StoreError> {
        let Some(layout) = self.extent.layout else {
            let detail = "a GGUF store holds the source's blocks: use write_ggml_expert".into();
            return Err(StoreError::InvalidSpec { path: self.path.clone(), detail });
        };
        self.index_of(layer, expert)?;
        let mut extent = vec![0; self.extent.extent_len];
        for ((name, p), w) in layout.projections().into_iter().zip([gate, up, down]) {
            layout.encoding.encode(w, p.rows, p.cols, &mut extent[p.offset..p.offset + p.len]).map_err(|source| {
                StoreError::Quant { context: format!("layer {layer} expert {expert} {name}"), source }
            })?;
        }
        Ok(EncodedExpert { layer, expert, extent })
    }

    /// Appends one expert of a GGUF store: `data` is its gate, up and down blobs as the GGUF
    /// file stores them, laid out by [`super::ggml_extent`] for the layer's types (exactly that
    /// data length), copied unchanged.
    pub fn write_ggml_expert(&mut self, layer: usize, expert: usize, data: &[u8]) -> Result<(), StoreError> {
        let i = self.index_of(layer, expert)?;
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
        let mut extent = vec![0; self.extent.extent_len];
        extent[..data.len()].copy_from_slice(data);
        self.write_encoded(EncodedExpert { layer, expert, extent })
    }

    /// Appends an extent made by [`StoreWriter::encode_expert`]; extents are laid out in the
    /// order they are written.
    pub fn write_encoded(&mut self, encoded: EncodedExpert) -> Result<(), StoreError> {
        let EncodedExpert { layer, expert, extent } = encoded;
        let i = self.index_of(layer, expert)?;
        if self.index[i].is_some() {
            return Err(StoreError::DuplicateExpert { path: self.path.clone(), layer, expert });
        }
        let offset = self.next_offset;
        self.file.write_all_at(&extent, offset).map_err(|e| StoreError::io(&self.partial, e))?;
        self.index[i] = Some(IndexEntry { offset, length: extent.len() as u64, crc32: crc32fast::hash(&extent) });
        self.next_offset += extent.len() as u64;
        Ok(())
    }

    /// The index entry of (`layer`, `expert`), or [`StoreError::IndexOutOfRange`].
    fn index_of(&self, layer: usize, expert: usize) -> Result<usize, StoreError> {
        let slot = self
            .info
            .layers
            .iter()
            .position(|&l| l as usize == layer)
            .filter(|_| expert < self.info.experts_per_layer)
            .ok_or_else(|| StoreError::IndexOutOfRange { path: self.path.clone(), layer, expert })?;
        Ok(slot * self.info.experts_per_layer + expert)
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
