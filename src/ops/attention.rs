//! Causal grouped-query attention against one chunk of a sequence's KV cache: one pass for
//! prefill (tiled over keys with an online softmax, no score matrix), and split-K
//! (flash-decoding) for a decode step over more than one split of keys: the keys are shared out
//! among workgroups whose partial softmax sums
//! [`super::attention_merge::AttentionMerge`] combines.

use super::kv_store::KvChunk;
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
    /// Dimension of a head (even, at most 256).
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

/// Queries one workgroup takes (`QT` in the shader): they share key/value loads. Tokens of one
/// head in the single pass; query heads of one KV head's group in the split pass (GQA).
const QUERIES_PER_GROUP: usize = 4;

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
    /// Single-pass workgroups per `QUERIES_PER_GROUP` tokens: the chunk's query heads.
    q_heads: usize,
    /// Split-pass workgroups per split: per KV head, its query heads `QUERIES_PER_GROUP` at a time.
    head_sets: usize,
    split_len: usize,
}

impl Attention {
    /// Binds `io` and `chunk`; `keys` gives the keys each query sees and the decode split
    /// length.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: AttentionIo<'_>,
        chunk: KvChunk<'_>,
        heads: Heads,
        keys: KeyRange,
    ) -> Attention {
        assert!(heads.head_dim <= 256 && heads.head_dim.is_multiple_of(2), "head_dim is checked at load");
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
        let kernel = |dest: &wgpu::Buffer, split: bool| {
            let mut defines = chunk.dtype.defines().to_vec();
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
        Attention {
            single: kernel(io.out, false),
            split: kernel(io.partial, true),
            q_heads: chunk.heads * group,
            head_sets: chunk.heads * group.div_ceil(QUERIES_PER_GROUP),
            split_len: keys.split_len,
        }
    }

    /// Records attention for `n_tokens` queries, the last one seeing `kv_len` keys; split
    /// when [`is_split`] (then an [`super::attention_merge::AttentionMerge`] must follow).
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize, kv_len: usize) {
        let max = gpu.caps.max_workgroups_per_dim;
        if is_split(n_tokens, kv_len, self.split_len) {
            self.split.dispatch(pass, (kv_len.div_ceil(self.split_len) * self.head_sets) as u32, max);
        } else {
            self.single.dispatch(pass, (n_tokens.div_ceil(QUERIES_PER_GROUP) * self.q_heads) as u32, max);
        }
    }
}
