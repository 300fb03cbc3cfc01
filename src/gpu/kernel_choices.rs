//! Kernel choices a developer may force (`MOESTREAM_DECODE_LAYOUT`, `MOESTREAM_EXPERT_PREFILL`,
//! or [`super::GpuOptions`]), read once as the context opens and kept in [`super::Caps`]; the
//! ops that follow them (`ops::matmul::DecodeLayout`, `ops::experts`) decide the rest.

use crate::env_choice::env_choice;
use crate::error::Result;

/// A decode layout forced by the environment variable `MOESTREAM_DECODE_LAYOUT` (for testing and
/// comparing the kernels on one adapter): `lanes`, `teams` (the adapter's team size), `teams8`,
/// `teams32`, `teams-shared` (teams summed through shared memory). Teams still sum through
/// shared memory where subgroups are off or smaller than the team.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutChoice {
    /// A lane per row (`ops::matmul::DecodeLayout::LaneRows`).
    Lanes,
    /// Teams of the adapter's size.
    Teams,
    /// Teams of 8 lanes.
    Teams8,
    /// Teams of 32 lanes.
    Teams32,
    /// Teams of the adapter's size, summed through shared memory.
    TeamsShared,
}

impl LayoutChoice {
    /// `MOESTREAM_DECODE_LAYOUT`, if set; an unknown value is refused by name.
    pub fn from_env() -> Result<Option<LayoutChoice>> {
        let choices = [
            ("lanes", LayoutChoice::Lanes),
            ("teams", LayoutChoice::Teams),
            ("teams8", LayoutChoice::Teams8),
            ("teams32", LayoutChoice::Teams32),
            ("teams-shared", LayoutChoice::TeamsShared),
        ];
        env_choice("MOESTREAM_DECODE_LAYOUT", &choices)
    }
}

/// How routed experts run in prefill steps (more than `MATVEC_MAX_TOKENS` tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertPrefill {
    /// One workgroup per (pair, block of rows), as in decode: an expert's weights are read (and
    /// dequantized) once per token routed to it. Faster on CPU adapters (lavapipe), where the
    /// tiled GEMM's workgroup-memory staging costs more than the repeated reads it saves: the
    /// bench model's prefill 1.56x in int4, 2.3-2.7x in GGUF Q4_K_M, Q8_0 and MXFP4 experts,
    /// 1.3-1.4x in BF16 and Q5_0.
    Pairs,
    /// `expert_matmul`: each expert's pairs gathered into tiles of the prefill GEMM
    /// (llama.cpp's mul_mat_id pattern).
    Gather,
}

impl ExpertPrefill {
    /// `MOESTREAM_EXPERT_PREFILL` (`pairs`, `gather`), if set; an unknown value is refused by
    /// name.
    pub fn from_env() -> Result<Option<ExpertPrefill>> {
        env_choice("MOESTREAM_EXPERT_PREFILL", &[("pairs", ExpertPrefill::Pairs), ("gather", ExpertPrefill::Gather)])
    }
}
