//! Router softmax + top-k (+ renormalisation) over router logits.

use super::params;
use crate::gpu::{Gpu, Kernel};

/// A bound router top-k.
pub struct RouterTopK {
    kernel: Kernel,
}

impl RouterTopK {
    /// Binds `logits` (`[tokens, n_experts]`) → `ids` and `weights` (`[tokens, top_k]`).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        logits: &wgpu::Buffer,
        ids: &wgpu::Buffer,
        weights: &wgpu::Buffer,
        n_experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> RouterTopK {
        assert!(n_experts <= 256, "more than 256 experts is rejected at load");
        let p = params(&[n_experts as u32, top_k as u32, renormalize as u32, 0]);
        RouterTopK {
            kernel: Kernel::new(gpu, "router_topk", &[], step, &p, &[logits.into(), ids.into(), weights.into()]),
        }
    }

    /// Records routing for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize) {
        self.kernel.dispatch(pass, n_tokens as u32, gpu.caps.max_workgroups_per_dim);
    }
}
