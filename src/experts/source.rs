//! Where routed experts come from: a Hugging Face checkpoint (encoded on the fly into the slot
//! format) or the expert store `experts.bin` (copied as stored, or a GGUF store's Q4_0 and Q6_K
//! blocks restaged into the kernels' aligned formats). Both yield the exact bytes of one slot,
//! so resident and streamed runs see identical weights.

use std::sync::Arc;

use super::arena::SlotLayout;
use crate::error::{Error, Result};
use crate::model::{gpt_oss_weights, layer_weights};
use crate::model::{ArchSpec, Checkpoint, Family};
use crate::ops::matrix::naming;
use crate::ops::WeightFormat;
use crate::quant::GgmlType;
use crate::store::{ExpertStore, StoreEncoding};

/// Reads one expert's slot bytes; shared by the loader and the I/O threads.
pub trait ExpertSource: Send + Sync {
    /// Fills `buf` (at least [`ExpertSource::read_len`] bytes) with expert `expert` of model
    /// layer `layer`, laid out as [`SlotLayout`] describes.
    fn read(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()>;
    /// Bytes one read needs in its buffer (the store's 4 KiB-padded extent, or one slot).
    fn read_len(&self) -> usize;
    /// Bytes one read takes from disk.
    fn disk_bytes(&self) -> u64;
    /// The slot layout of the arena: the largest layer's (every layer's slot fits in it).
    fn layout(&self) -> SlotLayout;
    /// The slot layout expert bytes of model layer `layer` follow (GGUF experts may change
    /// ggml types between layers; otherwise [`ExpertSource::layout`]).
    fn layer_layout(&self, layer: usize) -> SlotLayout;
}

/// The largest of `layouts` (by slot bytes), the arena's layout.
fn widest(layouts: impl Iterator<Item = SlotLayout>) -> Option<SlotLayout> {
    layouts.max_by_key(|l| l.slot_bytes)
}

/// The slot bytes in `layout` of an expert whose three projections' GGUF bytes `blobs` are
/// stored in `formats`: placed as they are where `layout` holds those formats, else restaged
/// into the ones it holds ([`SlotLayout::restage`]).
fn place_gguf(layout: &SlotLayout, formats: [WeightFormat; 3], blobs: [&[u8]; 3]) -> Result<Vec<u8>> {
    if formats[0] != formats[1] {
        return Err(Error::UnsupportedConfig(format!(
            "expert gate in {} and up in {}: one slot format holds both",
            formats[0].name(),
            formats[1].name()
        )));
    }
    let stored = SlotLayout::mixed(formats[0], formats[2], layout.hidden, layout.inter)?;
    let placed = stored.place(blobs);
    if stored == *layout {
        return Ok(placed);
    }
    let mut bytes = vec![0u8; layout.slot_bytes];
    layout.restage(&stored, &placed, &mut bytes)?;
    Ok(bytes)
}

/// Experts read from a checkpoint and encoded per read.
pub struct CheckpointExperts {
    ckpt: Arc<Checkpoint>,
    spec: ArchSpec,
    layout: SlotLayout,
    /// Per model layer, its own layout where it differs from `layout` (GGUF experts).
    layers: Vec<Option<SlotLayout>>,
}

impl CheckpointExperts {
    /// Experts of `ckpt` encoded in `layout`.
    pub fn new(ckpt: Arc<Checkpoint>, spec: ArchSpec, layout: SlotLayout) -> Self {
        CheckpointExperts { ckpt, spec, layout, layers: Vec::new() }
    }

    /// Experts of `ckpt` whose model layer `i` is laid out as `layers[i]` (one per model
    /// layer; `None` for layers without routed experts). Fails when no layer has experts.
    pub fn per_layer(ckpt: Arc<Checkpoint>, spec: ArchSpec, layers: Vec<Option<SlotLayout>>) -> Result<Self> {
        let layout = widest(layers.iter().flatten().copied())
            .ok_or_else(|| Error::InvalidArgument("no layer has routed experts".into()))?;
        Ok(CheckpointExperts { ckpt, spec, layout, layers })
    }

