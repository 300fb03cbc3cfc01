//! The second pass of split MLA decode over the latent cache: each head's partial softmax sums
//! merged in latent space, then `W_UV` applied.

use super::params;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::model::MlaSpec;

/// A bound merge of one layer (it reads the layer's `kv_b`).
pub struct MlaMerge {
    kernel: Kernel,
    n_heads: usize,
}

/// The buffers a merge reads and writes.
#[derive(Clone, Copy)]
pub struct MlaMergeIo<'a> {
    /// Partials written by [`super::mla_attention::MlaAttention`]'s split pass over a latent
    /// cache ([`super::mla_attention::partial_heads`] of width `kv_lora_rank`).
    pub partial: &'a wgpu::Buffer,
    /// `kv_b_proj` in f32, `[heads * (nope + v), rank]`.
    pub kv_b: &'a wgpu::Buffer,
    /// Output `[1, heads * v]`.
    pub out: &'a wgpu::Buffer,
}

impl MlaMerge {
    /// Binds `io` for `n_heads` heads of shape `m`, splits of `split_len` keys.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: MlaMergeIo<'_>,
        n_heads: usize,
        m: &MlaSpec,
        split_len: usize,
    ) -> Self {
        let (rank, v) = (m.kv_lora_rank, m.v_head_dim);
        let p = params(&[n_heads as u32, rank as u32, m.qk_nope_head_dim as u32, v as u32, split_len as u32]);
        // Per split each head's partial, read once; `W_UV` and the output once.
        let row = (n_heads * (rank + 2) * 4) as u64;
        let traffic = Traffic {
            fixed: (n_heads * v * (rank + 1) * 4) as u64,
            per_token: 0,
            per_position: row / split_len.max(1) as u64,
        };
        let storage = [io.partial.into(), io.kv_b.into(), io.out.into()];
        let kernel = Kernel::new(gpu, "mla_merge", &[], step, &p, &storage).with_traffic(traffic);
        MlaMerge { kernel, n_heads }
    }

    /// Records the merge (after the split pass).
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass) {
        self.kernel.dispatch(pass, self.n_heads as u32, gpu.caps.max_workgroups_per_dim);
    }
}
