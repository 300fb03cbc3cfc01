//! Causal grouped-query attention against one chunk of a sequence's KV cache: one pass for
//! prefill (tiled over keys with an online softmax, no score matrix), and split-K
//! (flash-decoding) for a decode step over more than one split of keys: the keys are shared out
//! among workgroups whose partial softmax sums
//! [`super::attention_merge::AttentionMerge`] combines.

use super::kv_store::KvChunk;
use super::matmul::DecodeLayout;
use super::params;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::quant::kv_dtype::Q8Rows;

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

/// Fewest keys one decode workgroup handles on a GPU: below this, splitting costs more in the
/// merge than it gains in parallelism.
pub const MIN_SPLIT_LEN: usize = 256;

/// Fewest keys one decode workgroup handles in the CPU layout: a few cores need few workgroups,
/// and each one's query loads and final merge of its lanes are spread over more keys (lavapipe,
/// `bench kernels --attention-heads 8,4,64`: 10-15% faster decode attention at 4K-16K keys
/// than with [`MIN_SPLIT_LEN`]).
pub const MIN_SPLIT_LEN_CPU: usize = 1024;

/// Keys per split of decode attention on `gpu` for a cache of `context` positions:
/// [`MIN_SPLIT_LEN`] ([`MIN_SPLIT_LEN_CPU`] in the CPU layout), or more (a multiple of 64) when
/// the partials of that many splits would not fit one binding.
pub fn split_len(gpu: &Gpu, heads: Heads, context: usize) -> usize {
    let mut len = match DecodeLayout::for_gpu(gpu) {
        DecodeLayout::LaneRows => MIN_SPLIT_LEN_CPU,
        DecodeLayout::Teams { .. } => MIN_SPLIT_LEN,
    };
    while partial_bytes(heads, context, len) > gpu.caps.max_binding {
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
/// (the split pass: one token, see [`split_queries`]).
const QUERIES_PER_TEAM: usize = 4;

/// Query slots of the split pass: [`QUERIES_PER_TEAM`], or the group when it has fewer query
/// heads (its one token cannot fill the other slots).
fn split_queries(group: usize) -> usize {
    match group {
        1 | 2 => group,
        _ => QUERIES_PER_TEAM,
    }
}

/// The define giving the shader's query slots (`QT`), none for [`QUERIES_PER_TEAM`].
fn queries_define(slots: usize) -> Option<&'static str> {
    match slots {
        1 => Some("QT1"),
        2 => Some("QT2"),
        _ => None,
    }
}

/// Most query-slot dims (slots × the head dims the shader holds: 64, 128 or 256) for which the
/// CPU layout runs `attention_keys`, whose every lane holds each slot's whole query and
/// accumulator. Beyond it the spilled state costs more than the shuffles the kernel saves
/// (lavapipe, `bench kernels --kv-len 4096`: 8 heads on 4 KV heads of 64, two slots, 2.2x
/// faster than `attention`; 32 on 4 of 128, four slots, 2.5x slower; 4 slots of 64 in prefill
/// 1.4x slower).
const KEYS_MAX_SLOT_DIMS: usize = 128;

/// Lanes of a team (`TEAM` in the shader), each owning 8-dim chunks of a head.
const TEAM: u32 = 8;

/// The shader and layout defines of a variant with `slots` query slots. The CPU layout (lavapipe:
/// a workgroup is one thread, its lanes SIMD lanes) runs one team per workgroup: `attention_keys`,
/// whose lanes split the keys, while its state is small (see [`KEYS_MAX_SLOT_DIMS`]), else
/// `attention` with `ONE_TEAM`, whose lanes split a head's dims. GPUs run `attention` with eight
/// teams per workgroup, whatever the decode kernels' team size. Cross-lane steps go through
/// subgroup shuffles where subgroups hold whole teams and the layout does not sum through
/// workgroup memory, else through workgroup memory.
fn layout_shader(gpu: &Gpu, layout: DecodeLayout, slots: usize, head_dim: usize) -> (&'static str, Vec<&'static str>) {
    let small_subgroups = !gpu.caps.subgroups || gpu.device.adapter_info().subgroup_min_size < TEAM;
    let shared = |shared_reduce: bool| if shared_reduce { vec!["SHARED_REDUCE"] } else { vec![] };
    // The CPU layout loads the cache's 16 bytes as two 8-byte integers where it can
    // (Caps::words64, shaders/words16.wgsl).
    let cpu =
        |defines: Vec<&'static str>| [defines, gpu.caps.words64.then_some("WORDS64").into_iter().collect()].concat();
    match layout {
        DecodeLayout::LaneRows if slots * held_head_dims(head_dim) <= KEYS_MAX_SLOT_DIMS => {
            ("attention_keys", cpu(shared(small_subgroups)))
        }
        DecodeLayout::LaneRows => ("attention", cpu([&["ONE_TEAM"][..], &shared(small_subgroups)].concat())),
        DecodeLayout::Teams { shared_reduce, .. } => ("attention", shared(shared_reduce || small_subgroups)),
    }
}

/// The define giving the shader's chunks per lane (`CH`) for `head_dim`.
fn head_dim_define(head_dim: usize) -> Option<&'static str> {
    match held_head_dims(head_dim) {
        64 => None,
        128 => Some("HD128"),
        _ => Some("HD256"),
    }
}

/// Dims of a head the shaders hold per query (64, 128 or 256; the chunks past `head_dim` are
/// zero or unused).
fn held_head_dims(head_dim: usize) -> usize {
    match head_dim {
        0..=64 => 64,
        65..=128 => 128,
        _ => 256,
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
        let q8 = Q8Rows::of(heads.head_dim);
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
            (q8.block / 8) as u32,
            q8.scales_per_word() as u32,
        ]);
        // Per cached position the chunk's keys and values in the cache's element type; per query
        // token its query and output (the split pass writes partials instead, about as many).
        let traffic = Traffic {
            fixed: 0,
            per_token: 8 * (chunk.heads * group * heads.head_dim) as u64,
            per_position: 2 * (chunk.heads * chunk.dtype.row_bytes(heads.head_dim)) as u64,
        };
        let teams = match layout {
            DecodeLayout::LaneRows => 1,
            DecodeLayout::Teams { .. } => 8,
        };
        let kernel = |dest: &wgpu::Buffer, split: bool| {
            let slots = if split { split_queries(group) } else { QUERIES_PER_TEAM };
            let (shader, mut defines) = layout_shader(gpu, layout, slots, heads.head_dim);
            defines.extend(chunk.defines());
            if chunk.dtype.is_quantized() && q8.block == 32 {
                defines.push("Q8_B32");
            }
            defines.extend(head_dim_define(heads.head_dim));
            defines.extend(queries_define(slots));
            let mut bindings = vec![io.q.into(), chunk.k.into(), chunk.v.into(), dest.into()];
            match (split, io.sinks) {
                (true, _) => defines.push("SPLIT"),
                (false, Some(sinks)) => {
                    defines.push("SINKS");
                    bindings.push(sinks.into());
                }
                (false, None) => {}
            }
            Kernel::new(gpu, shader, &defines, step, &p, &bindings).with_traffic(traffic)
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
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize, kv_len: usize) {
        let max = gpu.caps.max_workgroups_per_dim;
        if is_split(n_tokens, kv_len, self.split_len) {
            self.split.dispatch(pass, (kv_len.div_ceil(self.split_len) * self.groups_per_block) as u32, max);
        } else {
            let blocks = n_tokens.div_ceil(self.tokens_per_team);
            self.single.dispatch(pass, (blocks * self.groups_per_block) as u32, max);
        }
    }
}
