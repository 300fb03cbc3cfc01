//! Embedding lookup from a (possibly chunked) table.

use super::{groups64, params, GpuMatrix};
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// A bound embedding lookup: token ids → hidden states.
pub struct Embed {
    kernels: Vec<Kernel>,
    hidden: usize,
}

impl Embed {
    /// Binds `tokens` (u32 ids) and `table` (`[vocab, hidden]`) → `x` (`[tokens, hidden]`).
    pub fn new(gpu: &Gpu, step: &wgpu::Buffer, tokens: &wgpu::Buffer, table: &GpuMatrix, x: &wgpu::Buffer) -> Embed {
        let defines = table.defines();
        let kernels = table
            .chunks
            .iter()
            .map(|c| {
                let p = params(&[
                    table.cols as u32,
                    c.first_row as u32,
                    c.rows as u32,
                    0,
                    c.offsets.scales,
                    c.offsets.mins,
                    0,
                    0,
                ]);
                // Per token one table row (at the table's bytes per value) and its f32 output.
                let row_bytes = c.buffer.size() / c.rows.max(1) as u64;
                let traffic = Traffic { fixed: 0, per_token: row_bytes + 4 * table.cols as u64, per_position: 0 };
                Kernel::new(gpu, "embed", &defines, step, &p, &[tokens.into(), (&c.buffer).into(), x.into()])
                    .with_traffic(traffic)
            })
            .collect();
        Embed { kernels, hidden: table.cols }
    }

    /// Records the lookups for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        for k in &self.kernels {
            k.dispatch(pass, groups64(n_tokens * self.hidden), gpu.caps.max_workgroups_per_dim);
        }
    }
}
