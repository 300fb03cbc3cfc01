//! Causal grouped-query attention against the KV cache (decode and prefill).

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
    /// Dimension of a head (at most 256).
    pub head_dim: usize,
}

/// A bound attention.
pub struct Attention {
    kernel: Kernel,
    n_heads: usize,
}

impl Attention {
    /// Binds queries `q` (`[tokens, heads*head_dim]`), the caches and the output.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        q: &wgpu::Buffer,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        out: &wgpu::Buffer,
        heads: Heads,
    ) -> Attention {
        assert!(heads.head_dim <= 256, "head_dim above 256 is rejected at load");
        let scale = 1.0 / (heads.head_dim as f32).sqrt();
        let p = params(&[heads.n_heads as u32, heads.n_kv_heads as u32, heads.head_dim as u32, scale.to_bits()]);
        // Per cached position its f32 key and value; per query token its query and output.
        let traffic = Traffic {
            fixed: 0,
            per_token: 8 * (heads.n_heads * heads.head_dim) as u64,
            per_position: 8 * (heads.n_kv_heads * heads.head_dim) as u64,
        };
        let kernel =
            Kernel::new(gpu, "attention", &[], step, &p, &[q.into(), k_cache.into(), v_cache.into(), out.into()])
                .with_traffic(traffic);
        Attention { kernel, n_heads: heads.n_heads }
    }

    /// Records attention for `n_tokens` queries.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize) {
        self.kernel.dispatch(pass, (n_tokens * self.n_heads) as u32, gpu.caps.max_workgroups_per_dim);
    }
}
