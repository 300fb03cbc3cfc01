//! The gated delta rule over a sequence's recurrent state: Gated DeltaNet's (one decay per
//! head) or, with the `KDA` variant, Kimi Delta Attention's (one decay per key channel). A step
//! of one token (decode) runs the recurrence token by token; a longer step with a chunk scratch
//! bound runs the chunked form instead ([`super::delta_chunk_prep`], then
//! [`super::delta_chunk_state`]), which turns the recurrence inside each chunk of [`CHUNK`]
//! tokens into products of small matrices and visits the state once per chunk rather than once
//! per token. The two agree within f32 rounding (tests/kernels_linear_attention.rs).

use super::delta_chunk_prep::DeltaChunkPrep;
use super::delta_chunk_state::DeltaChunkState;
use super::params;
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::model::DeltaShape;
use crate::model::LinearKind;

/// Tokens per chunk of the chunked form (the shaders' `CHUNK`).
pub const CHUNK: usize = 32;

/// Steps of at least this many tokens take the chunked form where a scratch is bound.
pub const CHUNKED_FROM: usize = 2;

/// The buffers a delta-rule step reads and writes.
pub struct DeltaIo<'a> {
    /// Conv output `[tokens, conv_dim]`: q (all key heads), k, v.
    pub conv: &'a wgpu::Buffer,
    /// In-projection `[tokens, in_width]`, b (one per value head) then a (one per value head,
    /// KDA: one per key channel) at `gate_offset`.
    pub proj: &'a wgpu::Buffer,
    /// `A_log` `[v_heads]` then `dt_bias` (as wide as a).
    pub decay_params: &'a wgpu::Buffer,
    /// The sequence's recurrent state `[v_heads, dk, dv]` (updated).
    pub state: &'a wgpu::Buffer,
    /// Output `[tokens, v_heads * dv]`.
    pub out: &'a wgpu::Buffer,
    /// The chunked form's scratch for steps of up to `max_tokens` tokens
    /// ([`chunk_scratch_bytes`]); without it (or with `Caps::chunked_delta_rule` off, or head
    /// widths not multiples of 4) every step runs token by token.
    pub chunks: Option<ChunkScratch<'a>>,
}

/// The chunked form's scratch buffer and the longest step it holds.
#[derive(Clone, Copy)]
pub struct ChunkScratch<'a> {
    /// At least [`chunk_scratch_bytes`] of `max_tokens`.
    pub buffer: &'a wgpu::Buffer,
    /// The most tokens a step has.
    pub max_tokens: usize,
}

/// Bytes of the chunked form's scratch for steps of up to `max_tokens` tokens of `shape`: per
/// chunk and value head W, Qg, Kd (`CHUNK × dk` each), U (`CHUNK × dv`), Aqk (`CHUNK × CHUNK`)
/// and D (`dk`), f32.
pub fn chunk_scratch_bytes(shape: DeltaShape, max_tokens: usize) -> u64 {
    let per_head = CHUNK * (3 * shape.dk + shape.dv + CHUNK) + shape.dk;
    (max_tokens.div_ceil(CHUNK) * shape.v_heads * per_head * 4) as u64
}

/// What every delta-rule kernel is built from: the heads, the decay, where the gates sit in
/// the projection row and how many chunks the scratch holds (the shaders' layout of it).
pub struct DeltaKernelParams {
    /// The heads.
    pub shape: DeltaShape,
    kind: LinearKind,
    in_stride: usize,
    gate_offset: usize,
    /// Chunks the chunked form's scratch holds (0 without one).
    pub chunks: usize,
}

impl DeltaKernelParams {
    /// The conv row's width: q and k of every key head, v of every value head.
    pub fn conv_stride(&self) -> usize {
        let s = self.shape;
        2 * s.k_heads * s.dk + s.v_heads * s.dv
    }

