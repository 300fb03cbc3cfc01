//! How much of the memory left after weights and the expert budget goes to KV caches, and the
//! context that follows from it — decided before anything is allocated.

use crate::error::{Error, Result};
use crate::model::decoder::sequence_bytes;
use crate::model::ArchSpec;
use crate::ops::{KvDtype, WeightFormat};

/// Memory kept free besides weights, experts and KV caches (activations, staging, the rest of
/// the process): an eighth of what is available.
const HEADROOM_DIVISOR: u64 = 8;

/// The KV plan of a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPlan {
    /// Positions per sequence.
    pub context: usize,
    /// Bytes of KV cache per position (every layer's keys and values).
    pub bytes_per_token: u64,
    /// Bytes the caches of all live sequences may take together.
    pub budget: u64,
}

/// Bytes of the non-expert weights (embeddings, lm_head, attention, dense and shared FFNs,
/// routers) in `dense` format; an estimate within the scale overhead of int4.
pub fn resident_weight_bytes(spec: &ArchSpec, dense: WeightFormat) -> u64 {
    let h = spec.hidden;
    let attention = h * (2 * spec.q_dim() + 2 * spec.kv_dim());
    let ffn = |i: usize| match (&spec.moe, spec.is_moe_layer(i)) {
        (Some(m), true) => h * m.num_experts + m.shared_expert_intermediate.map_or(0, |s| 3 * h * s + h),
        _ => 3 * h * spec.dense_intermediate,
    };
    let params = 2 * spec.vocab * h + (0..spec.layers).map(|i| attention + ffn(i)).sum::<usize>();
    let bytes_per_param = match dense {
        WeightFormat::F32 => 4.0,
        WeightFormat::F16 => 2.0,
        // 4 bits plus an f16 scale and min per group of at least 32.
        WeightFormat::Int4(_) => 0.625,
    };
    (params as f64 * bytes_per_param) as u64
}

/// Memory left for KV caches when weights and experts take `fixed` bytes of `available`.
pub fn kv_memory_left(available: u64, fixed: u64) -> u64 {
    available.saturating_sub(fixed).saturating_sub(available / HEADROOM_DIVISOR)
}

/// The context for KV caches of `budget` bytes in all: `requested` when one sequence fits
/// (else [`Error::KvCacheTooLarge`]), by default the model's maximum or what fits, whichever
/// is smaller.
pub fn plan_kv(spec: &ArchSpec, dtype: KvDtype, requested: Option<usize>, budget: u64) -> Result<KvPlan> {
    let bytes_per_token = sequence_bytes(spec.layers, spec.kv_dim(), 1, dtype);
    let fits = (budget / bytes_per_token.max(1)) as usize;
    let context = match requested {
        Some(n) if n == 0 || n > spec.max_positions => {
            return Err(Error::InvalidArgument(format!(
                "context {n} must be in 1..={} (max_position_embeddings)",
                spec.max_positions
            )))
        }
        Some(n) if n > fits => {
            return Err(Error::KvCacheTooLarge {
                what: format!("context {n} × {bytes_per_token} bytes per token in {}", dtype.name()),
                needed: n as u64 * bytes_per_token,
                available: budget,
            })
        }
        Some(n) => n,
        None if fits == 0 => {
            return Err(Error::KvCacheTooLarge {
                what: format!("one position ({} KV)", dtype.name()),
                needed: bytes_per_token,
                available: budget,
            })
        }
        None => spec.max_positions.min(fits),
    };
    Ok(KvPlan { context, bytes_per_token, budget })
}
