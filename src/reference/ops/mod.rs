//! Per-op f32 CPU kernels, one file per job. GPU kernel tests compare against these.
//!
//! Every function works on plain slices in f32, following the Hugging Face transformers
//! semantics of the op (noted on each function). Shapes are checked with `assert!`: these are
//! test oracles called with internally computed sizes, so a mismatch is a programming error.

mod activation;
mod attention;
mod delta_rule;
mod matvec;
mod mlp;
mod norm;
mod rope;
mod router;

pub use activation::{argmax, log_softmax, sigmoid, silu, softmax};
pub use attention::{attention, attention_with, mla_absorbed, HeadShape, MlaShape};
pub use delta_rule::{causal_conv1d_step, gate_mul, gated_delta_step, softplus, DeltaGates, DeltaShape, GateAct};
pub use matvec::{add_bias, dot, matvec};
pub use mlp::{clamped_swiglu, expert_mlp, swiglu_mlp};
pub use norm::rms_norm;
pub use rope::rope;
pub use router::{route, router_forced, router_topk};