    /// The shader variant of the decay.
    pub fn defines(&self) -> &'static [&'static str] {
        match self.kind {
            LinearKind::GatedDeltaNet => &[],
            LinearKind::Kda { lower_bound: Some(_) } => &["KDA", "SAFE_GATE"],
            LinearKind::Kda { lower_bound: None } => &["KDA"],
        }
    }

    /// The shaders' `Params` (shaders/delta_gates.wgsl), `chunk` last.
    pub fn words(&self, chunk: usize) -> Vec<u8> {
        let DeltaShape { k_heads, v_heads, dk, dv } = self.shape;
        let lower_bound = match self.kind {
            LinearKind::Kda { lower_bound: Some(b) } => b,
            _ => 0.0,
        };
        let mut words =
            [k_heads, v_heads, dk, dv, self.in_stride, self.conv_stride(), self.gate_offset, 0, self.chunks, chunk]
                .map(|w| w as u32);
        words[7] = lower_bound.to_bits();
        params(&words)
    }
}

/// A bound delta-rule step.
pub struct GatedDeltaRule {
    kernel: Kernel,
    chunked: Option<(DeltaChunkPrep, DeltaChunkState)>,
    v_heads: usize,
}

impl GatedDeltaRule {
    /// Binds `io` for heads of `shape` and the decay of `kind`; `in_stride` is the
    /// projection's width and `gate_offset` where its b values start.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: DeltaIo<'_>,
        heads: (DeltaShape, LinearKind),
        offsets: (usize, usize),
    ) -> GatedDeltaRule {
        Self::build(gpu, step, io, heads, offsets, None)
    }

    /// The rule token by token whatever the step's length, also writing the state after each
    /// token into `snaps` (`[tokens, v_heads, dk, dv]`): for a step of draft tokens, which is
    /// then cut back to the accepted ones by copying their last state (no chunk scratch used).
    pub fn with_snapshots(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: DeltaIo<'_>,
        heads: (DeltaShape, LinearKind),
        offsets: (usize, usize),
        snaps: &wgpu::Buffer,
    ) -> GatedDeltaRule {
        Self::build(gpu, step, DeltaIo { chunks: None, ..io }, heads, offsets, Some(snaps))
    }

    fn build(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: DeltaIo<'_>,
        (shape, kind): (DeltaShape, LinearKind),
        (in_stride, gate_offset): (usize, usize),
        snaps: Option<&wgpu::Buffer>,
    ) -> GatedDeltaRule {
        // The chunked kernels load four values at a time.
        let fits = shape.dk.is_multiple_of(4) && shape.dv.is_multiple_of(4);
        let chunks = io.chunks.filter(|_| gpu.caps.chunked_delta_rule && fits);
        let params = DeltaKernelParams {
            shape,
            kind,
            in_stride,
            gate_offset,
            chunks: chunks.map_or(0, |c| c.max_tokens.div_ceil(CHUNK)),
        };
        let state = (shape.v_heads * shape.dk * shape.dv * 4) as u64;
        // The state is read twice and written once per token; q, k, v in, out.
        let per_token = 3 * state + 4 * (params.conv_stride() + shape.v_heads * shape.dv) as u64;
        let traffic = Traffic { fixed: 0, per_token, per_position: 0 };
        let mut buffers: Vec<Slice> =
            vec![io.conv.into(), io.proj.into(), io.decay_params.into(), io.state.into(), io.out.into()];
        buffers.extend(snaps.map(Slice::from));
        let mut defines = params.defines().to_vec();
        defines.extend(snaps.map(|_| "SNAPSHOTS"));
        let kernel =
            Kernel::new(gpu, "gated_delta_rule", &defines, step, &params.words(0), &buffers).with_traffic(traffic);
        let chunked = chunks.map(|c| {
            (
                DeltaChunkPrep::new(gpu, step, &io, c.buffer, &params),
                DeltaChunkState::new(gpu, step, &io, c.buffer, &params),
            )
        });
        GatedDeltaRule { kernel, chunked, v_heads: shape.v_heads }
    }

    /// Records the rule over a step of `n` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        match &self.chunked {
            Some((prep, state)) if n >= CHUNKED_FROM => {
                prep.record(gpu, pass, n);
                state.record(gpu, pass, n);
            }
            _ => self.kernel.dispatch(pass, self.v_heads as u32, gpu.caps.max_workgroups_per_dim),
        }
    }
}
