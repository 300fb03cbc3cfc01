//! One sequence's state on the GPU: every layer's cache, and the kernels bound to it (the
//! store of the step's keys/values and the attention that reads them). Several sequences may
//! exist at once; a step runs on one of them. Everything else a step touches (weights,
//! activations, the split-attention partials) is shared, since steps run one at a time.
//!
//! Each layer's cache is a [`LayerCache`], one variant per attention kind: grouped keys/values,
//! MLA's latent cache, and Gated DeltaNet's fixed-size state (conv window + recurrent state).
//! A sliding-window layer keeps a ring of its window and a step
//! ([`crate::model::CacheShape::positions`]) unless the options keep every position.
//!
//! What can be rolled back: keys and values of full layers, always (a step writes over what
//! it replaces); a ring, while it still holds the window before the step (a step at `pos`
//! needs the keys of `pos + 1 - window .. pos`, and the ring has since written as far as the
//! furthest step reached); a recurrent state, only to one of its snapshots
//! (`super::state_copy`, put back by [`SequenceCache::resume_point`]): a step must continue
//! where the state ends. Anything else starts the sequence again at position 0 (which zeroes
//! the states).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::kv_ledger::KvLedger;
use super::ring::Ring;
use super::{Attn, GpuModel};
use crate::error::{Error, Result};
use crate::gpu::context::counting_allocations;
use crate::gpu::{Gpu, Pass};
use crate::model::{ArchSpec, CacheShape, MlaCacheKind, MlaSpec};
use crate::ops::attention::{is_split, Attention, AttentionIo, Heads, KeyRange};
use crate::ops::causal_conv1d::{CausalConv1d, ConvShape};
use crate::ops::gated_delta_rule::{ChunkScratch, DeltaIo, GatedDeltaRule};
use crate::ops::kv_store::{KvChunk, KvDtype, KvStore, StoreRope};
use crate::ops::mla_attention::{DecompressedCache, LatentCache, MlaAttention, MlaCacheView, MlaIo};
use crate::ops::mla_decompress::{DecompressIn, MlaDecompress};

/// A sequence's caches for every layer, bound to the model that made it
/// ([`GpuModel::new_cache`]).
pub struct SequenceCache {
    id: u64,
    pub(super) layers: Vec<LayerCache>,
    /// What the buffers took: reserved from the ledger and counted on `gpu`, both given back
    /// on drop.
    pub(super) bytes: AtomicU64,
    pub(super) ledger: Arc<KvLedger>,
    /// The context the caches were allocated on.
    pub(super) gpu: Arc<Gpu>,
    /// Positions the linear-attention states hold (`usize::MAX` after a failed step: unknown).
    pub(super) state_len: AtomicUsize,
    /// The sliding windows of the rings shorter than the context, with their positions.
    rings: Vec<Ring>,
    /// The linear-attention states' saved copy (`super::state_copy`), made when first needed.
    pub(super) saved: OnceLock<super::state_copy::StateCopy>,
    /// Snapshots of the linear-attention states (`super::state_copy`), at most `snapshot_limit`.
    pub(super) snapshots: Mutex<Vec<super::state_copy::Snapshot>>,
    pub(super) snapshot_limit: usize,
    /// One past the furthest position any step wrote since the sequence last started at 0
    /// (what the rings have overwritten follows from it).
    written_end: AtomicUsize,
    /// The next (or last) step runs draft tokens keeping each token's linear-attention states
    /// (`super::draft_states`), until it is cut back.
    pub(super) draft_states_armed: AtomicBool,
}

/// One layer's sequence state, by attention kind.
pub enum LayerCache {
    /// Grouped-query attention (MHA, GQA, MQA): keys and values of every position.
    Grouped(GroupedCache),
    /// Multi-head latent attention: the latent and the shared rotary key of every position.
    Mla(MlaCache),
    /// Gated DeltaNet: the conv window and the recurrent state after the last position.
    Linear(LinearCache),
}

/// One Gated DeltaNet layer's state, f32: the conv window `[conv_dim, kernel - 1]` and the
/// recurrent state `[v_heads, dk, dv]`, with the conv and the delta rule bound to them.
pub struct LinearCache {
    conv: CausalConv1d,
    delta: GatedDeltaRule,
    pub(super) window: wgpu::Buffer,
    pub(super) state: wgpu::Buffer,
    /// The conv and rule that keep each token's states, for steps of draft tokens
    /// (`super::draft_states`), made at the first such step.
    pub(super) draft: OnceLock<Box<super::draft_states::DraftStates>>,
}

