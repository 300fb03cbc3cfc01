//! Causal grouped-query attention against `reference::ops::attention`, with the cache written
//! by `kv_store` (head-major chunks, f32 or f16): decode (T = 1) single-pass and split-K
//! (flash-decoding: partials merged by `attention_merge`) at kv lengths on both sides of every
//! split boundary, prefill (T > 1) at offsets crossing 8-key blocks and 64 keys, head_dim 24..256,
//! GQA (groups 1..12), MQA, MHA, and caches split into chunks of KV heads; the CPU layout (one
//! team per workgroup: `attention_keys` for the split pass of groups of 1 and 2 with small
//! heads, else `attention`), the GPU layout (eight teams) and the workgroup-memory paths without
//! subgroups; sliding windows (a query sees its last `window` keys) in every variant. Cache rows past the last visible key, and rows before the
//! first key any query of the step sees through its window, hold NaN, so reading them (a
//! causality or window bug) poisons the output. Attention sinks (gpt-oss: a per-head logit in
//! every softmax's denominator) in the single pass and in the split merge.
//!
//! Tolerance: |Δ| ≤ 1e-4·(1+|ref|) per element (online softmax over tiles and splits vs a
//! two-pass f32 softmax with an f64 sum). With an f16 cache the reference reads the same
//! f16-rounded keys and values, so the bound is the same.

mod common;

use common::{assert_close, gpu, read_f32, read_u32, submit, upload_f32, Rng};
use moestream::gpu::StepUniform;
use moestream::gpu::{Gpu, GpuOptions};
use moestream::ops::attention::{is_split, partial_bytes, Attention, AttentionIo, Heads, KeyRange};
use moestream::ops::attention_merge::AttentionMerge;
use moestream::ops::kv_store::{KvChunk, KvStore};
use moestream::ops::matmul::DecodeLayout;
use moestream::ops::KvDtype;
use moestream::reference::ops as refops;

const TOL: f32 = 1e-4;

/// How the cache is laid out and read.
#[derive(Clone, Copy, Debug)]
struct Layout {
    dtype: KvDtype,
    /// KV heads per chunk.
    chunk_heads: usize,
    split_len: usize,
    window: Option<usize>,
    /// One sink logit per query head.
    sinks: bool,
}

/// The kernel's workgroup layout and the GPU context it runs on.
#[derive(Clone, Copy, Debug)]
enum KernelLayout {
    /// The adapter's own ([`DecodeLayout::for_gpu`]).
    Default,
    /// Eight teams per workgroup (the GPU layout), subgroup shuffles or workgroup memory.
    Teams { shared_reduce: bool },
    /// One team per workgroup on a context without subgroups (workgroup memory).
    NoSubgroups,
}

const F32: Layout = Layout { dtype: KvDtype::F32, chunk_heads: usize::MAX, split_len: 256, window: None, sinks: false };

