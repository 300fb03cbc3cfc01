//! Kernel launchers: one file per WGSL kernel in `shaders/`. Each launcher binds its buffers
//! once at construction and records a dispatch sized for the step's token count, so the
//! per-token path allocates nothing.

pub mod argmax;
pub mod attention;
pub mod attention_merge;
pub mod causal_conv1d;
pub mod delta_chunk_prep;
pub mod delta_chunk_state;
pub mod embed;
pub mod experts;
pub mod gate_mul;
pub mod gated_delta_rule;
pub mod kv_store;
pub mod matmul;
pub mod matrix;
pub mod mla_attention;
pub mod mla_decompress;
pub mod mla_merge;
pub mod moe_combine;
pub mod prerouter_heads;
pub mod rms_norm;
pub mod rope;
pub mod router;
pub mod slot_layout;
pub mod swiglu;
pub mod token_logprob;
pub mod weight_tiles;

pub use kv_store::KvDtype;
pub use matrix::{BlobOffsets, GpuMatrix, PaddedBlock, WeightFormat};

/// Packs kernel parameters (u32 words; f32 values as their bits) for a uniform buffer.
pub(crate) fn params(words: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(words).to_vec()
}

/// Workgroups needed to cover `items` with 64 invocations each.
pub(crate) fn groups64(items: usize) -> u32 {
    items.div_ceil(64) as u32
}

/// `ONE_SUBGROUP`, the layout of the one-row reducing kernels (`rms_norm` and those built on
/// shaders/reduce.wgsl: `argmax`, `router_topk`, `token_logprob`) that takes 8-lane workgroups
/// reduced by subgroup operations, no workgroup memory, where the decode kernels take the CPU
/// layout and a subgroup holds a whole 8-lane workgroup, as lavapipe charges a kernel with
/// workgroup memory and barriers several times its work per dispatch; else none (64 lanes or
/// more, reduced as a tree in workgroup memory).
pub(crate) fn one_subgroup_layout(gpu: &crate::gpu::Gpu) -> Option<&'static str> {
    matmul::DecodeLayout::for_gpu(gpu).one_subgroup_workgroups(gpu).then_some("ONE_SUBGROUP")
}
