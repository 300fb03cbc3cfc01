//! Log-probability of each given next token (teacher-forced scoring) without reading back logits.

use super::{one_subgroup_layout, params};
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// A bound per-token log-softmax gather.
pub struct TokenLogprob {
    kernel: Kernel,
}

impl TokenLogprob {
    /// Binds `logits` (`[tokens, vocab]`) and `targets` (u32 per token) → `out` (f32 per token).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        logits: &wgpu::Buffer,
        targets: &wgpu::Buffer,
        out: &wgpu::Buffer,
        vocab: usize,
    ) -> TokenLogprob {
        let p = params(&[vocab as u32, 0, 0, 0]);
        TokenLogprob {
            kernel: Kernel::new(
                gpu,
                "token_logprob",
                one_subgroup_layout(gpu).as_slice(),
                step,
                &p,
                &[logits.into(), targets.into(), out.into()],
            )
            .with_traffic(Traffic { fixed: 0, per_token: 4 * vocab as u64 + 8, per_position: 0 }),
        }
    }

    /// Records the gather for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        self.kernel.dispatch(pass, n_tokens as u32, gpu.caps.max_workgroups_per_dim);
    }
}
