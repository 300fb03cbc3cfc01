//! What a model needs on the GPU besides its expert slots, estimated before loading, and the
//! automatic expert budget that follows from the adapter's memory.

use crate::gpu::Gpu;
use crate::model::{ArchSpec, Checkpoint};
use crate::ops::WeightFormat;

/// Whether a checkpoint tensor is one routed expert's weight (streamed, not resident).
fn is_routed_expert(name: &str) -> bool {
    name.contains(".experts.") || name.ends_with(".experts.gate_up_proj") || name.ends_with(".experts.down_proj")
}

/// GPU bytes of the resident (non-routed-expert) weights of `ckpt` uploaded in `dense`.
/// `converted` checkpoints already hold their GPU encoding, so their stored bytes count.
pub fn resident_weight_bytes(ckpt: &Checkpoint, dense: WeightFormat, converted: bool) -> u64 {
    ckpt.names()
        .filter(|n| !is_routed_expert(n))
        .map(|n| {
            let stored = ckpt.tensor_bytes(n);
            let shape = ckpt.shape(n).unwrap_or(&[]);
            match shape {
                _ if converted => stored,
                [rows, cols] => {
                    // Embeddings and routers are never int4 (DecoderOptions::format_of).
                    let lookup = n.contains("embed") || n.ends_with(".gate.weight");
                    let format = match dense {
                        WeightFormat::Int4(_) if lookup => WeightFormat::F16,
                        f => f,
                    };
                    format.blob_bytes(*rows, *cols).map_or(stored, |b| b as u64)
                }
                // Norms and biases are uploaded as f32.
                _ => shape.iter().product::<usize>() as u64 * 4,
            }
        })
        .sum()
}

/// GPU bytes of the f32 KV cache for `context` positions.
pub fn kv_cache_bytes(spec: &ArchSpec, context: usize) -> u64 {
    2 * spec.layers as u64 * context as u64 * spec.kv_dim() as u64 * 4
}

/// GPU bytes of the activation buffers for `max_batch` tokens (logits dominate), with slack for
/// the per-kernel scratch buffers.
pub fn activation_bytes(spec: &ArchSpec, max_batch: usize) -> u64 {
    let inter = spec.dense_intermediate.max(spec.moe.as_ref().map_or(0, |m| m.top_k * m.expert_intermediate));
    let per_token = 2 * spec.vocab + 8 * spec.hidden + 3 * spec.q_dim() + 3 * inter;
    (max_batch * per_token * 4) as u64 + (16 << 20)
}

/// Bytes the automatic expert budget may use on `gpu`: what the adapter had free when it was
/// opened, less what this context allocated since and what the model needs besides its expert
/// slots, keeping a tenth of it (at most 1 GiB) for the driver and other programs.
pub fn auto_expert_bytes(gpu: &Gpu, resident_bytes: u64) -> u64 {
    let free = gpu.memory().available.saturating_sub(gpu.bytes_allocated());
    let reserve = (free / 10).min(1 << 30);
    free.saturating_sub(reserve).saturating_sub(resident_bytes)
}
