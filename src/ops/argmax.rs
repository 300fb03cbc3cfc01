//! Greedy token choice on the GPU, so greedy decoding reads back 4 bytes, not the logits.

use super::{one_subgroup_layout, params};
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// A bound argmax over the last token's logits.
pub struct Argmax {
    kernel: Kernel,
}

impl Argmax {
    /// Binds `logits` (`[tokens, vocab]`) → `out` (one u32).
    pub fn new(gpu: &Gpu, step: &wgpu::Buffer, logits: &wgpu::Buffer, out: &wgpu::Buffer, vocab: usize) -> Argmax {
        let p = params(&[vocab as u32, 0, 0, 0]);
        let traffic = Traffic { fixed: 4 * vocab as u64, per_token: 0, per_position: 0 };
        // Rows of a multiple of 4 logits start on 16 bytes: read as vec4s.
        let defines: Vec<&str> =
            vocab.is_multiple_of(4).then_some("VEC4").into_iter().chain(one_subgroup_layout(gpu)).collect();
        let kernel = Kernel::new(gpu, "argmax", &defines, step, &p, &[logits.into(), out.into()]);
        Argmax { kernel: kernel.with_traffic(traffic) }
    }

    /// Records the argmax of the step's last token.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass) {
        self.kernel.dispatch(pass, 1, gpu.caps.max_workgroups_per_dim);
    }
}
