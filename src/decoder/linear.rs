//! The linear attention kind on the GPU (Gated DeltaNet: Qwen3-Next, Qwen3.5-MoE; KDA: Ling),
//! its shared part: the in-projection `[q | k | v | z | b | a]` into `acts.lin`, and after the
//! session's conv and delta rule ([`super::cache::LinearCache`]) the gated RMSNorm
//! (`norm(core) * silu(z)`, KDA `* sigmoid(z)`) and `out_proj` into the residual. Also the
//! output gate of the full-attention layers (gated attention's, Ling MLA's per head).

use super::{f32_buf, Activations, Builder};
use crate::error::Result;
use crate::gpu::{Gpu, Pass};
use crate::model::hybrid_weights::LinearAttnWeights;
use crate::model::GateAct;
use crate::model::{ArchSpec, HostTensor, HybridSpec};
use crate::ops::gate_mul::{GateMul, GateRows};
use crate::ops::matmul::{MatMul, MatMulOut};
use crate::ops::rms_norm::{NormRows, RmsNorm};

/// One layer's bound linear-attention block.
pub(super) struct LinearAttn {
    in_proj: MatMul,
    norm: RmsNorm,
    gate: GateMul,
    out: MatMul,
    /// Conv taps `[conv_dim, kernel]` (f32), bound by each session's conv.
    pub(super) conv_w: wgpu::Buffer,
    /// `A_log` then `dt_bias` (f32, per head or per key channel), bound by each session's
    /// delta rule.
    pub(super) decay_params: wgpu::Buffer,
}

/// A full-attention layer's output gate: `gate_proj x` into `acts.lin`, then the attention
/// output times its sigmoid (one gate value per output value, or per head).
pub(super) struct OutputGate {
    proj: MatMul,
    mul: GateMul,
}

impl Builder<'_> {
    /// Binds linear-attention block `w`, reading `acts.hn` and adding into `acts.x`.
    pub(super) fn linear_attn(
        &mut self,
        spec: &ArchSpec,
        hy: &HybridSpec,
        w: &LinearAttnWeights,
        acts: &Activations,
    ) -> Result<LinearAttn> {
        let (gpu, step) = (self.gpu, self.step);
        let (vd, width) = (hy.value_dim(), hy.in_width());
        let in_proj =
            self.matmul("linear attention", &w.in_proj, None, &acts.hn, &acts.lin, MatMulOut::plain(width))?;
        let norm_w = f32_buf(gpu, "linear attention norm", &w.norm);
        let rows = NormRows { n: hy.head_v_dim, rows_per_token: hy.num_v_heads, at_cache_pos: false };
        let norm = RmsNorm::new(gpu, step, &norm_w, &acts.core, Some(&acts.attn), rows, spec.rms_eps);
        self.buffers.push(norm_w);
        let z = GateRows { width: vd, span: 1, stride: width, offset: hy.conv_dim() };
        let gate = GateMul::new(gpu, step, (&acts.lin, &acts.attn), z, GateAct::of_output_gate(hy.kind));
        let out_mode = MatMulOut { accumulate: true, ..MatMulOut::plain(spec.hidden) };
        let out = self.matmul("linear attention", &w.out, None, &acts.attn, &acts.x, out_mode)?;
        let decay = [&w.a_log.data[..], &w.dt_bias.data[..]].concat();
        let decay = HostTensor::new(vec![decay.len()], decay);
        Ok(LinearAttn {
            in_proj,
            norm,
            gate,
            out,
            conv_w: f32_buf(gpu, "conv taps", &w.conv),
            decay_params: f32_buf(gpu, "decay params", &decay),
        })
    }

    /// Binds an attention output gate `w` (`[gates, hidden]`) over the `width` values per token
    /// of `acts.attn` (each gate value scales `width / gates` of them).
    pub(super) fn output_gate(&mut self, w: &HostTensor, width: usize, acts: &Activations) -> Result<OutputGate> {
        let gates = w.shape[0];
        let proj = self.matmul("attention", w, None, &acts.hn, &acts.lin, MatMulOut::plain(gates))?;
        let rows = GateRows { width, span: width / gates, stride: gates, offset: 0 };
        let mul = GateMul::new(self.gpu, self.step, (&acts.lin, &acts.attn), rows, GateAct::Sigmoid);
        Ok(OutputGate { proj, mul })
    }
}

impl LinearAttn {
    /// Records the in-projection (before the session's conv and delta rule).
    pub(super) fn record_inputs(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        self.in_proj.record(gpu, pass, n);
    }

    /// Records the gated norm and `out_proj` (after them).
    pub(super) fn record_output(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        self.norm.record(gpu, pass, n);
        self.gate.record(gpu, pass, n);
        self.out.record(gpu, pass, n);
    }
}

impl OutputGate {
    /// Records the gate's projection (beside the query's).
    pub(super) fn record_projection(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        self.proj.record(gpu, pass, n);
    }

    /// Records the gating of the attention output (before `o_proj`).
    pub(super) fn record_gating(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        self.mul.record(gpu, pass, n);
    }
}
