//! The second pass of split (flash-decoding) attention: the partial softmax sums of every split
//! merged into one head's output.

use super::attention::Heads;
use super::params;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// The second pass of split decode attention: partials of every head merged into the output.
pub struct AttentionMerge {
    kernel: Kernel,
    n_heads: usize,
}

impl AttentionMerge {
    /// Binds `partial` (written by [`super::attention::Attention`]'s split pass), `out`
    /// (`[1, n_heads * head_dim]`) and the heads' attention sinks when the model has them.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        (partial, out): (&wgpu::Buffer, &wgpu::Buffer),
        sinks: Option<&wgpu::Buffer>,
        heads: Heads,
        split_len: usize,
    ) -> Self {
        let p = params(&[heads.n_heads as u32, heads.head_dim as u32, split_len as u32]);
        // Per split of `split_len` positions each head's partial (its output and two sums), read
        // once; each head's output written once.
        let row = (heads.n_heads * (heads.head_dim + 2) * 4) as u64;
        let traffic = Traffic {
            fixed: (heads.n_heads * heads.head_dim * 4) as u64,
            per_token: 0,
            per_position: row / split_len.max(1) as u64,
        };
        let kernel = match sinks {
            Some(sinks) => {
                Kernel::new(gpu, "attention_merge", &["SINKS"], step, &p, &[partial.into(), out.into(), sinks.into()])
            }
            None => Kernel::new(gpu, "attention_merge", &[], step, &p, &[partial.into(), out.into()]),
        }
        .with_traffic(traffic);
        AttentionMerge { kernel, n_heads: heads.n_heads }
    }

    /// Records the merge (after every chunk's split pass).
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass) {
        self.kernel.dispatch(pass, self.n_heads as u32, gpu.caps.max_workgroups_per_dim);
    }
}
