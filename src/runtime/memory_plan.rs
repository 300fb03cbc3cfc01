//! What a model needs on the GPU besides its expert slots, estimated before loading, the
//! automatic expert budget that follows from the adapter's memory, and how much of what is left
//! goes to KV caches (and the context that follows from it), decided before anything is
//! allocated.

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::{ArchSpec, CacheShape, Checkpoint, DeltaShape};
use crate::ops::gated_delta_rule::chunk_scratch_bytes;
use crate::ops::{KvDtype, WeightFormat};

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
            match (shape, ckpt.ggml_type(n)) {
                // GGUF matrices are held as the GPU reads them best (padded blocks are larger).
                ([rows, cols], Some(t)) => {
                    WeightFormat::of_ggml(t).for_gpu().blob_bytes(*rows, *cols).map_or(stored, |b| b as u64)
                }
                _ if converted => stored,
                ([rows, cols], None) => {
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

/// GPU bytes of the activation buffers for `max_batch` tokens (logits dominate), the chunked
/// delta rule's scratch on hybrid models, with slack for the per-kernel scratch buffers.
pub fn activation_bytes(spec: &ArchSpec, max_batch: usize) -> u64 {
    let inter = spec.dense_intermediate.max(spec.moe.as_ref().map_or(0, |m| m.top_k * m.expert_intermediate));
    let per_token = 2 * spec.vocab + 8 * spec.hidden + 3 * spec.q_dim() + 3 * inter;
    let delta_chunks = spec.hybrid.as_ref().map_or(0, |hy| chunk_scratch_bytes(DeltaShape::of(hy), max_batch));
    (max_batch * per_token * 4) as u64 + delta_chunks + (16 << 20)
}

/// Host memory a streamed model uses beside its buffers where the adapter's memory is host
/// memory (software adapters): the I/O threads' aligned read buffers, one expert extent of
/// `read_len` bytes each, and the uploads a load lets wait in wgpu's staging (16 MiB). Zero on
/// other adapters, whose buffers do not share that memory.
pub fn host_side_bytes(gpu: &Gpu, io_threads: usize, read_len: usize) -> u64 {
    match gpu.adapter.software {
        true => (io_threads.max(1) * read_len) as u64 + crate::gpu::context::STAGING_BOUND,
        false => 0,
    }
}

/// Bytes the automatic expert budget may use on `gpu`: what the adapter had free when it was
/// opened, less what this context allocated since and what the model needs besides its expert
/// slots, keeping a tenth of it (at most 1 GiB) for the driver and other programs.
pub fn auto_expert_bytes(gpu: &Gpu, resident_bytes: u64) -> u64 {
    let free = free_bytes(gpu);
    free.saturating_sub(headroom(free)).saturating_sub(resident_bytes)
}

/// What the adapter had free when it was opened, less what this context allocated since.
pub fn free_bytes(gpu: &Gpu) -> u64 {
    gpu.memory().available.saturating_sub(gpu.bytes_allocated())
}

/// Memory kept free of weights, experts and KV caches for the driver and other programs: a tenth
/// of what is free, at most 1 GiB.
fn headroom(free: u64) -> u64 {
    (free / 10).min(1 << 30)
}

/// The KV plan of a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPlan {
    /// Positions per sequence.
    pub context: usize,
    /// Bytes a sequence's KV cache grows by per position ([`ArchSpec::kv_bytes_per_token`]).
    pub bytes_per_token: u64,
    /// Bytes the caches of all live sequences may take together.
    pub budget: u64,
}

/// Memory left for KV caches when weights, activations and experts take `fixed` bytes of `free`
/// (the same headroom as [`auto_expert_bytes`] keeps, so an automatic expert budget leaves room
/// for the sequence it planned for).
pub fn kv_memory_left(free: u64, fixed: u64) -> u64 {
    free.saturating_sub(fixed).saturating_sub(headroom(free))
}

/// Refuses a requested context outside `1..=max_position_embeddings`.
pub fn check_context(spec: &ArchSpec, requested: Option<usize>) -> Result<()> {
    match requested {
        Some(n) if n == 0 || n > spec.max_positions => Err(Error::InvalidArgument(format!(
            "context {n} must be in 1..={} (max_position_embeddings)",
            spec.max_positions
        ))),
        _ => Ok(()),
    }
}

/// The context for KV caches of `budget` bytes in all, `sequences` of them, laid out as `shape`
/// says (its context ignored): `requested` when that many sequences fit (else
/// [`Error::KvCacheTooLarge`]), by default the model's maximum or what fits, whichever is
/// smaller. What a sequence takes whatever its length (sliding-window rings, linear-attention
/// states) comes off each sequence's share first.
pub fn plan_kv(
    spec: &ArchSpec,
    dtype: KvDtype,
    requested: Option<usize>,
    (budget, sequences): (u64, u64),
    shape: CacheShape,
) -> Result<KvPlan> {
    check_context(spec, requested)?;
    let bytes_per_token = spec.kv_bytes_per_token(dtype, shape.rings);
    let fixed = spec.kv_fixed_bytes(shape, dtype);
    let sequences = sequences.max(1);
    let share = budget / sequences;
    let fits = match bytes_per_token {
        // Nothing grows (every cached layer a ring): any context fits once the rings do.
        0 if share >= fixed => usize::MAX,
        0 => 0,
        b => (share.saturating_sub(fixed) / b) as usize,
    };
    let context = match requested {
        Some(n) if n > fits => {
            let each = if sequences > 1 { format!(" for each of {sequences} sequences") } else { String::new() };
            return Err(Error::KvCacheTooLarge {
                what: format!("context {n} × {bytes_per_token} bytes per token in {}{each}", dtype.name()),
                needed: (n as u64 * bytes_per_token + fixed) * sequences,
                available: budget,
            });
        }
        Some(n) => n,
        None if fits == 0 => {
            return Err(Error::KvCacheTooLarge {
                what: format!("one position ({} KV)", dtype.name()),
                needed: (bytes_per_token + fixed) * sequences,
                available: budget,
            })
        }
        None => spec.max_positions.min(fits),
    };
    Ok(KvPlan { context, bytes_per_token, budget })
}
