//! Sum of the routed experts' outputs (and the gated shared expert) into the residual stream.

use super::{groups64, params};
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// A bound MoE combine.
pub struct MoeCombine {
    kernel: Kernel,
    hidden: usize,
}

impl MoeCombine {
    /// Adds the `top_k` rows of `y` per token (and `sigmoid(gate) * out` of the shared expert
    /// when `shared = Some((out, gate))`) into `x`.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        y: &wgpu::Buffer,
        x: &wgpu::Buffer,
        shared: Option<(&wgpu::Buffer, &wgpu::Buffer)>,
        hidden: usize,
        top_k: usize,
    ) -> MoeCombine {
        let p = params(&[hidden as u32, top_k as u32, 0, 0]);
        let mut storage: Vec<Slice> = vec![y.into(), x.into()];
        let defines: &[&str] = match shared {
            Some((out, gate)) => {
                storage.push(out.into());
                storage.push(gate.into());
                &["SHARED"]
            }
            None => &[],
        };
        // Per token: its top-k expert rows, the residual row in and out (and the shared expert's).
        let rows = top_k + 2 + if shared.is_some() { 1 } else { 0 };
        let traffic = Traffic { fixed: 0, per_token: 4 * (rows * hidden) as u64, per_position: 0 };
        let kernel = Kernel::new(gpu, "moe_combine", defines, step, &p, &storage).with_traffic(traffic);
        MoeCombine { kernel, hidden }
    }

    /// Records the combine for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        self.kernel.dispatch(pass, groups64(n_tokens * self.hidden), gpu.caps.max_workgroups_per_dim);
    }
}