/// Keys and values of one grouped-attention layer, split by KV heads into chunks that each fit
/// a binding, with the kernels writing and reading them.
pub struct GroupedCache {
    chunks: Vec<GroupedChunk>,
}

/// The cache of one MLA layer, in the KV dtype (`--kv-dtype`, f16 by default): normalised
/// latents `[context, kv_lora_rank]` and rotated rotary keys `[context, qk_rope_head_dim]`
/// (absorbed attention), or with [`MlaCacheKind::Decompressed`] every head's keys and values;
/// with the store of the step's rows (`acts.k`, `acts.v`) and the attention reading them.
pub struct MlaCache {
    store: MlaStore,
    attention: MlaAttention,
    buffers: [wgpu::Buffer; 2],
}

/// How a step's latent gets into an MLA cache.
enum MlaStore {
    /// Copied (and converted to the cache's element type).
    Latent(KvStore),
    /// Decompressed into every head's key and value.
    Decompressed(MlaDecompress),
}

struct GroupedChunk {
    store: KvStore,
    attention: Attention,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
}

impl SequenceCache {
    /// Identifies the sequence (unique within the process).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// GPU bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    pub(super) fn layer(&self, i: usize) -> &LayerCache {
        &self.layers[i]
    }

    pub(super) fn has_linear_state(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerCache::Linear(_)))
    }

    /// Checks that a step of `n` tokens at `pos` can run on the sequence's rings and
    /// linear-attention states (it finds the window it needs, continues the states, or starts
    /// again at 0: then they are zeroed), records how far it writes, and marks the states
    /// unknown until [`SequenceCache::end_step`].
    pub(super) fn begin_step(&self, gpu: &Gpu, pos: usize, n: usize) -> Result<()> {
        let written = self.written_end.load(Ordering::Acquire);
        if let Some(r) = self.ring_written_over(pos).filter(|_| pos > 0) {
            return Err(Error::InvalidArgument(format!(
                "a step at position {pos} needs keys that a sliding-window ring of {} positions has written over (it reached position {written}): restart the sequence at 0",
                r.positions
            )));
        }
        self.check_linear_state(gpu, pos)?;
        self.free_snapshots_past(pos);
        let end = if pos == 0 { pos + n } else { written.max(pos + n) };
        self.written_end.store(end, Ordering::Release);
        Ok(())
    }

    /// A ring that no longer holds the window a step at `pos` needs, if any.
    fn ring_written_over(&self, pos: usize) -> Option<Ring> {
        let written = self.written_end.load(Ordering::Acquire);
        self.rings.iter().find(|r| !r.holds_window_before(pos, written)).copied()
    }

    /// [`SequenceCache::begin_step`]'s linear-attention part.
    fn check_linear_state(&self, gpu: &Gpu, pos: usize) -> Result<()> {
        if !self.has_linear_state() {
            return Ok(());
        }
        let held = self.state_len.load(Ordering::Acquire);
        if pos == 0 && held != 0 {
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            for l in &self.layers {
                if let LayerCache::Linear(c) = l {
                    encoder.clear_buffer(&c.window, 0, None);
                    encoder.clear_buffer(&c.state, 0, None);
                }
            }
            gpu.queue.submit([encoder.finish()]);
        } else if pos != held {
            return Err(Error::InvalidArgument(format!(
                "a step at position {pos} on linear-attention states that hold {}: they cannot be rolled back, only continued or restarted at 0",
                if held == usize::MAX { "an unknown number of positions".to_string() } else { format!("{held} positions") }
            )));
        }
        self.state_len.store(usize::MAX, Ordering::Release);
        Ok(())
    }

    /// Records that the linear-attention states now hold `len` positions (also how a benchmark
    /// takes them as holding positions it did not compute, whose values a step's cost does
    /// not depend on).
    pub(crate) fn end_step(&self, len: usize) {
        self.state_len.store(len, Ordering::Release);
    }

    /// Where a sequence whose first `cached` positions are wanted from the cache can resume:
    /// `cached`; where linear-attention states hold other positions, the latest snapshot of
    /// them at or before `cached` (put back now); else 0 (the sequence is recomputed, and the
    /// log says why), also when a ring no longer holds the window before the point.
    pub fn resume_point(&self, cached: usize) -> usize {
        if cached == 0 {
            return 0;
        }
        let states_held = !self.has_linear_state() || self.state_len.load(Ordering::Acquire) == cached;
        let why = match (states_held, self.ring_written_over(cached)) {
            (true, None) => return cached,
            (false, _) => match self.restore_snapshot(cached, |p| self.ring_written_over(p).is_none()) {
                Some(p) => {
                    log::info!("resuming a sequence at position {cached}: from a snapshot of its linear-attention states at {p}");
                    return p;
                }
                None => "linear-attention states hold other positions and no snapshot of them fits".to_string(),
            },
            (true, Some(r)) => format!(
                "its sliding-window ring of {} positions has written over the keys before it (pass --swa-full to keep every position)",
                r.positions
            ),
        };
        log::warn!("resuming a sequence at position {cached} recomputes it from position 0: {why}");
        0
    }
}

