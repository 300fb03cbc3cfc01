//! Causal multi-head latent attention in the absorbed form (decode and prefill), reading only
//! the latent cache: `W_UK` is folded into each query, `W_UV` applied after attention.

use super::params;
use crate::gpu::{Gpu, Kernel};
use crate::model::MlaSpec;

/// Largest `kv_lora_rank` the kernel holds in workgroup memory.
pub const MAX_RANK: usize = 512;
/// Largest `qk_rope_head_dim`.
pub const MAX_ROPE: usize = 128;

/// The latent cache of one layer: normalised latents `[positions, kv_lora_rank]` and the rotated
/// shared keys `[positions, qk_rope_head_dim]`.
pub struct LatentCache<'a> {
    /// Latents `c`.
    pub c: &'a wgpu::Buffer,
    /// Rotary keys.
    pub k_rope: &'a wgpu::Buffer,
}

/// A bound MLA attention.
pub struct MlaAttention {
    kernel: Kernel,
    n_heads: usize,
}

impl MlaAttention {
    /// Binds queries `q` (`[tokens, heads, nope + rope]`, rotary part rotated), the latent
    /// cache, `kv_b` (f32 `[heads * (nope + v), rank]`) and `out` (`[tokens, heads * v]`).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        q: &wgpu::Buffer,
        cache: LatentCache<'_>,
        kv_b: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n_heads: usize,
        m: &MlaSpec,
    ) -> MlaAttention {
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
        let storage = [q.into(), cache.c.into(), cache.k_rope.into(), kv_b.into(), out.into()];
        MlaAttention { kernel: Kernel::new(gpu, "mla_attention", &[], step, &p, &storage), n_heads }
    }

    /// Records attention for `n_tokens` queries.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize) {
        self.kernel.dispatch(pass, (n_tokens * self.n_heads) as u32, gpu.caps.max_workgroups_per_dim);
    }
}