    /// The slot bytes of GGUF expert (`layer`, `expert`) when `layout` holds its three matrices
    /// in their own format (or one the GPU reads them in): their blocks copied as stored (or
    /// restaged), never dequantized. `None` for other experts.
    fn gguf_as_stored(&self, layout: &SlotLayout, layer: usize, expert: usize) -> Result<Option<Vec<u8>>> {
        let names = crate::model::names::expert(self.spec.family, layer, expert);
        let Some(m) = self.spec.moe.as_ref().filter(|_| self.ckpt.contains(&names[0])) else {
            return Ok(None);
        };
        let (h, inter) = (self.spec.hidden, m.expert_intermediate);
        let mut blobs = Vec::with_capacity(3);
        for (i, (name, shape)) in names.iter().zip([[inter, h], [inter, h], [h, inter]]).enumerate() {
            match self.ckpt.ggml_blob(name, &shape)? {
                Some(b) if layout.proj_format(i).is_gpu_form_of(WeightFormat::of_ggml(b.ggml_type)) => blobs.push(b),
                _ => return Ok(None),
            }
        }
        let [g, u, d] = [&blobs[0], &blobs[1], &blobs[2]];
        let formats = [g, u, d].map(|b| WeightFormat::of_ggml(b.ggml_type));
        place_gguf(layout, formats, [&g.bytes, &u.bytes, &d.bytes]).map(Some)
    }
}

impl ExpertSource for CheckpointExperts {
    fn read(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()> {
        let layout = self.layer_layout(layer);
        // gpt-oss's MXFP4 experts in MXFP4 slots: their bytes, never dequantized.
        let mxfp4 = WeightFormat::of_ggml(GgmlType::Mxfp4);
        if self.spec.family == Family::GptOss
            && [layout.format, layout.down_format].iter().all(|f| f.is_gpu_form_of(mxfp4))
        {
            if let Some([g, u, d]) = gpt_oss_weights::mxfp4_expert_bytes(&self.ckpt, &self.spec, layer, expert)? {
                let bytes = place_gguf(&layout, [mxfp4; 3], [&g, &u, &d])?;
                buf[..bytes.len()].copy_from_slice(&bytes);
                return Ok(());
            }
        }
        if let Some(bytes) = self.gguf_as_stored(&layout, layer, expert)? {
            buf[..bytes.len()].copy_from_slice(&bytes);
            return Ok(());
        }
        let w = layer_weights::expert(&self.ckpt, &self.spec, layer, expert)?;
        let formats = [0, 1, 2].map(|i| layout.proj_format(i));
        let int4 = [(&w.gate, formats[0]), (&w.up, formats[1]), (&w.down, formats[2])]
            .map(|(t, f)| t.int4.as_ref().filter(|m| WeightFormat::Int4(m.params) == f));
        let bytes = match int4 {
            // Int4 experts (MLX checkpoints): blobs written as they are, not re-quantized.
            [Some(g), Some(u), Some(d)] => {
                let blobs = [g, u, d].map(|m| {
                    let mut blob = vec![0u8; WeightFormat::Int4(m.params).blob_bytes(m.rows, m.cols)?];
                    m.write_into(&mut blob).map_err(|e| Error::UnsupportedConfig(e.to_string()))?;
                    Ok::<_, Error>(blob)
                });
                let [g, u, d] = blobs;
                layout.place([&g?, &u?, &d?])
            }
            _ => layout
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

    fn layer_layout(&self, layer: usize) -> SlotLayout {
        self.layers.get(layer).copied().flatten().unwrap_or(self.layout)
    }
}

/// A GGUF store layer's two layouts: its extents' (the file's blocks) and its slots'
/// ([`SlotLayout::for_gpu`]).
#[derive(Clone, Copy)]
struct StoredLayer {
    stored: SlotLayout,
    slot: SlotLayout,
}

thread_local! {
    /// A copy of the extent being restaged into slot bytes in the read buffer itself (which
    /// keeps the buffer's alignment for uncached reads).
    static RESTAGING: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Experts read from `experts.bin` with pread (optionally O_DIRECT), checksum-verified. A GGUF
/// store's Q4_0 and Q6_K experts are restaged as read into the formats the kernels read best
/// ([`WeightFormat::for_gpu`]); the others are copied as stored.
pub struct StoreExperts {
    store: ExpertStore,
    layout: SlotLayout,
    /// Per model layer, its own layouts (GGUF stores; empty for uniform ones).
    layers: Vec<Option<StoredLayer>>,
}

impl StoreExperts {
    /// Wraps an opened store whose experts are `hidden` × `inter`.
    pub fn new(store: ExpertStore, hidden: usize, inter: usize) -> Result<Self> {
        let info = store.info();
        if info.hidden != hidden || info.intermediate != inter {
            return Err(Error::InvalidArgument(format!(
                "{}: experts are {}x{}, the model needs {hidden}x{inter}",
                store.path().display(),
                info.hidden,
                info.intermediate
            )));
        }
        let mut layers = Vec::new();
        let (stored, layout) = match &info.encoding {
            StoreEncoding::Uniform(e) => {
                let layout = SlotLayout::new(WeightFormat::from_encoding(*e), hidden, inter)?;
                (layout, layout)
            }
            StoreEncoding::Ggml(types) => {
                for (&layer, [gate_up, down]) in info.layers.iter().zip(types) {
                    let (f, d) = (WeightFormat::of_ggml(*gate_up), WeightFormat::of_ggml(*down));
                    let stored = SlotLayout::mixed(f, d, hidden, inter)?;
                    let layer = layer as usize;
                    layers.resize(layers.len().max(layer + 1), None);
                    layers[layer] = Some(StoredLayer { stored, slot: stored.for_gpu()? });
                }
                let widest_of = |f: fn(&StoredLayer) -> SlotLayout| {
                    widest(layers.iter().flatten().map(f)).expect("a store has at least one layer")
                };
                (widest_of(|l| l.stored), widest_of(|l| l.slot))
            }
        };
        // The store's extents hold exactly these experts (a layout disagreeing with the store's
        // would read the wrong bytes).
        if stored.slot_bytes != store.data_len() {
            return Err(Error::InvalidArgument(format!(
                "{}: extents hold {} bytes of data, the experts of {} need {}",
                store.path().display(),
                store.data_len(),
                stored.format_name(),
                stored.slot_bytes
            )));
        }
        Ok(StoreExperts { store, layout, layers })
    }

    /// The underlying store.
    pub fn store(&self) -> &ExpertStore {
        &self.store
    }
}

impl ExpertSource for StoreExperts {
    fn read(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()> {
        if buf.len() < self.read_len() {
            return Err(Error::InvalidArgument(format!(
                "an expert read needs {} bytes of buffer, got {}",
                self.read_len(),
                buf.len()
            )));
        }
        self.store.read_expert(layer, expert, buf)?;
        match self.layers.get(layer).copied().flatten().filter(|l| l.stored != l.slot) {
            None => Ok(()),
            Some(l) => RESTAGING.with_borrow_mut(|extent| {
                extent.clear();
                extent.extend_from_slice(&buf[..l.stored.slot_bytes]);
                l.slot.restage(&l.stored, extent, &mut buf[..l.slot.slot_bytes])?;
                buf[l.slot.slot_bytes..self.layout.slot_bytes].fill(0);
                Ok(())
            }),
        }
    }

    fn read_len(&self) -> usize {
        self.store.extent_len().max(self.layout.slot_bytes)
    }

    fn disk_bytes(&self) -> u64 {
        self.store.extent_len() as u64
    }

    fn layout(&self) -> SlotLayout {
        self.layout
    }

    fn layer_layout(&self, layer: usize) -> SlotLayout {
        self.layers.get(layer).copied().flatten().map_or(self.layout, |l| l.slot)
    }
}