fn round_f16(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

/// `x` as a cache of `dtype` holds it, rows of `width` values (a head).
fn round_cache(x: &mut [f32], dtype: KvDtype, width: usize) {
    for row in x.chunks_mut(width) {
        let rounded = dtype.round_trip(row);
        row.copy_from_slice(&rounded);
    }
}

fn check(heads: Heads, t: usize, pos: usize, layout: Layout, seed: u64) {
    check_in(heads, t, pos, layout, seed, KernelLayout::Default);
}

fn check_in(heads: Heads, t: usize, pos: usize, layout: Layout, seed: u64, kernel_layout: KernelLayout) {
    let Heads { n_heads, n_kv_heads, head_dim: hd } = heads;
    let mut rng = Rng::new(seed);
    let q_width = n_heads * hd;
    let kv_width = n_kv_heads * hd;
    let kv_len = pos + t;
    let ctx = kv_len + 7;
    // Queries scaled up so softmaxes are peaked (more sensitive to the max bookkeeping).
    let q = rng.vec(t * q_width, -3.0, 3.0);
    let mut k = rng.vec(ctx * kv_width, -1.0, 1.0);
    let mut v = rng.vec(ctx * kv_width, -1.0, 1.0);
    round_cache(&mut k, layout.dtype, hd);
    round_cache(&mut v, layout.dtype, hd);
    for x in k[kv_len * kv_width..].iter_mut().chain(v[kv_len * kv_width..].iter_mut()) {
        *x = f32::NAN;
    }
    // Before the window of the step's first query: never read.
    let unseen = layout.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    for x in k[..unseen * kv_width].iter_mut().chain(v[..unseen * kv_width].iter_mut()) {
        *x = f32::NAN;
    }

    // Sinks from well below to well above the scores, so either may hold the softmax's max.
    let sinks = layout.sinks.then(|| rng.vec(n_heads, -4.0, 8.0));

    let gpu = match kernel_layout {
        KernelLayout::NoSubgroups => gpu_without_subgroups(),
        _ => gpu(),
    };
    let decode_layout = match kernel_layout {
        KernelLayout::Teams { shared_reduce } => DecodeLayout::Teams { team: 8, shared_reduce },
        KernelLayout::NoSubgroups => DecodeLayout::LaneRows,
        KernelLayout::Default => DecodeLayout::for_gpu(&gpu),
    };
    let step = StepUniform::new(&gpu);
    let qb = upload_f32(&gpu, &q);
    let sinks_b = sinks.as_deref().map(|x| upload_f32(&gpu, x));
    let kb = upload_f32(&gpu, &k);
    let vb = upload_f32(&gpu, &v);
    let ob = upload_f32(&gpu, &vec![-555.0; (t + 1) * q_width]);
    let partial = gpu.storage("partial", partial_bytes(heads, ctx, layout.split_len));
    let per_chunk = layout.chunk_heads.min(n_kv_heads);
    let caches: Vec<_> = (0..n_kv_heads)
        .step_by(per_chunk)
        .map(|h0| {
            let n = per_chunk.min(n_kv_heads - h0);
            let bytes = (n * ctx * layout.dtype.row_bytes(hd)) as u64;
            (h0, n, gpu.storage("k cache", bytes), gpu.storage("v cache", bytes))
        })
        .collect();
    let dtype = layout.dtype;
    fn chunk(c: &(usize, usize, wgpu::Buffer, wgpu::Buffer), context: usize, dtype: KvDtype) -> KvChunk<'_> {
        KvChunk { k: &c.2, v: &c.3, kv_head0: c.0, heads: c.1, context, dtype, ring: false }
    }
    // Every cache row (NaN ones included) written by kv_store.
    step.set(&gpu, ctx, 0);
    let stores: Vec<_> = caches
        .iter()
        .map(|c| KvStore::new(&gpu, &step.buffer, (&kb, &vb), chunk(c, ctx, dtype), n_kv_heads, (hd, hd), None))
        .collect();
    submit(&gpu, |pass| stores.iter().for_each(|s| s.record(&gpu, pass, ctx)));

    step.set(&gpu, t, pos);
    let ops: Vec<_> = caches
        .iter()
        .map(|c| {
            let keys = KeyRange { split_len: layout.split_len, window: layout.window };
            let io = AttentionIo { q: &qb, out: &ob, partial: &partial, sinks: sinks_b.as_ref() };
            Attention::with_layout(&gpu, &step.buffer, io, chunk(c, ctx, dtype), heads, keys, decode_layout)
        })
        .collect();
    let merge = AttentionMerge::new(&gpu, &step.buffer, (&partial, &ob), sinks_b.as_ref(), heads, layout.split_len);
    submit(&gpu, |pass| {
        ops.iter().for_each(|op| op.record(&gpu, pass, t, kv_len));
        if is_split(t, kv_len, layout.split_len) {
            merge.record(&gpu, pass);
        }
    });
    let got = read_f32(&gpu, &ob, (t + 1) * q_width);

    let mut want = vec![0.0f32; t * q_width];
    let shape = refops::HeadShape {
        n_heads,
        n_kv_heads,
        k_dim: hd,
        v_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        window: layout.window,
    };
    for i in 0..t {
        let out = &mut want[i * q_width..(i + 1) * q_width];
        refops::attention_with(&q[i * q_width..(i + 1) * q_width], &k, &v, shape, pos + i + 1, sinks.as_deref(), out);
    }
    let what = format!("attention {heads:?} T={t} pos={pos} {layout:?}");
    assert_close(&what, &got[..t * q_width], &want, TOL);
    assert!(got[t * q_width..].iter().all(|&x| x == -555.0), "{what}: wrote past the step's tokens");
}

