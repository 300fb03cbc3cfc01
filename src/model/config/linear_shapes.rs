//! The shapes the linear-attention kernels and the CPU reference share, so the fast path does
//! not import the oracle: the delta rule's heads and widths ([`DeltaShape`]) and the output
//! gate's activation ([`GateAct`]).

use super::hybrid::{HybridSpec, LinearKind};

/// The shape of a gated delta-rule update.
#[derive(Clone, Copy, Debug)]
pub struct DeltaShape {
    /// Query/key heads.
    pub k_heads: usize,
    /// Value heads (a multiple of `k_heads`; value head `h` reads key head `h / (v_heads / k_heads)`).
    pub v_heads: usize,
    /// Key head width.
    pub dk: usize,
    /// Value head width.
    pub dv: usize,
}

impl DeltaShape {
    /// The delta-rule shape of `hy`.
    pub fn of(hy: &HybridSpec) -> DeltaShape {
        DeltaShape { k_heads: hy.num_k_heads, v_heads: hy.num_v_heads, dk: hy.head_k_dim, dv: hy.head_v_dim }
    }
}

/// How a gate turns into a factor (`gate_mul`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateAct {
    /// `sigmoid(g)` (gated attention's output gate).
    Sigmoid,
    /// `silu(g)` (the DeltaNet's gated RMSNorm).
    Silu,
}

impl GateAct {
    /// The activation of a linear-attention layer's output-norm gate: Gated DeltaNet's
    /// `silu(z)`, KDA's `sigmoid(g)`.
    pub fn of_output_gate(kind: LinearKind) -> GateAct {
        match kind {
            LinearKind::GatedDeltaNet => GateAct::Silu,
            LinearKind::Kda { .. } => GateAct::Sigmoid,
        }
    }
}