impl LayerCache {
    /// The buffers holding the sequence's state.
    fn buffers(&self) -> Vec<&wgpu::Buffer> {
        match self {
            LayerCache::Grouped(g) => g.chunks.iter().flat_map(|c| [&c.k, &c.v]).collect(),
            LayerCache::Mla(m) => m.buffers.iter().collect(),
            LayerCache::Linear(l) => vec![&l.window, &l.state],
        }
    }
}

impl GpuModel {
    /// Makes `to` hold what `from` holds (a sequence forked: `n` choices of one prompt
    /// prefilled once), by copies on the GPU; both must be this model's.
    pub fn copy_cache(&self, from: &SequenceCache, to: &SequenceCache) -> Result<()> {
        if !self.owns(from) || !self.owns(to) || from.id == to.id {
            return Err(Error::InvalidArgument("a cache copy needs two distinct caches of this model".into()));
        }
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        for (a, b) in from.layers.iter().zip(&to.layers) {
            for (src, dst) in a.buffers().into_iter().zip(b.buffers()) {
                encoder.copy_buffer_to_buffer(src, 0, dst, 0, src.size());
            }
        }
        self.gpu.queue.submit([encoder.finish()]);
        to.state_len.store(from.state_len.load(Ordering::Acquire), Ordering::Release);
        to.free_snapshots_past(0);
        to.written_end.store(from.written_end.load(Ordering::Acquire), Ordering::Release);
        Ok(())
    }
}

impl Drop for SequenceCache {
    fn drop(&mut self) {
        self.ledger.release(self.bytes());
        self.gpu.release_allocation(self.bytes());
    }
}

impl LayerCache {
    /// Records the store of the step's keys/values and the attention of its queries (`kv_len`
    /// keys after the step); a linear layer keeps each token's states where
    /// `keep_token_states` (a step of draft tokens, `super::draft_states`).
    pub(super) fn record(&self, gpu: &Gpu, pass: &mut Pass, n: usize, kv_len: usize, keep_token_states: bool) {
        match self {
            LayerCache::Grouped(g) => {
                for c in &g.chunks {
                    c.store.record(gpu, pass, n);
                }
                for c in &g.chunks {
                    c.attention.record(gpu, pass, n, kv_len);
                }
            }
            LayerCache::Mla(m) => {
                match &m.store {
                    MlaStore::Latent(s) => s.record(gpu, pass, n),
                    MlaStore::Decompressed(s) => s.record(gpu, pass, n),
                }
                m.attention.record(gpu, pass, n, kv_len);
            }
            LayerCache::Linear(l) => match l.draft.get().filter(|_| keep_token_states) {
                Some(d) => d.record(gpu, pass, n),
                None => {
                    l.conv.record(gpu, pass);
                    l.delta.record(gpu, pass, n);
                }
            },
        }
    }
}

/// KV heads per chunk so that one chunk's keys fit `max_binding` bytes.
fn heads_per_chunk(heads: Heads, context: usize, dtype: KvDtype, max_binding: u64) -> Result<usize> {
    let per_head = (context * dtype.row_bytes(heads.head_dim)) as u64;
    let n = (max_binding / per_head.max(1)) as usize;
    if n == 0 {
        return Err(Error::UnsupportedConfig(format!(
            "a context of {context} positions needs {per_head} bytes per KV head, over the binding limit {max_binding}"
        )));
    }
    Ok(n.min(heads.n_kv_heads))
}

