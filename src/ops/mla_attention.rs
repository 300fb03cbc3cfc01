//! Causal multi-head latent attention in the absorbed form (decode and prefill), reading only
//! the latent cache: `W_UK` is folded into each query, `W_UV` applied after attention.

use super::kv_store::KvDtype;
use super::params;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel};
use crate::model::MlaSpec;

/// Largest `kv_lora_rank` the kernel holds in workgroup memory.
pub const MAX_RANK: usize = 512;
/// Largest `qk_rope_head_dim`.
pub const MAX_ROPE: usize = 128;

/// The latent cache of one layer: normalised latents `[positions, kv_lora_rank]` and the rotated
/// shared keys `[positions, qk_rope_head_dim]`, in `dtype` (f16: two halves per u32).
#[derive(Clone, Copy)]
pub struct LatentCache<'a> {
    /// Latents `c`.
    pub c: &'a wgpu::Buffer,
    /// Rotary keys.
    pub k_rope: &'a wgpu::Buffer,
    /// Element type of both.
    pub dtype: KvDtype,
}

/// What an MLA attention reads and writes.
#[derive(Clone, Copy)]
pub struct MlaIo<'a> {
    /// Queries `[tokens, heads, nope + rope]`, rotary part rotated.
    pub q: &'a wgpu::Buffer,
    /// The layer's latent cache.
    pub cache: LatentCache<'a>,
    /// `kv_b_proj` in f32, `[heads * (nope + v), rank]`.
    pub kv_b: &'a wgpu::Buffer,
    /// Output `[tokens, heads * v]`.
    pub out: &'a wgpu::Buffer,
}

/// A bound MLA attention.
pub struct MlaAttention {
    kernel: Kernel,
    n_heads: usize,
}

impl MlaAttention {
    /// Binds `io` for `n_heads` heads of shape `m`.
    pub fn new(gpu: &Gpu, step: &wgpu::Buffer, io: MlaIo<'_>, n_heads: usize, m: &MlaSpec) -> MlaAttention {
        assert!(m.kv_lora_rank <= MAX_RANK && m.qk_rope_head_dim <= MAX_ROPE, "MLA limits are checked at load");
        let p = params(&[
            n_heads as u32,
            m.kv_lora_rank as u32,
            m.qk_nope_head_dim as u32,
            m.qk_rope_head_dim as u32,
            m.v_head_dim as u32,
            m.softmax_scale.to_bits(),
            0,
            0,
        ]);
        let storage = [io.q.into(), io.cache.c.into(), io.cache.k_rope.into(), io.kv_b.into(), io.out.into()];
        // Per cached position its latent and rotary key; per query token its query, output and
        // the absorbed `kv_b` (read by every head of every token).
        let rank = m.kv_lora_rank;
        let dtype = io.cache.dtype;
        let traffic = Traffic {
            fixed: 0,
            per_token: 4
                * (n_heads * (m.qk_head_dim() + m.v_head_dim + (m.qk_nope_head_dim + m.v_head_dim) * rank)) as u64,
            per_position: (dtype.bytes() * (rank + m.qk_rope_head_dim)) as u64,
        };
        let kernel = Kernel::new(gpu, "mla_attention", dtype.defines(), step, &p, &storage).with_traffic(traffic);
        MlaAttention { kernel, n_heads }
    }

    /// Records attention for `n_tokens` queries.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize) {
        self.kernel.dispatch(pass, (n_tokens * self.n_heads) as u32, gpu.caps.max_workgroups_per_dim);
    }
}