/// A context with subgroup operations off (the kernels' workgroup-memory paths).
fn gpu_without_subgroups() -> std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    GPU.get_or_init(|| Gpu::new(&GpuOptions { disable_subgroups: true, ..Default::default() }).expect("an adapter"))
        .clone()
}

fn heads(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Heads {
    Heads { n_heads, n_kv_heads, head_dim }
}

#[test]
fn attention_decode_across_key_tiles() {
    let mut seed = 0;
    for h in [heads(6, 2, 64), heads(6, 3, 40), heads(6, 6, 24), heads(4, 1, 128)] {
        for kv_len in [1usize, 63, 64, 65, 300] {
            seed += 1;
            check(h, 1, kv_len - 1, F32, seed);
        }
    }
}

#[test]
fn attention_prefill_causal() {
    let mut seed = 100;
    for h in [heads(6, 2, 24), heads(6, 3, 64), heads(2, 1, 128), heads(3, 3, 40)] {
        // (T, pos): prefill from 0; chunked prefill continuing at an offset, with the causal
        // boundary inside and across 64-key tiles; ending exactly at / past 300 keys.
        for (t, pos) in [(3usize, 0usize), (17, 0), (9, 55), (17, 47), (3, 62), (17, 283)] {
            seed += 1;
            check(h, t, pos, F32, seed);
        }
    }
}

#[test]
fn attention_head_dim_256() {
    // The largest head_dim the kernel takes: each lane owns 4 chunks of 8 dims (HD256).
    check(heads(2, 1, 256), 1, 64, F32, 200);
    check(heads(2, 2, 256), 9, 60, F32, 201);
}

#[test]
fn split_decode_around_every_split_boundary() {
    // Split lengths of 64 and 128 keys: kv lengths one below, at and one above 1, 2, 3 and 5
    // splits (one split runs the single pass; more run split + merge). The split pass runs a
    // KV head's query heads four at a time: groups of 3, 4, 1, 6 (a set of 4 and one of 2)
    // and 8; groups of 2 and 1 with small heads run the CPU layout's keys-per-lane kernel.
    let mut seed = 300;
    let cases = [
        (64usize, heads(6, 2, 64)),
        (128, heads(4, 1, 40)),
        (64, heads(3, 3, 256)),
        (64, heads(12, 2, 32)),
        (128, heads(8, 1, 64)),
        (64, heads(8, 4, 64)),
        (128, heads(3, 3, 128)),
        (64, heads(2, 2, 40)),
    ];
    for (split_len, h) in cases {
        for splits in [1usize, 2, 3, 5] {
            for kv_len in [splits * split_len - 1, splits * split_len, splits * split_len + 1] {
                seed += 1;
                let layout = Layout { split_len, ..F32 };
                check(h, 1, kv_len - 1, layout, seed);
            }
        }
    }
}

#[test]
fn f16_cache_decode_prefill_and_split() {
    let f16 = Layout { dtype: KvDtype::F16, chunk_heads: usize::MAX, split_len: 64, window: None, sinks: false };
    let mut seed = 400;
    for h in [heads(6, 2, 64), heads(4, 1, 128), heads(3, 3, 24)] {
        for (t, pos) in [(1usize, 0usize), (1, 63), (1, 64), (1, 200), (17, 0), (9, 55)] {
            seed += 1;
            check(h, t, pos, f16, seed);
        }
    }
}

#[test]
fn q8_cache_decode_prefill_and_split() {
    // Blocks of 32 (head dims 64, 128, 256), half rows (48: blocks of 24, 16: of 8) and one
    // block a row (40, 8); grouped and one query head per KV head; chunked KV heads (the scales
    // follow each chunk's codes); windows.
    let mut seed = 450;
    for h in [heads(6, 2, 64), heads(4, 1, 128), heads(2, 1, 256), heads(3, 3, 48), heads(4, 2, 16), heads(2, 2, 40)] {
        for (t, pos) in [(1usize, 0usize), (1, 63), (1, 64), (1, 200), (17, 0), (9, 55)] {
            for (chunk_heads, window) in [(usize::MAX, None), (1, Some(20))] {
                seed += 1;
                let layout = Layout { dtype: KvDtype::Q8_0, chunk_heads, split_len: 64, window, sinks: false };
                check(h, t, pos, layout, seed);
            }
        }
    }
    check(heads(2, 1, 8), 5, 30, Layout { dtype: KvDtype::Q8_0, ..F32 }, 499);
}

#[test]
fn q4_cache_decode_prefill_and_split() {
    // q8_0's layouts with 4-bit codes: blocks of 32, half rows, one block a row; chunked KV
    // heads and windows; the cache written by kv_store, the reference reading its round trip.
    let mut seed = 520;
    for h in [heads(6, 2, 64), heads(4, 1, 128), heads(3, 3, 48), heads(2, 2, 40), heads(2, 1, 8)] {
        for (t, pos) in [(1usize, 0usize), (1, 64), (1, 200), (17, 0), (9, 55)] {
            for (chunk_heads, window) in [(usize::MAX, None), (1, Some(20))] {
                seed += 1;
                let layout = Layout { dtype: KvDtype::Q4_0, chunk_heads, split_len: 64, window, sinks: false };
                check(h, t, pos, layout, seed);
            }
        }
    }
}

#[test]
fn cache_split_into_chunks_of_kv_heads() {
    // One or two KV heads per buffer (as when a long context exceeds the binding limit), f32
    // and f16, single pass and split, groups of 2 and 6.
    let mut seed = 500;
    for dtype in [KvDtype::F32, KvDtype::F16] {
        for chunk_heads in [1usize, 2] {
            for (t, pos) in [(1usize, 150usize), (5, 20), (1, 10)] {
                seed += 1;
                let layout = Layout { dtype, chunk_heads, split_len: 64, window: None, sinks: false };
                check(heads(6, 3, 32), t, pos, layout, seed);
                // Groups of 6 query heads per KV head (split: a set of 4 and one of 2).
                check(heads(18, 3, 32), t, pos, layout, seed + 1000);
            }
        }
    }
}

#[test]
fn sliding_window_decode_prefill_and_split() {
    // Windows of 1 (only the query's own key), 7, 64 and 100 keys: decode before, at and past
    // the window, split decode with the window inside one split and across splits (splits
    // wholly before it contribute nothing), prefill with the window edge inside a tile and
    // the step's queries starting at different keys; f32 and f16 caches, chunked KV heads.
    let mut seed = 600;
    for window in [1usize, 7, 64, 100] {
        for (t, pos) in [(1usize, 0usize), (1, window - 1), (1, window), (1, 300), (17, 0), (9, 55), (17, 283)] {
            for (dtype, chunk_heads) in [(KvDtype::F32, usize::MAX), (KvDtype::F16, 1)] {
                seed += 1;
                let layout = Layout { dtype, chunk_heads, split_len: 64, window: Some(window), sinks: false };
                check(heads(6, 2, 40), t, pos, layout, seed);
                check(heads(4, 2, 40), t, pos, layout, seed + 1000);
            }
        }
    }
}

#[test]
fn attention_sinks_with_and_without_window() {
    // gpt-oss's layers: sinks with full attention and with a sliding window; decode single and
    // split (the merge applies the sink), prefill across tiles; f32 and f16 caches.
    let mut seed = 700;
    for window in [None, Some(20)] {
        for (t, pos) in [(1usize, 0usize), (1, 50), (1, 200), (17, 0), (9, 55)] {
            for dtype in [KvDtype::F32, KvDtype::F16] {
                seed += 1;
                let layout = Layout { dtype, chunk_heads: 1, split_len: 64, window, sinks: true };
                check(heads(8, 2, 64), t, pos, layout, seed);
            }
        }
    }
}

#[test]
fn gqa_group_sizes_and_key_blocks() {
    // Query heads per KV head 1, 2, 3, 4, 5, 8 and 12 (slot sets of 4: full, partial, several
    // per KV head; in the single pass several tokens per set), head_dim 64 (one chunk per
    // lane), 80 (a partial second chunk) and 128; key counts around the 8-key blocks;
    // decode, split decode and prefill from an offset.
    let mut seed = 800;
    for h in [
        heads(4, 4, 64),
        heads(4, 2, 80),
        heads(6, 2, 128),
        heads(8, 2, 64),
        heads(10, 2, 64),
        heads(8, 1, 64),
        heads(24, 2, 64),
    ] {
        for (t, pos) in [(1usize, 6usize), (1, 8), (1, 140), (7, 0), (6, 9), (13, 50)] {
            seed += 1;
            check(h, t, pos, Layout { split_len: 64, ..F32 }, seed);
        }
    }
}

#[test]
fn gpu_and_no_subgroup_layouts() {
    // The eight-teams layout (subgroup shuffles, and workgroup memory) and the CPU layout
    // without subgroups (both of its kernels), on lavapipe: decode, split, prefill, windows,
    // sinks, f16, chunks.
    let f16 = Layout { dtype: KvDtype::F16, chunk_heads: 1, split_len: 64, window: None, sinks: false };
    let cases = [
        (heads(8, 2, 64), 1usize, 200usize, F32),
        (heads(6, 3, 128), 9, 55, f16),
        (heads(12, 1, 256), 1, 100, Layout { window: Some(20), ..f16 }),
        (heads(8, 2, 64), 17, 40, Layout { sinks: true, window: Some(7), ..F32 }),
        (heads(3, 3, 40), 5, 63, f16),
        (heads(8, 4, 64), 1, 200, Layout { window: Some(150), ..f16 }),
    ];
    let mut seed = 900;
    for kl in [
        KernelLayout::Teams { shared_reduce: false },
        KernelLayout::Teams { shared_reduce: true },
        KernelLayout::NoSubgroups,
    ] {
        for (h, t, pos, layout) in cases {
            seed += 1;
            check_in(h, t, pos, layout, seed, kl);
        }
    }
}

/// Decompresses latent rows into per-head keys `[k_nope | k_rope]` and values (the plain MLA
/// form the CPU reference model runs).
fn decompress(c: &[f32], kr: &[f32], kv_b: &[f32], s: refops::MlaShape, len: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    let blk = s.nope + s.v;
    for t in 0..len {
        let mut kv = vec![0.0f32; s.n_heads * blk];
        refops::matvec(kv_b, s.n_heads * blk, s.rank, &c[t * s.rank..(t + 1) * s.rank], &mut kv);
        for head in kv.chunks_exact(blk) {
            keys.extend_from_slice(&head[..s.nope]);
            keys.extend_from_slice(&kr[t * s.rope..(t + 1) * s.rope]);
            values.extend_from_slice(&head[s.nope..]);
        }
    }
    (keys, values)
}

/// An MLA attention case: `t` queries after `pos` cached positions, splits of `split_len` keys.
#[derive(Clone, Copy, Debug)]
struct MlaCase {
    heads: usize,
    rank: usize,
    nope: usize,
    rope: usize,
    v: usize,
    t: usize,
    pos: usize,
    dtype: KvDtype,
    cache: moestream::model::MlaCacheKind,
    split_len: usize,
}

/// `x` as a cache of `dtype` (f16: two halves per u32; q8_0 caches are written by `kv_store`).
fn cache_buffer(gpu: &moestream::gpu::Gpu, x: &[f32], dtype: KvDtype) -> wgpu::Buffer {
    match dtype {
        KvDtype::F32 => upload_f32(gpu, x),
        KvDtype::F16 => {
            let halves: Vec<u16> = x.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            gpu.upload("f16 cache", bytemuck::cast_slice(&halves))
        }
        KvDtype::Q8_0 | KvDtype::Q4_0 => unreachable!("quantized caches are written by kv_store"),
    }
}

/// A cache of `dtype` holding `n` elements, read back as f32.
fn read_cache(gpu: &moestream::gpu::Gpu, b: &wgpu::Buffer, n: usize, dtype: KvDtype) -> Vec<f32> {
    match dtype {
        KvDtype::F32 => read_f32(gpu, b, n),
        KvDtype::F16 => read_u32(gpu, b, n / 2)
            .iter()
            .flat_map(|&w| [w as u16, (w >> 16) as u16].map(|h| half::f16::from_bits(h).to_f32()))
            .collect(),
        KvDtype::Q8_0 | KvDtype::Q4_0 => unreachable!("the decompressed MLA cache has no quantized form"),
    }
}

/// Latent rows `lat` and rotary keys `kr` (`ctx` of each) quantized into q8_0 or q4_0 caches by
/// the cache store, as the decoder writes them; `lat` and `kr` then rounded as the caches hold them.
fn quantized_latent_cache(
    gpu: &moestream::gpu::Gpu,
    step: &StepUniform,
    (lat, kr): (&mut [f32], &mut [f32]),
    (rank, rope, ctx): (usize, usize, usize),
    dtype: KvDtype,
) -> (wgpu::Buffer, wgpu::Buffer) {
    let (a, b) = (
        gpu.storage("q8 latents", (ctx * dtype.row_bytes(rank)) as u64),
        gpu.storage("q8 rotary keys", (ctx * dtype.row_bytes(rope)) as u64),
    );
    let (lb, kb) = (upload_f32(gpu, lat), upload_f32(gpu, kr));
    let chunk = KvChunk { k: &a, v: &b, kv_head0: 0, heads: 1, context: ctx, dtype, ring: false };
    let store = KvStore::new(gpu, &step.buffer, (&lb, &kb), chunk, 1, (rank, rope), None);
    step.set(gpu, ctx, 0);
    submit(gpu, |pass| store.record(gpu, pass, ctx));
    round_cache(lat, dtype, rank);
    round_cache(kr, dtype, rope);
    (a, b)
}

/// `x` laid out `[a, b, d]` as `[b, a, d]`.
fn swap_outer(x: &[f32], a: usize, b: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for i in 0..a {
        for j in 0..b {
            out[(j * a + i) * d..(j * a + i + 1) * d].copy_from_slice(&x[(i * b + j) * d..(i * b + j + 1) * d]);
        }
    }
    out
}

/// Runs MLA attention (latent cache: absorbed; decompressed: the cache written by
/// `mla_decompress` from the same latents, checked against the CPU's decompression) and checks
/// it against plain attention over decompressed keys and values on the CPU (over the cache's
/// rounded values); with the latent cache, the CPU's absorbed form against the same. Latents and
/// decompressed rows past the last visible position hold NaN.
fn check_mla(c: MlaCase, seed: u64) {
    use moestream::model::{MlaCacheKind, MlaSpec};
    use moestream::ops::attention_merge::AttentionMerge;
    use moestream::ops::mla_attention::{
        partial_heads, DecompressedCache, LatentCache, MlaAttention, MlaCacheView, MlaIo,
    };
    use moestream::ops::mla_decompress::{DecompressIn, MlaDecompress};
    use moestream::ops::mla_merge::{MlaMerge, MlaMergeIo};
    let MlaCase { heads, rank, nope, rope, v, t, pos, dtype, cache, split_len } = c;
    let mut rng = Rng::new(seed);
    let m = MlaSpec {
        q_lora_rank: None,
        kv_lora_rank: rank,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope,
        v_head_dim: v,
        softmax_scale: 0.8 / ((nope + rope) as f32).sqrt(),
        cache,
    };
    let s = refops::MlaShape { n_heads: heads, rank, nope, rope, v, scale: m.softmax_scale };
    let (qk, len, ctx) = (nope + rope, pos + t, pos + t + 5);
    let q = rng.vec(t * heads * qk, -1.5, 1.5);
    let mut lat = rng.vec(ctx * rank, -1.0, 1.0);
    let mut kr = rng.vec(ctx * rope, -1.0, 1.0);
    lat[len * rank..].fill(f32::NAN);
    kr[len * rope..].fill(f32::NAN);
    if dtype == KvDtype::F16 && cache == MlaCacheKind::Latent {
        round_f16(&mut lat);
        round_f16(&mut kr);
    }
    let kv_b = rng.vec(heads * (nope + v) * rank, -0.3, 0.3);

    let gpu = gpu();
    let step = StepUniform::new(&gpu);
    let mut q8 = dtype
        .is_quantized()
        .then(|| quantized_latent_cache(&gpu, &step, (&mut lat, &mut kr), (rank, rope, ctx), dtype));
    let (qb, wb) = (upload_f32(&gpu, &q), upload_f32(&gpu, &kv_b));
    let ob = upload_f32(&gpu, &vec![-555.0; t * heads * v]);
    let value_width = match cache {
        MlaCacheKind::Latent => rank,
        MlaCacheKind::Decompressed => v,
    };
    let pheads = partial_heads(heads, value_width);
    let partial = gpu.storage("partials", partial_bytes(pheads, ctx, split_len));
    // What the CPU attends: decompressed keys/values, position-major.
    let (a, b, keys, values) = match cache {
        MlaCacheKind::Latent => {
            let (keys, values) = decompress(&lat, &kr, &kv_b, s, len);
            let (a, b) = q8.take().unwrap_or_else(|| (cache_buffer(&gpu, &lat, dtype), cache_buffer(&gpu, &kr, dtype)));
            (a, b, keys, values)
        }
        MlaCacheKind::Decompressed => {
            let (k_n, v_n) = (heads * ctx * qk, heads * ctx * v);
            let (kc, vc) =
                (cache_buffer(&gpu, &vec![f32::NAN; k_n], dtype), cache_buffer(&gpu, &vec![f32::NAN; v_n], dtype));
            let (cb, krb) = (upload_f32(&gpu, &lat[..len * rank]), upload_f32(&gpu, &kr[..len * rope]));
            let view = DecompressedCache { k: &kc, v: &vc, context: ctx, dtype };
            let store = MlaDecompress::new(
                &gpu,
                &step.buffer,
                DecompressIn { c: &cb, k_rope: &krb, kv_b: &wb },
                view,
                heads,
                &m,
            );
            step.set(&gpu, len, 0);
            submit(&gpu, |pass| store.record(&gpu, pass, len));
            let (k_got, v_got) = (read_cache(&gpu, &kc, k_n, dtype), read_cache(&gpu, &vc, v_n, dtype));
            let (mut keys, mut values) = decompress(&lat, &kr, &kv_b, s, len);
            if dtype == KvDtype::F16 {
                round_f16(&mut keys);
                round_f16(&mut values);
            }
            // Head-major with `ctx` rows per head, rows past `len` untouched (NaN).
            let rows = |x: &[f32], d: usize| -> Vec<f32> {
                (0..heads).flat_map(|h| x[h * ctx * d..(h * ctx + len) * d].to_vec()).collect()
            };
            assert!(k_got[(heads - 1) * ctx * qk + len * qk..].iter().all(|x| x.is_nan()), "rows past len written");
            let f16_tol = if dtype == KvDtype::F16 { 2e-3 } else { TOL };
            assert_close(
                &format!("{c:?} decompressed keys"),
                &rows(&k_got, qk),
                &swap_outer(&keys, len, heads, qk),
                f16_tol,
            );
            assert_close(
                &format!("{c:?} decompressed values"),
                &rows(&v_got, v),
                &swap_outer(&values, len, heads, v),
                f16_tol,
            );
            // The CPU attends exactly what the cache holds.
            let (keys, values) =
                (swap_outer(&rows(&k_got, qk), heads, len, qk), swap_outer(&rows(&v_got, v), heads, len, v));
            (kc, vc, keys, values)
        }
    };
    let view = match cache {
        MlaCacheKind::Latent => MlaCacheView::Latent(LatentCache { c: &a, k_rope: &b, context: ctx, dtype }),
        MlaCacheKind::Decompressed => {
            MlaCacheView::Decompressed(DecompressedCache { k: &a, v: &b, context: ctx, dtype })
        }
    };
    let io = MlaIo { q: &qb, cache: view, kv_b: &wb, out: &ob, partial: &partial };
    let op = MlaAttention::new(&gpu, &step.buffer, io, heads, &m, split_len);
    let merge_latent =
        MlaMerge::new(&gpu, &step.buffer, MlaMergeIo { partial: &partial, kv_b: &wb, out: &ob }, heads, &m, split_len);
    let merge_plain = AttentionMerge::new(&gpu, &step.buffer, (&partial, &ob), None, pheads, split_len);
    step.set(&gpu, t, pos);
    submit(&gpu, |pass| {
        op.record(&gpu, pass, t, len);
        if is_split(t, len, split_len) {
            match cache {
                MlaCacheKind::Latent => merge_latent.record(&gpu, pass),
                MlaCacheKind::Decompressed => merge_plain.record(&gpu, pass),
            }
        }
    });
    let got = read_f32(&gpu, &ob, t * heads * v);

    let shape =
        refops::HeadShape { n_heads: heads, n_kv_heads: heads, k_dim: qk, v_dim: v, scale: s.scale, window: None };
    let mut want = vec![0.0f32; t * heads * v];
    let mut absorbed = vec![0.0f32; t * heads * v];
    for i in 0..t {
        let (qi, out) = (&q[i * heads * qk..(i + 1) * heads * qk], i * heads * v..(i + 1) * heads * v);
        refops::attention_with(qi, &keys, &values, shape, pos + i + 1, None, &mut want[out.clone()]);
        refops::mla_absorbed(qi, &lat, &kr, &kv_b, s, pos + i + 1, &mut absorbed[out]);
    }
    assert_close(&format!("{c:?} GPU"), &got, &want, TOL);
    if cache == MlaCacheKind::Latent {
        assert_close(&format!("{c:?} CPU absorbed"), &absorbed, &want, TOL);
    }
}

/// MLA attention over the latent cache (absorbed) and the decompressed cache, f32 and f16:
/// decode and prefill across key tiles, odd head counts (head sets of four).
#[test]
fn mla_matches_decompressed_reference() {
    use moestream::model::MlaCacheKind;
    let mut seed = 77;
    // (heads, rank, nope, rope, v, tokens, pos)
    for &(heads, rank, nope, rope, v, t, pos) in &[
        (4usize, 32usize, 16usize, 8usize, 16usize, 1usize, 70usize),
        (3, 40, 8, 16, 24, 9, 60),
        (2, 512, 32, 64, 16, 1, 5),
        (6, 64, 24, 8, 32, 5, 130),
    ] {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            for cache in [MlaCacheKind::Latent, MlaCacheKind::Decompressed] {
                seed += 1;
                let c = MlaCase { heads, rank, nope, rope, v, t, pos, dtype, cache, split_len: 256 };
                check_mla(c, seed);
            }
        }
    }
}

