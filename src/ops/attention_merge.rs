//! The second pass of split (flash-decoding) attention: the partial softmax sums of every split
//! merged into one head's output.

use super::attention::Heads;
use super::params;
use crate::gpu::{Gpu, Kernel};

/// The second pass of split decode attention: partials of every head merged into the output.
pub struct AttentionMerge {
    kernel: Kernel,
    n_heads: usize,
}

impl AttentionMerge {
    /// Binds `partial` (written by [`super::attention::Attention`]'s split pass) and `out` (`[1, n_heads * head_dim]`).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        partial: &wgpu::Buffer,
        out: &wgpu::Buffer,
        heads: Heads,
        split_len: usize,
    ) -> Self {
        let p = params(&[heads.n_heads as u32, heads.head_dim as u32, split_len as u32]);
        let kernel = Kernel::new(gpu, "attention_merge", &[], step, &p, &[partial.into(), out.into()]);
        AttentionMerge { kernel, n_heads: heads.n_heads }
    }

    /// Records the merge (after every chunk's split pass).
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>) {
        self.kernel.dispatch(pass, self.n_heads as u32, gpu.caps.max_workgroups_per_dim);
    }
}
