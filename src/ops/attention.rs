//! Causal grouped-query attention against one chunk of a sequence's KV cache: one pass for
//! prefill (tiled over keys with an online softmax, no score matrix), and split-K
//! (flash-decoding) for a decode step over more than one split of keys: the keys are shared out
//! among workgroups whose partial softmax sums
//! [`super::attention_merge::AttentionMerge`] combines.

use super::kv_store::KvChunk;
use super::matmul::DecodeLayout;
use super::params;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel};

/// Head layout of an attention layer.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Dimension of a head (a multiple of 8, at most 256).
    pub head_dim: usize,
}

/// Which cached keys a query attends and how a decode step shares them out.
#[derive(Clone, Copy, Debug)]
pub struct KeyRange {
    /// Keys per split of split-K decode (see [`split_len`]).
    pub split_len: usize,
    /// Sliding window: a query sees its last `window` keys, its own included; `None`: every
    /// earlier key.
    pub window: Option<usize>,
}

/// Fewest keys one decode workgroup handles: below this, splitting costs more in the merge
/// than it gains in parallelism.
pub const MIN_SPLIT_LEN: usize = 256;

/// Keys per split of decode attention for a cache of `context` positions: [`MIN_SPLIT_LEN`],
/// or more (a multiple of 64) when the partials of that many splits would not fit one binding
/// of `max_binding` bytes.
pub fn split_len(heads: Heads, context: usize, max_binding: u64) -> usize {
    let mut len = MIN_SPLIT_LEN;
    while partial_bytes(heads, context, len) > max_binding {
        len += 64;
    }
    len
}

/// Bytes of the split partials (max, sum, accumulator per split and head).
pub fn partial_bytes(heads: Heads, context: usize, split_len: usize) -> u64 {
    (context.div_ceil(split_len) * heads.n_heads * (heads.head_dim + 2) * 4) as u64
}

/// Whether a step of `n_tokens` ending with `kv_len` keys in the cache runs split: a decode
/// step over more than one split.
pub fn is_split(n_tokens: usize, kv_len: usize, split_len: usize) -> bool {
    n_tokens == 1 && kv_len > split_len
}

/// Queries a team of the shader takes (`QT`): they share every key and value load. Query
/// heads of one KV head, `min(group, QUERIES_PER_TEAM)` at a time, times as many tokens as fit
/// (the split pass: one token).
const QUERIES_PER_TEAM: usize = 4;

/// Lanes of a team (`TEAM` in the shader), each owning 8-dim chunks of a head.
const TEAM: u32 = 8;

/// The shader defines of `layout` and its teams per workgroup: one team per workgroup in the
/// CPU layout (lavapipe: a workgroup is one thread, its lanes SIMD lanes), eight on GPUs;
/// cross-lane steps through subgroup shuffles where subgroups hold whole teams, else through
/// workgroup memory.
fn layout_defines(gpu: &Gpu, layout: DecodeLayout) -> (Vec<&'static str>, usize) {
    let small_subgroups = !gpu.caps.subgroups || gpu.device.adapter_info().subgroup_min_size < TEAM;
    match layout {
        DecodeLayout::LaneRows if small_subgroups => (vec!["ONE_TEAM", "SHARED_REDUCE"], 1),
        DecodeLayout::LaneRows => (vec!["ONE_TEAM"], 1),
        DecodeLayout::Teams { shared_reduce: true } => (vec!["SHARED_REDUCE"], 8),
        DecodeLayout::Teams { shared_reduce: false } => (vec![], 8),
    }
}

/// The define giving the shader's chunks per lane (`CH`) for `head_dim`.
fn head_dim_define(head_dim: usize) -> Option<&'static str> {
    match head_dim {
        0..=64 => None,
        65..=128 => Some("HD128"),
        _ => Some("HD256"),
    }
}

/// The buffers attention reads and writes besides the cache.
#[derive(Clone, Copy)]
pub struct AttentionIo<'a> {
    /// Queries, `[tokens, n_heads * head_dim]` f32.
    pub q: &'a wgpu::Buffer,
    /// The single pass's output (same layout as `q`).
    pub out: &'a wgpu::Buffer,
    /// The split pass's partials (see [`partial_bytes`]).
    pub partial: &'a wgpu::Buffer,
    /// Attention sinks: one f32 logit per query head that joins each softmax's denominator
    /// (gpt-oss); the split pass leaves them to the merge.
    pub sinks: Option<&'a wgpu::Buffer>,
}