/// MLA prefill over 5000 positions at DeepSeek's latent width (rank 512, rope 64): each query's
/// workgroup walks every key, and lavapipe stops an invocation's loops after 65535 iterations
/// in all, so the per-key-tile loops take four dims (and four keys) an iteration (at one an
/// iteration this case was garbage past ~3.5K positions).
#[test]
fn mla_prefill_over_a_long_latent_cache() {
    use moestream::model::MlaCacheKind;
    for (dtype, seed) in [(KvDtype::F16, 1300), (KvDtype::Q8_0, 1301)] {
        let c = MlaCase {
            heads: 2,
            rank: 512,
            nope: 128,
            rope: 64,
            v: 128,
            t: 4,
            pos: 5000,
            dtype,
            cache: MlaCacheKind::Latent,
            split_len: 256,
        };
        check_mla(c, seed);
    }
    // The limit the engine holds MLA prefill to on software adapters covers this case and not
    // the 13,000 positions that were measured wrong.
    let spec = moestream::model::ArchSpec::from_dir(&common::fixtures_dir().join("deepseek_v3")).unwrap();
    let mut m = spec.mla().unwrap().clone();
    (m.kv_lora_rank, m.qk_rope_head_dim) = (512, 64);
    let limit = moestream::ops::mla_attention::software_key_limit(&m);
    assert!((5004..13000).contains(&limit), "{limit}");
}

