//! `y = W x (+ bias)` for every token of a step: the decode matvec and the prefill matmul.

use super::{params, GpuMatrix};
use crate::gpu::kernel::Slice;
use crate::gpu::{Gpu, Kernel};

/// Where and how a matmul writes its output.
#[derive(Clone, Copy, Debug)]
pub struct MatMulOut {
    /// Values per output row (the output buffer's width).
    pub stride: usize,
    /// First output column written (when several matrices share one output).
    pub col_offset: usize,
    /// Add to the output instead of overwriting it (fused residual add).
    pub accumulate: bool,
    /// Output rows start at the step's position (writing keys/values into the KV cache).
    pub at_cache_pos: bool,
}

impl MatMulOut {
    /// A plain output of `width` values per token.
    pub fn plain(width: usize) -> Self {
        MatMulOut { stride: width, col_offset: 0, accumulate: false, at_cache_pos: false }
    }
}

/// A bound matmul, one kernel per weight chunk.
pub struct MatMul {
    kernels: Vec<(Kernel, u32)>,
}

impl MatMul {
    /// Binds `x` (`[tokens, w.cols]`) → `y` through `w`, with an optional bias of `w.rows`.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        x: &wgpu::Buffer,
        w: &GpuMatrix,
        bias: Option<&wgpu::Buffer>,
        y: &wgpu::Buffer,
        out: MatMulOut,
    ) -> MatMul {
        let mut defines = Vec::new();
        defines.extend(w.format.defines());
        if bias.is_some() {
            defines.push("BIAS");
        }
        if out.accumulate {
            defines.push("ACCUMULATE");
        }
        let kernels = w
            .chunks
            .iter()
            .map(|c| {
                let p = params(&[
                    w.cols as u32,
                    c.rows as u32,
                    (out.col_offset + c.first_row) as u32,
                    out.stride as u32,
                    out.at_cache_pos as u32,
                    c.first_row as u32,
                    c.offsets.scales,
                    c.offsets.mins,
                ]);
                let mut storage: Vec<Slice> = vec![x.into(), (&c.buffer).into(), y.into()];
                storage.extend(bias.map(Slice::from));
                (Kernel::new(gpu, "matmul", &defines, step, &p, &storage), c.rows as u32)
            })
            .collect();
        MatMul { kernels }
    }

    /// Records the dispatches for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize) {
        for (k, rows) in &self.kernels {
            k.dispatch(pass, rows * n_tokens.div_ceil(8) as u32, gpu.caps.max_workgroups_per_dim);
        }
    }
}
