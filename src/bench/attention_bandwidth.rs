//! Decode attention bandwidth: one token's split-K attention (split pass + merge) over an f16
//! or q8_0 KV cache of a given depth, timed like the matvecs of [`super::kernels`] and counted
//! in KV bytes read (every cached key and value once), so it compares directly with the read
//! roofline: a decode step's attention costs what its cache bytes cost when this ratio is ~1.

use serde::Serialize;

use super::kernels::{replicas, time_ops, KernelBenchOptions};
use crate::error::Result;
use crate::gpu::{Gpu, StepUniform};
use crate::ops::attention::{is_split, partial_bytes, split_len, Attention, AttentionIo, Heads, KeyRange};
use crate::ops::attention_merge::AttentionMerge;
use crate::ops::kv_store::{KvChunk, KvDtype};
use crate::util::rng::SplitMix64;

/// The attention shape measured by default: Qwen3-30B-A3B's (32 query heads sharing 4 KV heads
/// of 128).
pub const BENCH_HEADS: Heads = Heads { n_heads: 32, n_kv_heads: 4, head_dim: 128 };

/// Decode attention over `kv_len` cached positions.
#[derive(Clone, Debug, Serialize)]
pub struct AttentionBandwidth {
    /// Cached positions the token attends to.
    pub kv_len: usize,
    /// The cache's element type.
    pub dtype: &'static str,
    /// Query heads, KV heads, head dimension.
    pub heads: [usize; 3],
    /// KV-cache bytes read per second (10^9).
    pub gbps: f64,
    /// Microseconds per decode attention (split pass + merge).
    pub us: f64,
    /// KV-cache bytes per decode attention.
    pub bytes: u64,
}

/// Times decode attention of `o.attention_heads` over `kv_len` positions of a `dtype` cache.
pub fn measure(gpu: &Gpu, o: &KernelBenchOptions, kv_len: usize, dtype: KvDtype) -> Result<AttentionBandwidth> {
    let heads = o.attention_heads;
    if kv_len == 0 {
        return Err(crate::Error::InvalidArgument("bench kernels needs --kv-len > 0".into()));
    }
    if heads.n_kv_heads == 0
        || !heads.n_heads.is_multiple_of(heads.n_kv_heads)
        || heads.head_dim == 0
        || heads.head_dim > 256
        || !heads.head_dim.is_multiple_of(8)
    {
        return Err(crate::Error::InvalidArgument(format!(
            "--attention-heads {},{},{}: query heads must be a multiple of the KV heads and head_dim a multiple of 8 up to 256",
            heads.n_heads, heads.n_kv_heads, heads.head_dim
        )));
    }
    let side_bytes = (kv_len * heads.n_kv_heads * dtype.row_bytes(heads.head_dim)) as u64;
    if side_bytes > gpu.caps.max_binding {
        return Err(crate::Error::InvalidArgument(format!(
            "--kv-len {kv_len}: {side_bytes} bytes of keys exceed one binding ({} bytes)",
            gpu.caps.max_binding
        )));
    }
    let bytes = 2 * side_bytes;
    let mut rng = SplitMix64::new(3);
    let x: Vec<f32> = (0..heads.n_heads * heads.head_dim).map(|_| rng.next_signed()).collect();
    let q = gpu.upload("bench attention q", bytemuck::cast_slice(&x));
    // Random values in (-1, 1) as the cache holds them: f16 pairs, or q8_0's random codes
    // followed by scales of 1/127 (the speed does not depend on the values).
    let mut random_buffer = |label: &str| {
        let halves: Vec<half::f16> = match dtype {
            KvDtype::Q8_0 => {
                let codes = kv_len * heads.n_kv_heads * heads.head_dim / 2;
                let scales = side_bytes as usize / 2 - codes;
                let code_pairs = (0..codes).map(|_| half::f16::from_bits(rng.next_u64() as u16 & 0x7f7f));
                code_pairs.chain((0..scales).map(|_| half::f16::from_f32(1.0 / 127.0))).collect()
            }
            _ => (0..side_bytes as usize / 2).map(|_| half::f16::from_f32(rng.next_signed())).collect(),
        };
        gpu.upload(label, bytemuck::cast_slice(&halves))
    };
    let caches: Vec<(wgpu::Buffer, wgpu::Buffer)> =
        (0..replicas(o, bytes)).map(|_| (random_buffer("bench k"), random_buffer("bench v"))).collect();
    let split = split_len(gpu, heads, kv_len);
    let partial = gpu.storage("bench attention partials", partial_bytes(heads, kv_len, split));
    let out = gpu.storage("bench attention out", (heads.n_heads * heads.head_dim * 4) as u64);
    let step = StepUniform::new(gpu);
    step.set(gpu, 1, kv_len - 1);
    let kernels: Vec<Attention> = caches
        .iter()
        .map(|(k, v)| {
            let chunk = KvChunk { k, v, kv_head0: 0, heads: heads.n_kv_heads, context: kv_len, dtype, ring: false };
            let io = AttentionIo { q: &q, out: &out, partial: &partial, sinks: None };
            Attention::new(gpu, &step.buffer, io, chunk, heads, KeyRange { split_len: split, window: None })
        })
        .collect();
    let merge = AttentionMerge::new(gpu, &step.buffer, (&partial, &out), None, heads, split);
    let seconds = time_ops(gpu, o.seconds, kernels.len(), |pass, n| {
        for i in 0..n {
            kernels[i % kernels.len()].record(gpu, pass, 1, kv_len);
            if is_split(1, kv_len, split) {
                merge.record(gpu, pass);
            }
        }
    })?;
    Ok(AttentionBandwidth {
        kv_len,
        dtype: dtype.name(),
        heads: [heads.n_heads, heads.n_kv_heads, heads.head_dim],
        gbps: bytes as f64 / seconds / 1e9,
        us: seconds * 1e6,
        bytes,
    })
}
