//! The chunked gated delta rule's first part: per chunk of the step's tokens and value head, the
//! WY / UT transform (`T = (I + A)^-1` and what it multiplies) into a scratch buffer, every chunk
//! at once (see shaders/delta_chunk_prep.wgsl for the form and the scratch layout).

use super::gated_delta_rule::{DeltaIo, DeltaKernelParams, CHUNK};
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// A bound chunk transform: one workgroup per (chunk, value head).
pub struct DeltaChunkPrep {
    kernel: Kernel,
    v_heads: usize,
}

impl DeltaChunkPrep {
    /// Binds `io`'s inputs and `scratch` (of `params.chunks` chunks) for `params`.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: &DeltaIo<'_>,
        scratch: &wgpu::Buffer,
        params: &DeltaKernelParams,
    ) -> DeltaChunkPrep {
        let s = params.shape;
        // Reads q, k, v and the gates once; writes W, U, Qg, Kd, Aqk per token.
        let per_token = 4 * (params.conv_stride() + s.v_heads * (3 * s.dk + s.dv + CHUNK)) as u64;
        let traffic = Traffic { fixed: 0, per_token, per_position: 0 };
        let buffers = [io.conv.into(), io.proj.into(), io.decay_params.into(), scratch.into()];
        let kernel = Kernel::new(gpu, "delta_chunk_prep", params.defines(), step, &params.words(0), &buffers)
            .with_traffic(traffic);
        DeltaChunkPrep { kernel, v_heads: s.v_heads }
    }

    /// Records the transform of a step of `n` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        let groups = (n.div_ceil(CHUNK) * self.v_heads) as u32;
        self.kernel.dispatch(pass, groups, gpu.caps.max_workgroups_per_dim);
    }
}
