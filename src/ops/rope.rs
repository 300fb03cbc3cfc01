//! Rotary position embedding with a host-computed cos/sin table.

use super::{groups64, params};
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel};

/// cos and sin of every (position, frequency) pair, computed like transformers does in f32:
/// `inv_freq = 1 / theta^(2i/d)`, `angle = pos * inv_freq`.
pub fn rope_tables(theta: f32, head_dim: usize, positions: usize) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32)).collect();
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for p in 0..positions {
        for f in &inv {
            let angle = (p as f32 * f) as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// A bound in-place RoPE over `n_heads` heads per token.
pub struct Rope {
    kernel: Kernel,
    pairs_per_token: usize,
}

impl Rope {
    /// Rotates `x` (`[tokens, n_heads * head_dim]`, or KV-cache rows when `at_cache_pos`).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        tables: (&wgpu::Buffer, &wgpu::Buffer),
        x: &wgpu::Buffer,
        n_heads: usize,
        head_dim: usize,
        at_cache_pos: bool,
    ) -> Rope {
        let p = params(&[n_heads as u32, head_dim as u32, at_cache_pos as u32, 0]);
        // Per token its rows in and out and one cos/sin row.
        let traffic = Traffic { fixed: 0, per_token: 4 * (2 * n_heads * head_dim + head_dim) as u64, per_position: 0 };
        let kernel = Kernel::new(gpu, "rope", &[], step, &p, &[tables.0.into(), tables.1.into(), x.into()])
            .with_traffic(traffic);
        Rope { kernel, pairs_per_token: n_heads * head_dim / 2 }
    }

    /// Records the rotation for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize) {
        self.kernel.dispatch(pass, groups64(n_tokens * self.pairs_per_token), gpu.caps.max_workgroups_per_dim);
    }
}