/// MLA attention over q8_0 and q4_0 latent caches written by the cache store: blocks of 32
/// (rank 512, rope 64), half rows (rank 48, 32) and one block a row (rank 40, rope 8); decode
/// single and split, prefill across key tiles.
#[test]
fn mla_over_a_quantized_latent_cache() {
    use moestream::model::MlaCacheKind;
    let mut seed = 1200;
    for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
        for &(heads, rank, rope, t, pos, split_len) in &[
            (4usize, 32usize, 8usize, 1usize, 70usize, 256usize),
            (3, 40, 16, 9, 60, 256),
            (2, 512, 64, 1, 5, 256),
            (5, 48, 8, 1, 150, 64),
            (6, 64, 8, 5, 130, 256),
        ] {
            seed += 1;
            let c =
                MlaCase { heads, rank, nope: 16, rope, v: 24, t, pos, dtype, cache: MlaCacheKind::Latent, split_len };
            check_mla(c, seed);
        }
    }
}

/// Split-K MLA decode (partials merged by `mla_merge` over the latent cache, by
/// `attention_merge` over the decompressed one) at lengths on both sides of every split
/// boundary, against the single pass's CPU reference; f32 and f16 caches.
#[test]
fn mla_split_decode_around_every_split_boundary() {
    use moestream::model::MlaCacheKind;
    let mut seed = 900;
    for len in [63usize, 64, 65, 127, 128, 129, 191, 192, 193, 250] {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            for cache in [MlaCacheKind::Latent, MlaCacheKind::Decompressed] {
                seed += 1;
                let c = MlaCase {
                    heads: 5,
                    rank: 48,
                    nope: 16,
                    rope: 8,
                    v: 24,
                    t: 1,
                    pos: len - 1,
                    dtype,
                    cache,
                    split_len: 64,
                };
                check_mla(c, seed);
            }
        }
    }
}
