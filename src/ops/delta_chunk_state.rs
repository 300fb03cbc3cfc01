//! The chunked gated delta rule's second part: the step's chunks in order over the recurrent
//! state, from the scratch [`super::delta_chunk_prep`] wrote, a dispatch per chunk, one
//! workgroup per value head and block of 64 of the state's columns, a column per invocation
//! (see shaders/delta_chunk_state.wgsl).

use super::gated_delta_rule::{DeltaIo, DeltaKernelParams, CHUNK};
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// Columns of the state per workgroup (two per invocation).
const COLS: usize = 128;

/// A bound chunked state pass: a kernel per chunk the scratch holds (each its own uniform with
/// the chunk's index, bound once).
pub struct DeltaChunkState {
    chunks: Vec<Kernel>,
    groups: u32,
}

impl DeltaChunkState {
    /// Binds `scratch` (of `params.chunks` chunks), `io`'s state and output for `params`.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: &DeltaIo<'_>,
        scratch: &wgpu::Buffer,
        params: &DeltaKernelParams,
    ) -> DeltaChunkState {
        let s = params.shape;
        let state = (s.v_heads * s.dk * s.dv * 4) as u64;
        // The state in and out; W, Qg, Kd, U and Aqk of the chunk's tokens.
        let per_token = 4 * (s.v_heads * (3 * s.dk + CHUNK + 2 * s.dv)) as u64;
        let traffic = Traffic { fixed: 2 * state, per_token, per_position: 0 };
        let buffers = [scratch.into(), io.state.into(), io.out.into()];
        let chunks = (0..params.chunks)
            .map(|c| Kernel::new(gpu, "delta_chunk_state", &[], step, &params.words(c), &buffers).with_traffic(traffic))
            .collect();
        DeltaChunkState { chunks, groups: (s.v_heads * s.dv.div_ceil(COLS)) as u32 }
    }

    /// Records the state pass over a step of `n` tokens, chunk after chunk.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        for kernel in &self.chunks[..n.div_ceil(CHUNK)] {
            kernel.dispatch(pass, self.groups, gpu.caps.max_workgroups_per_dim);
        }
    }
}
