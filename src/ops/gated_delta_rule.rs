//! The gated delta rule over a sequence's recurrent state: Gated DeltaNet's (one decay per
//! head) or, with the `KDA` variant, Kimi Delta Attention's (one decay per key channel).

use super::params;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::model::DeltaShape;
use crate::model::LinearKind;

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
}

/// A bound delta-rule step: one workgroup per value head, the step's tokens in order.
pub struct GatedDeltaRule {
    kernel: Kernel,
    v_heads: usize,
}

impl GatedDeltaRule {
    /// Binds `io` for heads of `shape` and the decay of `kind`; `in_stride` is the
    /// projection's width and `gate_offset` where its b values start.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: DeltaIo<'_>,
        (shape, kind): (DeltaShape, LinearKind),
        (in_stride, gate_offset): (usize, usize),
    ) -> GatedDeltaRule {
        let DeltaShape { k_heads, v_heads, dk, dv } = shape;
        let conv_stride = 2 * k_heads * dk + v_heads * dv;
        let (defines, lower_bound): (&[&str], f32) = match kind {
            LinearKind::GatedDeltaNet => (&[], 0.0),
            LinearKind::Kda { lower_bound: Some(b) } => (&["KDA", "SAFE_GATE"], b),
            LinearKind::Kda { lower_bound: None } => (&["KDA"], 0.0),
        };
        let mut words = [k_heads, v_heads, dk, dv, in_stride, conv_stride, gate_offset, 0].map(|w| w as u32);
        words[7] = lower_bound.to_bits();
        let state = (v_heads * dk * dv * 4) as u64;
        // The state is read and written twice per token (decay, then update); q, k, v in, out.
        let per_token = 4 * state + 4 * (conv_stride + v_heads * dv) as u64;
        let traffic = Traffic { fixed: 0, per_token, per_position: 0 };
        let buffers = [io.conv.into(), io.proj.into(), io.decay_params.into(), io.state.into(), io.out.into()];
        let kernel =
            Kernel::new(gpu, "gated_delta_rule", defines, step, &params(&words), &buffers).with_traffic(traffic);
        GatedDeltaRule { kernel, v_heads }
    }

    /// Records the rule over the step's tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass) {
        self.kernel.dispatch(pass, self.v_heads as u32, gpu.caps.max_workgroups_per_dim);
    }
}
