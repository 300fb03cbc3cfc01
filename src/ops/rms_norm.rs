//! RMSNorm over rows (whole hidden states, single heads, or whole projections).

use super::params;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel};

/// Which rows a norm touches.
#[derive(Clone, Copy, Debug)]
pub struct NormRows {
    /// Values per row.
    pub n: usize,
    /// Rows per token (heads for a per-head q/k norm, else 1).
    pub rows_per_token: usize,
    /// Rows start at the step's position (normalising keys already in the KV cache).
    pub at_cache_pos: bool,
}

/// A bound RMSNorm.
pub struct RmsNorm {
    kernel: Kernel,
    rows_per_token: usize,
}

impl RmsNorm {
    /// Normalises `x` in place, or into `out` when given, with `weight` (`n` f32 values).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        x: &wgpu::Buffer,
        out: Option<&wgpu::Buffer>,
        rows: NormRows,
        eps: f32,
    ) -> RmsNorm {
        let p = params(&[rows.n as u32, rows.rows_per_token as u32, eps.to_bits(), rows.at_cache_pos as u32]);
        let kernel = match out {
            Some(o) => Kernel::new(gpu, "rms_norm", &["OUT"], step, &p, &[weight.into(), x.into(), o.into()]),
            None => Kernel::new(gpu, "rms_norm", &[], step, &p, &[weight.into(), x.into()]),
        };
        // Per token its rows in and out; the weight once.
        let per_token = 8 * (rows.n * rows.rows_per_token) as u64;
        let kernel = kernel.with_traffic(Traffic { fixed: 4 * rows.n as u64, per_token, per_position: 0 });
        RmsNorm { kernel, rows_per_token: rows.rows_per_token }
    }

    /// Records the norm for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize) {
        self.kernel.dispatch(pass, (n_tokens * self.rows_per_token) as u32, gpu.caps.max_workgroups_per_dim);
    }
}
