//! SwiGLU activation of a fused gate|up projection.

use super::{groups64, params};
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// A bound SwiGLU: `h = silu(gate) * up` from `gu = [gate | up]`.
pub struct SwiGlu {
    kernel: Kernel,
    inter: usize,
}

impl SwiGlu {
    /// Binds `gu` (`[tokens, 2 * inter]`) → `h` (`[tokens, inter]`).
    pub fn new(gpu: &Gpu, step: &wgpu::Buffer, gu: &wgpu::Buffer, h: &wgpu::Buffer, inter: usize) -> SwiGlu {
        let p = params(&[inter as u32, 0, 0, 0]);
        let traffic = Traffic { fixed: 0, per_token: 12 * inter as u64, per_position: 0 };
        SwiGlu {
            kernel: Kernel::new(gpu, "swiglu", &[], step, &p, &[gu.into(), h.into()]).with_traffic(traffic),
            inter,
        }
    }

    /// Records the activation for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        self.kernel.dispatch(pass, groups64(n_tokens * self.inter), gpu.caps.max_workgroups_per_dim);
    }
}
