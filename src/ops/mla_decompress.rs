//! The decompressed MLA cache's store: each step token's per-head keys `[W_UK c | k_rope]` and
//! values `W_UV c`, computed from its latent and written into the cache (the layout
//! [`super::mla_attention::DecompressedCache`] describes).

use super::mla_attention::DecompressedCache;
use super::params;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::model::MlaSpec;

/// A bound store into one layer's decompressed cache.
pub struct MlaDecompress {
    kernel: Kernel,
    n_heads: usize,
}

/// The step's inputs of a decompression.
#[derive(Clone, Copy)]
pub struct DecompressIn<'a> {
    /// Normalised latents `[tokens, kv_lora_rank]` f32.
    pub c: &'a wgpu::Buffer,
    /// Rotated rotary keys `[tokens, qk_rope_head_dim]` f32.
    pub k_rope: &'a wgpu::Buffer,
    /// `kv_b_proj` in f32, `[heads * (nope + v), rank]`.
    pub kv_b: &'a wgpu::Buffer,
}

impl MlaDecompress {
    /// Binds `input` and `cache` for `n_heads` heads of shape `m` (`qk_nope_head_dim` and
    /// `v_head_dim` even: rows are stored in pairs).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        input: DecompressIn<'_>,
        cache: DecompressedCache<'_>,
        n_heads: usize,
        m: &MlaSpec,
    ) -> MlaDecompress {
        let (rank, nope, v) = (m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim);
        assert!(nope.is_multiple_of(2) && v.is_multiple_of(2), "checked at load");
        let p = params(&[
            n_heads as u32,
            rank as u32,
            nope as u32,
            m.qk_rope_head_dim as u32,
            v as u32,
            cache.context as u32,
        ]);
        // Per token: its latent and rotary key, `kv_b`, and every head's key and value written.
        let written = n_heads * (cache.dtype.row_bytes(m.qk_head_dim()) + cache.dtype.row_bytes(v));
        let traffic = Traffic {
            fixed: 0,
            per_token: (4 * (rank + m.qk_rope_head_dim + n_heads * (nope + v) * rank) + written) as u64,
            per_position: 0,
        };
        let storage = [input.c.into(), input.k_rope.into(), input.kv_b.into(), cache.k.into(), cache.v.into()];
        let kernel =
            Kernel::new(gpu, "mla_decompress", super::kv_store::dtype_defines(cache.dtype), step, &p, &storage)
                .with_traffic(traffic);
        MlaDecompress { kernel, n_heads }
    }

    /// Records the store of `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        self.kernel.dispatch(pass, (n_tokens * self.n_heads) as u32, gpu.caps.max_workgroups_per_dim);
    }
}
