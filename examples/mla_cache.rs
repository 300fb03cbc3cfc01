//! One layer's MLA decode attention at a given depth with DeepSeek-V2-Lite's sizes (16 heads,
//! kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128), over the two cache forms the engine
//! runs: the latent cache (absorbed `mla_attention`, split-K, `mla_merge`) and the decompressed
//! per-head K/V cache (`mla_decompress` of the step's token, plain `mla_attention`, split-K,
//! `attention_merge`), both f16. Prints the KV bytes per token of one layer and the time of one
//! decode step's attention, the same kernels `--mla-cache latent|decompressed` records.
//!
//! `cargo run --release --example mla_cache -- [DEPTH] [STEPS]` (default 4096 positions, 20 steps).

use std::time::Instant;

use moestream::gpu::{Gpu, GpuOptions, Pass, StepUniform};
use moestream::model::{MlaCacheKind, MlaSpec};
use moestream::ops::attention::{is_split, partial_bytes, split_len};
use moestream::ops::attention_merge::AttentionMerge;
use moestream::ops::mla_attention::{partial_heads, DecompressedCache, LatentCache, MlaAttention, MlaCacheView, MlaIo};
use moestream::ops::mla_decompress::{DecompressIn, MlaDecompress};
use moestream::ops::mla_merge::{MlaMerge, MlaMergeIo};
use moestream::ops::KvDtype;

const HEADS: usize = 16;

/// `n` seeded values in [-1, 1) (a xorshift; the values do not matter, only the work).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn f32_buffer(gpu: &Gpu, n: usize, seed: u64) -> wgpu::Buffer {
    gpu.upload("f32", bytemuck::cast_slice(&values(n, seed)))
}

fn f16_buffer(gpu: &Gpu, n: usize, seed: u64) -> wgpu::Buffer {
    let halves: Vec<u16> = values(n, seed).iter().map(|&v| half::f16::from_f32(v * 0.5).to_bits()).collect();
    gpu.upload("f16 cache", bytemuck::cast_slice(&halves))
}

fn main() -> moestream::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (depth, steps) = (args.first().copied().unwrap_or(4096), args.get(1).copied().unwrap_or(20));
    let gpu = Gpu::new(&GpuOptions::default())?;
    println!("adapter {}; one layer, {HEADS} heads, decode at depth {depth}, f16 cache", gpu.adapter.name);
    let dtype = KvDtype::F16;
    let kv_len = depth + 1;
    let step = StepUniform::new(&gpu);
    for cache in [MlaCacheKind::Latent, MlaCacheKind::Decompressed] {
        let m = MlaSpec {
            q_lora_rank: None,
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
            softmax_scale: 1.0 / (192f32).sqrt(),
            cache,
        };
        let value_width = match cache {
            MlaCacheKind::Latent => m.kv_lora_rank,
            MlaCacheKind::Decompressed => m.v_head_dim,
        };
        let heads = partial_heads(HEADS, value_width);
        let split = split_len(&gpu, heads, kv_len);
        let q = f32_buffer(&gpu, HEADS * m.qk_head_dim(), 1);
        let kv_b = f32_buffer(&gpu, HEADS * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank, 2);
        let (c, kr) = (f32_buffer(&gpu, m.kv_lora_rank, 3), f32_buffer(&gpu, m.qk_rope_head_dim, 4));
        let out = gpu.storage("out", (HEADS * m.v_head_dim * 4) as u64);
        let partial = gpu.storage("partials", partial_bytes(heads, kv_len, split));
        let (a, b) = match cache {
            MlaCacheKind::Latent => (f16_buffer(&gpu, kv_len * 512, 5), f16_buffer(&gpu, kv_len * 64, 6)),
            MlaCacheKind::Decompressed => {
                (f16_buffer(&gpu, HEADS * kv_len * 192, 5), f16_buffer(&gpu, HEADS * kv_len * 128, 6))
            }
        };
        let (view, store) = match cache {
            MlaCacheKind::Latent => {
                (MlaCacheView::Latent(LatentCache { c: &a, k_rope: &b, context: kv_len, dtype }), None)
            }
            MlaCacheKind::Decompressed => {
                let d = DecompressedCache { k: &a, v: &b, context: kv_len, dtype };
                let input = DecompressIn { c: &c, k_rope: &kr, kv_b: &kv_b };
                (MlaCacheView::Decompressed(d), Some(MlaDecompress::new(&gpu, &step.buffer, input, d, HEADS, &m)))
            }
        };
        let io = MlaIo { q: &q, cache: view, kv_b: &kv_b, out: &out, partial: &partial };
        let attention = MlaAttention::new(&gpu, &step.buffer, io, HEADS, &m, split);
        let latent_merge = MlaMerge::new(
            &gpu,
            &step.buffer,
            MlaMergeIo { partial: &partial, kv_b: &kv_b, out: &out },
            HEADS,
            &m,
            split,
        );
        let plain_merge = AttentionMerge::new(&gpu, &step.buffer, (&partial, &out), None, heads, split);
        step.set(&gpu, 1, depth);
        let run = || -> moestream::Result<()> {
            let mut pass = Pass::new(&gpu.device);
            if let Some(s) = &store {
                s.record(&gpu, &mut pass, 1);
            }
            attention.record(&gpu, &mut pass, 1, kv_len);
            if is_split(1, kv_len, split) {
                match cache {
                    MlaCacheKind::Latent => latent_merge.record(&gpu, &mut pass),
                    MlaCacheKind::Decompressed => plain_merge.record(&gpu, &mut pass),
                }
            }
            pass.submit(&gpu.queue);
            gpu.wait()
        };
        for _ in 0..2 {
            run()?;
        }
        let start = Instant::now();
        for _ in 0..steps {
            run()?;
        }
        let ms = start.elapsed().as_secs_f64() * 1e3 / steps as f64;
        let kv_bytes = m.cached_row_bytes(HEADS, dtype);
        println!(
            "{:<13} KV bytes/token/layer {kv_bytes:>6}  KV MiB at depth {depth}: {:>6.1}  decode attention {ms:>8.2} ms/layer ({} splits of {split})",
            format!("{cache:?}"),
            (kv_bytes * depth) as f64 / 1048576.0,
            kv_len.div_ceil(split),
        );
    }
    Ok(())
}
