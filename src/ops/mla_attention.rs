//! Causal multi-head latent attention (decode and prefill) over a session's MLA cache: the
//! absorbed form over the latent cache (`W_UK` folded into each query, `W_UV` applied after
//! attention), or plain attention over decompressed per-head keys and values. A decode step
//! over more than one split of keys runs split-K: workgroups per (head set, split) leave
//! partial softmax sums that [`super::mla_merge::MlaMerge`] (latent) or
//! [`super::attention_merge::AttentionMerge`] (decompressed) combine.

use super::attention::{is_split, Heads};
use super::kv_store::KvDtype;
use super::params;
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::model::MlaSpec;

/// Largest `kv_lora_rank` the kernels hold in workgroup memory.
pub const MAX_RANK: usize = 512;
/// Largest `qk_rope_head_dim`.
pub const MAX_ROPE: usize = 128;
/// Largest `qk_nope_head_dim` and `v_head_dim` of the decompressed cache (key width
/// `nope + rope` up to 640, value width up to 512).
pub const MAX_DECOMPRESSED_DIM: usize = 512;

/// Loop iterations one shader invocation may run on software adapters: lavapipe (llvmpipe)
/// stops an invocation's loops after 65535 iterations in all.
const SOFTWARE_LOOP_LIMIT: usize = 65535;

/// The most keys one query's single pass (every step of several tokens, and decode within one
/// split) may walk on a software adapter before its loops pass [`SOFTWARE_LOOP_LIMIT`]: per
/// tile of 64 keys the latent kernel loops over a quarter of `rank + rope` dims and eight value
/// columns of 64 keys four at a time (the decompressed one over `nope + rope` dims and 64 keys
/// one at a time), with a fifth to spare for the rest of the kernel. Rank 512 and rope 64
/// (DeepSeek, Kimi, Ling) give 10,240 keys; measured on lavapipe: 10,000 exact, 13,000 not.
pub fn software_key_limit(m: &MlaSpec) -> usize {
    let (rank, rope) = (m.kv_lora_rank, m.qk_rope_head_dim);
    let per_tile = match m.cache {
        crate::model::MlaCacheKind::Latent => rank.div_ceil(4) + 3 + rope.div_ceil(4) + 3 + 8 * (16 + 4) + 16,
        crate::model::MlaCacheKind::Decompressed => m.qk_nope_head_dim + rope + 8 * (64 + 1) + 16,
    };
    SOFTWARE_LOOP_LIMIT * 4 / 5 / per_tile * 64
}

/// Query heads one workgroup takes (`QT` in the shader): they share each latent load.
const HEADS_PER_GROUP: usize = 4;

/// The latent cache of one layer: normalised latents `[positions, kv_lora_rank]` and the rotated
/// shared keys `[positions, qk_rope_head_dim]`, in `dtype` (f16: two halves per u32).
#[derive(Clone, Copy)]
pub struct LatentCache<'a> {
    /// Latents `c`.
    pub c: &'a wgpu::Buffer,
    /// Rotary keys.
    pub k_rope: &'a wgpu::Buffer,
    /// Positions held.
    pub context: usize,
    /// Element type of both.
    pub dtype: KvDtype,
}

/// The decompressed cache of one layer: per-head keys `[heads, context, nope + rope]` and values
/// `[heads, context, v_head_dim]` (see [`super::mla_decompress`]), in `dtype`.
#[derive(Clone, Copy)]
pub struct DecompressedCache<'a> {
    /// Keys `[W_UK c | k_rope]`.
    pub k: &'a wgpu::Buffer,
    /// Values `W_UV c`.
    pub v: &'a wgpu::Buffer,
    /// Positions per head.
    pub context: usize,
    /// Element type of both.
    pub dtype: KvDtype,
}

/// What an MLA layer caches per position.
#[derive(Clone, Copy)]
pub enum MlaCacheView<'a> {
    /// The latent and the shared rotary key: attention in the absorbed form.
    Latent(LatentCache<'a>),
    /// Keys and values of every head: plain attention.
    Decompressed(DecompressedCache<'a>),
}

impl MlaCacheView<'_> {
    /// Values accumulated per head: the latent's rank, or the value head width.
    pub fn value_width(&self, m: &MlaSpec) -> usize {
        match self {
            MlaCacheView::Latent(_) => m.kv_lora_rank,
            MlaCacheView::Decompressed(_) => m.v_head_dim,
        }
    }
}

