//! Where routed experts come from: a Hugging Face checkpoint (encoded on the fly into the slot
//! format) or the expert store `experts.bin` (copied as stored). Both yield the exact bytes of
//! one slot, so resident and streamed runs see identical weights.

use std::sync::Arc;

use super::arena::SlotLayout;
use crate::error::{Error, Result};
use crate::model::layer_weights;
use crate::model::{ArchSpec, Checkpoint};
use crate::ops::matrix::naming;
use crate::ops::WeightFormat;
use crate::store::ExpertStore;

/// Reads one expert's slot bytes; shared by the loader and the I/O threads.
pub trait ExpertSource: Send + Sync {
    /// Fills `buf` (at least [`ExpertSource::read_len`] bytes) with expert `expert` of model
    /// layer `layer`, laid out as [`SlotLayout`] describes.
    fn read(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()>;
    /// Bytes one read needs in its buffer (the store's 4 KiB-padded extent, or one slot).
    fn read_len(&self) -> usize;
    /// Bytes one read takes from disk.
    fn disk_bytes(&self) -> u64;
    /// The slot layout the bytes follow.
    fn layout(&self) -> SlotLayout;
}

/// Experts read from a checkpoint and encoded per read.
pub struct CheckpointExperts {
    ckpt: Arc<Checkpoint>,
    spec: ArchSpec,
    layout: SlotLayout,
}

impl CheckpointExperts {
    /// Experts of `ckpt` encoded in `layout`.
    pub fn new(ckpt: Arc<Checkpoint>, spec: ArchSpec, layout: SlotLayout) -> Self {
        CheckpointExperts { ckpt, spec, layout }
    }
}

impl ExpertSource for CheckpointExperts {
    fn read(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()> {
        let w = layer_weights::expert(&self.ckpt, &self.spec, layer, expert)?;
        let formats = [0, 1, 2].map(|i| self.layout.proj_format(i));
        let stored = [(&w.gate, formats[0]), (&w.up, formats[1]), (&w.down, formats[2])]
            .map(|(t, f)| t.ggml.as_ref().filter(|g| WeightFormat::of_ggml(g.ggml_type) == f).map(|g| &g.bytes[..]));
        let int4 = [(&w.gate, formats[0]), (&w.up, formats[1]), (&w.down, formats[2])]
            .map(|(t, f)| t.int4.as_ref().filter(|m| WeightFormat::Int4(m.params) == f));
        let bytes = match (stored, int4) {
            // GGUF experts in the slot's format are copied as stored.
            ([Some(g), Some(u), Some(d)], _) => self.layout.place([g, u, d]),
            // So are int4 experts (MLX checkpoints): blobs written as they are, not re-quantized.
            (_, [Some(g), Some(u), Some(d)]) => {
                let blobs = [g, u, d].map(|m| {
                    let mut blob = vec![0u8; WeightFormat::Int4(m.params).blob_bytes(m.rows, m.cols)?];
                    m.write_into(&mut blob).map_err(|e| Error::UnsupportedConfig(e.to_string()))?;
                    Ok::<_, Error>(blob)
                });
                let [g, u, d] = blobs;
                self.layout.place([&g?, &u?, &d?])
            }
            _ => self
                .layout
                .encode(&w.gate.data, &w.up.data, &w.down.data)
                .map_err(|e| naming(&format!("layer {layer} expert {expert}"), e))?,
        };
        buf[..bytes.len()].copy_from_slice(&bytes);
        Ok(())
    }

    fn read_len(&self) -> usize {
        self.layout.slot_bytes
    }

    fn disk_bytes(&self) -> u64 {
        (self.spec.expert_params() * 2) as u64
    }

    fn layout(&self) -> SlotLayout {
        self.layout
    }
}

/// Experts read from `experts.bin` with pread (optionally O_DIRECT), checksum-verified.
pub struct StoreExperts {
    store: ExpertStore,
    layout: SlotLayout,
}

impl StoreExperts {
    /// Wraps an opened store whose experts are `hidden` × `inter`.
    pub fn new(store: ExpertStore, hidden: usize, inter: usize) -> Result<Self> {
        let l = store.layout();
        let format = crate::ops::WeightFormat::from_encoding(l.encoding);
        let layout = SlotLayout::new(format, hidden, inter)?;
        if l.hidden != hidden || l.intermediate != inter || layout.slot_bytes != l.data_len {
            return Err(Error::InvalidArgument(format!(
                "{}: experts are {}x{}, the model needs {hidden}x{inter}",
                store.path().display(),
                l.hidden,
                l.intermediate
            )));
        }
        Ok(StoreExperts { store, layout })
    }

    /// The underlying store.
    pub fn store(&self) -> &ExpertStore {
        &self.store
    }
}

impl ExpertSource for StoreExperts {
    fn read(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()> {
        Ok(self.store.read_expert(layer, expert, buf)?)
    }

    fn read_len(&self) -> usize {
        self.store.extent_len()
    }

    fn disk_bytes(&self) -> u64 {
        self.store.extent_len() as u64
    }

    fn layout(&self) -> SlotLayout {
        self.layout
    }
}