/// Checks that every layer's caches of `shape` can be laid out within the binding limit:
/// grouped keys/values split by KV heads, or MLA's latent rows in one buffer; and that q8_0 and
/// q4_0 apply (grouped heads and MLA latents; rows of a multiple of 8 values).
pub(super) fn check_layout(spec: &ArchSpec, shape: CacheShape, dtype: KvDtype, max_binding: u64) -> Result<()> {
    if dtype.is_quantized() {
        let name = dtype.name();
        if let Some(m) = spec.mla() {
            if m.cache == MlaCacheKind::Decompressed {
                return Err(Error::UnsupportedConfig(format!(
                    "--kv-dtype {name} with --mla-cache decompressed is not implemented ({name} quantizes the latent)"
                )));
            }
            if !m.kv_lora_rank.is_multiple_of(8) || !m.qk_rope_head_dim.is_multiple_of(8) {
                return Err(Error::UnsupportedConfig(format!(
                    "--kv-dtype {name} needs kv_lora_rank and qk_rope_head_dim multiples of 8 (they are {} and {})",
                    m.kv_lora_rank, m.qk_rope_head_dim
                )));
            }
        }
    }
    let context = (0..spec.layers).map(|i| shape.positions(spec.window(i))).max().unwrap_or(0);
    match spec.mla() {
        Some(m) => {
            let (what, row) = match m.cache {
                MlaCacheKind::Latent => ("latent", dtype.row_bytes(m.kv_lora_rank)),
                MlaCacheKind::Decompressed => ("decompressed key", spec.heads * dtype.row_bytes(m.qk_head_dim())),
            };
            let bytes = (context * row) as u64;
            if bytes > max_binding {
                return Err(Error::UnsupportedConfig(format!(
                    "a context of {context} positions needs a {bytes}-byte MLA {what} cache, over the binding limit {max_binding}"
                )));
            }
            Ok(())
        }
        None => {
            let heads = Heads { n_heads: spec.heads, n_kv_heads: spec.kv_heads, head_dim: spec.head_dim };
            heads_per_chunk(heads, context, dtype, max_binding).map(|_| ())
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl GpuModel {
    /// A new, empty sequence cache of the model's context, reserved from the KV memory budget
    /// (a [`Error::KvCacheTooLarge`] when it does not fit, before anything is allocated).
    pub fn new_cache(&self) -> Result<SequenceCache> {
        // The MTP module's layer has its cache too.
        let spec = self.mtp.as_ref().map_or(&self.spec, |m| &m.spec);
        let (shape, dtype) = (self.options.cache_shape(), self.options.kv_dtype);
        // The state copies are made below, reserving their own bytes.
        let bytes = spec.kv_cache_bytes(CacheShape { state_copy: false, ..shape }, dtype);
        self.kv_ledger.reserve(bytes)?;
        let rings = Ring::all(spec, shape);
        let (layers, allocated) = counting_allocations(|| {
            self.layers
                .iter()
                .chain(self.mtp.as_ref().map(|m| &m.layer))
                .enumerate()
                .map(|(i, layer)| match &layer.attn {
                    Attn::Mla(a) => {
                        LayerCache::Mla(self.mla_cache(spec.mla().expect("MLA layers imply an MLA spec"), &a.kv_b))
                    }
                    Attn::Grouped(a) => {
                        LayerCache::Grouped(self.grouped_cache(spec.window(i), a.sinks.as_ref().map(|s| &s.0)))
                    }
                    Attn::Linear(a) => LayerCache::Linear(
                        self.linear_cache(spec.hybrid.as_ref().expect("linear layers imply a hybrid spec"), a),
                    ),
                })
                .collect()
        });
        // Buffers are padded to 16 bytes (a q8_0 cache's rows need not fill them): the ledger
        // holds what was allocated, never less than the formula.
        debug_assert!(allocated >= bytes, "buffers are at least the formula's bytes");
        let padding = allocated.saturating_sub(bytes);
        if let Err(e) = self.kv_ledger.reserve(padding) {
            self.kv_ledger.release(bytes);
            self.gpu.release_allocation(allocated);
            return Err(e);
        }
        let cache = SequenceCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            layers,
            bytes: AtomicU64::new(bytes + padding),
            ledger: self.kv_ledger.clone(),
            gpu: self.gpu.clone(),
            state_len: AtomicUsize::new(0),
            rings,
            saved: OnceLock::new(),
            snapshots: Mutex::new(Vec::new()),
            snapshot_limit: self.options.state_snapshots,
            written_end: AtomicUsize::new(0),
            draft_states_armed: AtomicBool::new(false),
        };
        if shape.state_copy {
            cache.ensure_state_copies()?;
        }
        Ok(cache)
    }

    /// One Gated DeltaNet layer's zeroed state, the conv reading `a`'s taps and the delta rule
    /// its decay parameters (its copy is made when needed: `super::state_copy`).
    fn linear_cache(&self, hy: &crate::model::HybridSpec, a: &super::linear::LinearAttn) -> LinearCache {
        let gpu = &*self.gpu;
        let c = hy.conv_dim();
        let window = gpu.storage("conv window", (c * (hy.conv_kernel - 1) * 4) as u64);
        let state = gpu.storage("recurrent state", (hy.num_v_heads * hy.head_k_dim * hy.head_v_dim * 4) as u64);
        let (conv, delta) = self.linear_kernels(hy, a, (&window, &state), None);
        LinearCache { conv, delta, window, state, draft: OnceLock::new() }
    }

    /// The conv and delta rule of linear layer `a` over a sequence's `window` and `state`; with
    /// `snapshots` (their per-token copies), token by token, writing each token's states there.
    pub(super) fn linear_kernels(
        &self,
        hy: &crate::model::HybridSpec,
        a: &super::linear::LinearAttn,
        (window, state): (&wgpu::Buffer, &wgpu::Buffer),
        snapshots: Option<(&wgpu::Buffer, &wgpu::Buffer)>,
    ) -> (CausalConv1d, GatedDeltaRule) {
        let (gpu, acts, step) = (&*self.gpu, &self.acts, &self.step.buffer);
        let c = hy.conv_dim();
        let shape = ConvShape { channels: c, kernel: hy.conv_kernel, in_stride: hy.in_width() };
        let conv_io = (&acts.lin, &a.conv_w, window, &acts.conv);
        let io = DeltaIo {
            conv: &acts.conv,
            proj: &acts.lin,
            decay_params: &a.decay_params,
            state,
            out: &acts.core,
            chunks: Some(ChunkScratch { buffer: &acts.delta_chunks, max_tokens: self.options.max_batch }),
        };
        let heads = (crate::model::DeltaShape::of(hy), hy.kind);
        let offsets = (hy.in_width(), c + hy.value_dim());
        match snapshots {
            None => (CausalConv1d::new(gpu, step, conv_io, shape), GatedDeltaRule::new(gpu, step, io, heads, offsets)),
            Some((windows, states)) => (
                CausalConv1d::with_snapshots(gpu, step, conv_io, shape, windows),
                GatedDeltaRule::with_snapshots(gpu, step, io, heads, offsets, states),
            ),
        }
    }

    /// One grouped layer's cache, its attention seeing the last `window` keys when set (kept in
    /// a ring as the options' [`CacheShape`] says), with the layer's attention `sinks` when it
    /// has them; split into chunks of KV heads that each fit a binding (checked at load).
    fn grouped_cache(&self, window: Option<usize>, sinks: Option<&wgpu::Buffer>) -> GroupedCache {
        let gpu = &*self.gpu;
        let shape = self.options.cache_shape();
        let (context, dtype) = (shape.positions(window), self.options.kv_dtype);
        let ring = context < shape.context;
        let heads = self.heads();
        let per_chunk =
            heads_per_chunk(heads, context, dtype, gpu.caps.max_binding).expect("the cache layout is checked at load");
        let acts = &self.acts;
        let chunks = (0..heads.n_kv_heads)
            .step_by(per_chunk)
            .map(|kv_head0| {
                let n = per_chunk.min(heads.n_kv_heads - kv_head0);
                let chunk_bytes = (n * context * dtype.row_bytes(heads.head_dim)) as u64;
                let k = gpu.storage("k cache", chunk_bytes);
                let v = gpu.storage("v cache", chunk_bytes);
                let chunk = KvChunk { k: &k, v: &v, kv_head0, heads: n, context, dtype, ring };
                let (cos, sin) = &self.rope_tables;
                let rope = StoreRope { tables: (cos, sin), q: &acts.q, n_heads: heads.n_heads, spec: &self.spec.rope };
                let store = KvStore::new(
                    gpu,
                    &self.step.buffer,
                    (&acts.k, &acts.v),
                    chunk,
                    heads.n_kv_heads,
                    (heads.head_dim, heads.head_dim),
                    Some(rope),
                );
                let io = AttentionIo { q: &acts.q, out: &acts.attn, partial: &acts.attn_partial, sinks };
                let keys = KeyRange { split_len: self.split_len, window };
                let attention = Attention::new(gpu, &self.step.buffer, io, chunk, heads, keys);
                GroupedChunk { store, attention, k, v }
            })
            .collect();
        GroupedCache { chunks }
    }

    /// One MLA layer's cache (shape `m`, in the form `m.cache` says), its store and attention
    /// reading `kv_b` (the layer's f32 `kv_b_proj`).
    fn mla_cache(&self, m: &MlaSpec, kv_b: &wgpu::Buffer) -> MlaCache {
        let gpu = &*self.gpu;
        let step = &self.step.buffer;
        let (context, dtype) = (self.options.context, self.options.kv_dtype);
        let (rank, rope, heads) = (m.kv_lora_rank, m.qk_rope_head_dim, self.spec.heads);
        let acts = &self.acts;
        let (a, b) = match m.cache {
            MlaCacheKind::Latent => (
                gpu.storage("mla latent cache", (context * dtype.row_bytes(rank)) as u64),
                gpu.storage("mla rope key cache", (context * dtype.row_bytes(rope)) as u64),
            ),
            MlaCacheKind::Decompressed => (
                gpu.storage("mla key cache", (heads * context * dtype.row_bytes(m.qk_head_dim())) as u64),
                gpu.storage("mla value cache", (heads * context * dtype.row_bytes(m.v_head_dim)) as u64),
            ),
        };
        let (store, cache) = match m.cache {
            MlaCacheKind::Latent => {
                // The latent is one "head" of `rank` keys, the rotary key one of `rope` values.
                let chunk = KvChunk { k: &a, v: &b, kv_head0: 0, heads: 1, context, dtype, ring: false };
                let store = KvStore::new(gpu, step, (&acts.k, &acts.v), chunk, 1, (rank, rope), None);
                (MlaStore::Latent(store), MlaCacheView::Latent(LatentCache { c: &a, k_rope: &b, context, dtype }))
            }
            MlaCacheKind::Decompressed => {
                let cache = DecompressedCache { k: &a, v: &b, context, dtype };
                let input = DecompressIn { c: &acts.k, k_rope: &acts.v, kv_b };
                let store = MlaDecompress::new(gpu, step, input, cache, heads, m);
                (MlaStore::Decompressed(store), MlaCacheView::Decompressed(cache))
            }
        };
        let io = MlaIo { q: &acts.q, cache, kv_b, out: &acts.attn, partial: &acts.attn_partial };
        let attention = MlaAttention::new(gpu, step, io, heads, m, self.split_len);
        MlaCache { store, attention, buffers: [a, b] }
    }

    /// Whether `cache` was made by this model (its kernels are bound to this model's buffers).
    pub fn owns(&self, cache: &SequenceCache) -> bool {
        Arc::ptr_eq(&cache.ledger, &self.kv_ledger)
    }

    /// Records layer `layer`'s attention on `cache` for a step of `n` tokens ending at `kv_len`.
    pub(super) fn record_attention(
        &self,
        cache: &SequenceCache,
        layer: usize,
        pass: &mut Pass,
        n: usize,
        kv_len: usize,
    ) {
        self.record_attention_of(&self.layers[layer].attn, cache, layer, pass, n, kv_len)
    }

    /// Records attention `attn` (that of layer `layer`, or of the MTP module's) on `cache`'s
    /// layer `layer` for a step of `n` tokens ending at `kv_len`.
    pub(super) fn record_attention_of(
        &self,
        attn: &Attn,
        cache: &SequenceCache,
        layer: usize,
        pass: &mut Pass,
        n: usize,
        kv_len: usize,
    ) {
        let cached = cache.layer(layer);
        attn.record_positional(&self.gpu, pass, n);
        cached.record(&self.gpu, pass, n, kv_len, cache.keeps_token_states(n));
        if !is_split(n, kv_len, self.split_len) {
            return;
        }
        match (cached, attn) {
            (LayerCache::Linear(_), _) => {}
            // The latent cache's merge applies the layer's `W_UV`.
            (_, Attn::Mla(a)) if a.merge.is_some() => a.merge.iter().for_each(|m| m.record(&self.gpu, pass)),
            // Attention sinks (gpt-oss) have their own merge.
            (_, Attn::Grouped(a)) => a.sinks.as_ref().map_or(&self.attention_merge, |s| &s.1).record(&self.gpu, pass),
            _ => self.attention_merge.record(&self.gpu, pass),
        }
    }
}