/// The heads split-K partials are laid out for: every query head, each accumulating
/// `value_width` values (see [`super::attention::partial_bytes`]).
pub fn partial_heads(n_heads: usize, value_width: usize) -> Heads {
    Heads { n_heads, n_kv_heads: n_heads, head_dim: value_width }
}

/// What an MLA attention reads and writes.
#[derive(Clone, Copy)]
pub struct MlaIo<'a> {
    /// Queries `[tokens, heads, nope + rope]`, rotary part rotated.
    pub q: &'a wgpu::Buffer,
    /// The layer's cache.
    pub cache: MlaCacheView<'a>,
    /// `kv_b_proj` in f32, `[heads * (nope + v), rank]` (read with the latent cache).
    pub kv_b: &'a wgpu::Buffer,
    /// Output `[tokens, heads * v]`.
    pub out: &'a wgpu::Buffer,
    /// The split pass's partials ([`partial_heads`] with the cache's value width).
    pub partial: &'a wgpu::Buffer,
}

/// A bound MLA attention, in both variants.
pub struct MlaAttention {
    single: Kernel,
    split: Kernel,
    head_sets: usize,
    split_len: usize,
}

impl MlaAttention {
    /// Binds `io` for `n_heads` heads of shape `m`; decode steps over more than `split_len` keys
    /// run split.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: MlaIo<'_>,
        n_heads: usize,
        m: &MlaSpec,
        split_len: usize,
    ) -> MlaAttention {
        assert!(m.kv_lora_rank <= MAX_RANK && m.qk_rope_head_dim <= MAX_ROPE, "MLA limits are checked at load");
        let (rank, qk, v) = (m.kv_lora_rank, m.qk_head_dim(), m.v_head_dim);
        let (dtype, context, decompressed) = match io.cache {
            MlaCacheView::Latent(c) => (c.dtype, c.context, false),
            MlaCacheView::Decompressed(c) => (c.dtype, c.context, true),
        };
        let p = params(
            &[
                n_heads as u32,
                rank as u32,
                m.qk_nope_head_dim as u32,
                m.qk_rope_head_dim as u32,
                v as u32,
                m.softmax_scale.to_bits(),
                split_len as u32,
                context as u32,
            ]
            .into_iter()
            .chain(super::kv_store::q8_words(rank))
            .chain(super::kv_store::q8_words(m.qk_rope_head_dim))
            .collect::<Vec<_>>(),
        );
        // Per cached position: the latent and rotary key, or every head's key and value. Per
        // query token its query and output, and with the latent cache `kv_b` (folded into the
        // query, applied to the output).
        let (per_position, weights) = match decompressed {
            false => {
                (dtype.row_bytes(rank) + dtype.row_bytes(m.qk_rope_head_dim), n_heads * (m.qk_nope_head_dim + v) * rank)
            }
            true => (n_heads * (dtype.row_bytes(qk) + dtype.row_bytes(v)), 0),
        };
        let traffic = Traffic {
            fixed: 0,
            per_token: 4 * (n_heads * (qk + v) + weights) as u64,
            per_position: per_position as u64,
        };
        let kernel = |dest: &wgpu::Buffer, split: bool| {
            let mut defines = super::kv_store::dtype_defines(dtype).to_vec();
            let mut storage: Vec<Slice<'_>> = vec![io.q.into()];
            match io.cache {
                MlaCacheView::Latent(c) => storage.extend([c.c, c.k_rope, io.kv_b].map(Slice::from)),
                MlaCacheView::Decompressed(c) => {
                    defines.push("DECOMPRESSED");
                    storage.extend([c.k, c.v].map(Slice::from));
                }
            }
            if split {
                defines.push("SPLIT");
            }
            storage.push(dest.into());
            Kernel::new(gpu, "mla_attention", &defines, step, &p, &storage).with_traffic(traffic)
        };
        MlaAttention {
            single: kernel(io.out, false),
            split: kernel(io.partial, true),
            head_sets: n_heads.div_ceil(HEADS_PER_GROUP),
            split_len,
        }
    }

    /// Records attention for `n_tokens` queries, the last one seeing `kv_len` keys; split when
    /// [`is_split`] (then the merge must follow).
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize, kv_len: usize) {
        let max = gpu.caps.max_workgroups_per_dim;
        if is_split(n_tokens, kv_len, self.split_len) {
            self.split.dispatch(pass, (kv_len.div_ceil(self.split_len) * self.head_sets) as u32, max);
        } else {
            self.single.dispatch(pass, (n_tokens * self.head_sets) as u32, max);
        }
    }
}