/// Attention bound to one KV-cache chunk, in both variants.
pub struct Attention {
    single: Kernel,
    split: Kernel,
    /// Tokens a team takes in the single pass.
    tokens_per_team: usize,
    /// Workgroups per block of tokens (single pass) or per split: the chunk's slot sets (per KV
    /// head its query heads `QUERIES_PER_TEAM` at a time), one per team.
    groups_per_block: usize,
    split_len: usize,
}

impl Attention {
    /// Binds `io` and `chunk`; `keys` gives the keys each query sees and the decode split
    /// length. Laid out as [`DecodeLayout::for_gpu`] says (`MOESTREAM_DECODE_LAYOUT` forces one).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: AttentionIo<'_>,
        chunk: KvChunk<'_>,
        heads: Heads,
        keys: KeyRange,
    ) -> Attention {
        Attention::with_layout(gpu, step, io, chunk, heads, keys, DecodeLayout::for_gpu(gpu))
    }

    /// [`Attention::new`] in a given layout (`LaneRows`: one team per workgroup; `Teams`: eight,
    /// cross-lane steps through workgroup memory when `shared_reduce`).
    #[allow(clippy::too_many_arguments)]
    pub fn with_layout(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: AttentionIo<'_>,
        chunk: KvChunk<'_>,
        heads: Heads,
        keys: KeyRange,
        layout: DecodeLayout,
    ) -> Attention {
        assert!(heads.head_dim <= 256 && heads.head_dim.is_multiple_of(8), "head_dim is checked at load");
        let group = heads.n_heads / heads.n_kv_heads;
        let scale = 1.0 / (heads.head_dim as f32).sqrt();
        let p = params(&[
            heads.n_heads as u32,
            group as u32,
            heads.head_dim as u32,
            scale.to_bits(),
            chunk.kv_head0 as u32,
            chunk.heads as u32,
            chunk.context as u32,
            keys.split_len as u32,
            keys.window.map_or(0, |w| w.min(u32::MAX as usize) as u32),
        ]);
        // Per cached position the chunk's keys and values in the cache's element type; per query
        // token its query and output (the split pass writes partials instead, about as many).
        let traffic = Traffic {
            fixed: 0,
            per_token: 8 * (chunk.heads * group * heads.head_dim) as u64,
            per_position: 2 * (chunk.heads * heads.head_dim * chunk.dtype.bytes()) as u64,
        };
        let (layout, teams) = layout_defines(gpu, layout);
        let kernel = |dest: &wgpu::Buffer, split: bool| {
            let mut defines = chunk.dtype.defines().to_vec();
            defines.extend(&layout);
            defines.extend(head_dim_define(heads.head_dim));
            let mut bindings = vec![io.q.into(), chunk.k.into(), chunk.v.into(), dest.into()];
            match (split, io.sinks) {
                (true, _) => defines.push("SPLIT"),
                (false, Some(sinks)) => {
                    defines.push("SINKS");
                    bindings.push(sinks.into());
                }
                (false, None) => {}
            }
            Kernel::new(gpu, "attention", &defines, step, &p, &bindings).with_traffic(traffic)
        };
        let heads_per_set = group.min(QUERIES_PER_TEAM);
        Attention {
            single: kernel(io.out, false),
            split: kernel(io.partial, true),
            tokens_per_team: QUERIES_PER_TEAM / heads_per_set,
            groups_per_block: (chunk.heads * group.div_ceil(heads_per_set)).div_ceil(teams),
            split_len: keys.split_len,
        }
    }

    /// Records attention for `n_tokens` queries, the last one seeing `kv_len` keys; split
    /// when [`is_split`] (then an [`super::attention_merge::AttentionMerge`] must follow).
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize, kv_len: usize) {
        let max = gpu.caps.max_workgroups_per_dim;
        if is_split(n_tokens, kv_len, self.split_len) {
            self.split.dispatch(pass, (kv_len.div_ceil(self.split_len) * self.groups_per_block) as u32, max);
        } else {
            let blocks = n_tokens.div_ceil(self.tokens_per_team);
            self.single.dispatch(pass, (blocks * self.groups_per_block) as u32, max);
        }
    }
}
