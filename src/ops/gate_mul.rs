//! Multiplying activations by a gate: `y *= sigmoid(g)` or `y *= silu(g)`, one gate value per
//! activation or per `span` of them.

use super::{groups64, params};
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::model::GateAct;

/// Where the gate values of each token are: `width / span` values at `offset` of rows `stride`
/// wide.
#[derive(Clone, Copy, Debug)]
pub struct GateRows {
    /// Values gated per token (`y` is `[tokens, width]`).
    pub width: usize,
    /// Consecutive values one gate value scales (1, or a head's width for a per-head gate).
    pub span: usize,
    /// Values per token of the gate buffer.
    pub stride: usize,
    /// First gate value of a token's row.
    pub offset: usize,
}

/// A bound gate multiplication.
pub struct GateMul {
    kernel: Kernel,
    width: usize,
}

impl GateMul {
    /// Binds gate `g` and activations `y` (gated in place).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        (g, y): (&wgpu::Buffer, &wgpu::Buffer),
        rows: GateRows,
        act: GateAct,
    ) -> GateMul {
        let p = params(&[rows.width as u32, rows.stride as u32, rows.offset as u32, rows.span.max(1) as u32]);
        let defines: &[&str] = match act {
            GateAct::Sigmoid => &[],
            GateAct::Silu => &["SILU"],
        };
        let traffic = Traffic { fixed: 0, per_token: 12 * rows.width as u64, per_position: 0 };
        let kernel = Kernel::new(gpu, "gate_mul", defines, step, &p, &[g.into(), y.into()]).with_traffic(traffic);
        GateMul { kernel, width: rows.width }
    }

    /// Records the gating of `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        self.kernel.dispatch(pass, groups64(n_tokens * self.width), gpu.caps.max_workgroups_per_dim);
    }
}
