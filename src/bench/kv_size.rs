//! `bench kv-size`: the bytes of one sequence's caches for a model's architecture at given
//! contexts, in each KV element type, with sliding-window rings and keeping every position
//! (`--swa-full`): computed from the architecture alone (config.json or GGUF metadata) by the
//! formula the engine allocates with ([`ArchSpec::kv_cache_bytes`]), so a shape-only GGUF that
//! llama.cpp also loads (`benches/peer/kv_sizes.py`) compares the two engines' caches. Resident
//! models hold each linear-attention state once (a streaming one also keeps a copy for its
//! optimistic steps).

use serde::Serialize;

use crate::model::{ArchSpec, CacheShape};
use crate::quant::KvDtype;

/// One sequence's caches at one context, element type and ring setting.
#[derive(Clone, Debug, Serialize)]
pub struct KvSizeRow {
    /// Positions.
    pub context: usize,
    /// KV element type.
    pub dtype: &'static str,
    /// Whether sliding-window layers keep a ring (the default) or every position.
    pub rings: bool,
    /// Bytes the caches grow by per position.
    pub bytes_per_token: u64,
    /// Bytes held whatever the length (rings, linear-attention states).
    pub fixed_bytes: u64,
    /// Bytes of the caches at this context.
    pub total_bytes: u64,
}

/// Every row for one model.
#[derive(Clone, Debug, Serialize)]
pub struct KvSizeReport {
    /// The model path given.
    pub model: String,
    /// Its architecture (transformers' class name).
    pub architecture: String,
    /// Tokens per step the rings make room for (the engine's `max_batch`).
    pub max_step: usize,
    /// Per context × element type × ring setting (both ring settings only for models with
    /// sliding windows).
    pub rows: Vec<KvSizeRow>,
}

/// The rows for `spec` at `contexts`, in f16, q8_0 and q4_0.
pub fn run(spec: &ArchSpec, model: &str, contexts: &[usize], max_step: usize) -> KvSizeReport {
    let windowed = (0..spec.layers).any(|i| spec.window(i).is_some());
    let ring_settings: &[bool] = if windowed { &[true, false] } else { &[true] };
    let mut rows = Vec::new();
    for &context in contexts {
        for dtype in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
            for &rings in ring_settings {
                let shape = CacheShape { context, max_step, rings, state_copy: false };
                let bytes_per_token = spec.kv_bytes_per_token(dtype, rings);
                let total_bytes = spec.kv_cache_bytes(shape, dtype);
                rows.push(KvSizeRow {
                    context,
                    dtype: dtype.name(),
                    rings,
                    bytes_per_token,
                    fixed_bytes: total_bytes - bytes_per_token * context as u64,
                    total_bytes,
                });
            }
        }
    }
    KvSizeReport { model: model.to_string(), architecture: spec.family.hf_name().to_string(), max_step, rows }
}

impl KvSizeReport {
    /// The rows as a markdown table (MiB).
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| context | KV type | sliding windows | bytes per token | fixed MiB | total MiB |\n|---:|---|---|---:|---:|---:|\n",
        );
        let mib = |b: u64| b as f64 / 1048576.0;
        for r in &self.rows {
            out += &format!(
                "| {} | {} | {} | {} | {:.2} | {:.2} |\n",
                r.context,
                r.dtype,
                if r.rings { "rings" } else { "every position" },
                r.bytes_per_token,
                mib(r.fixed_bytes),
                mib(r.total_bytes)
            );
        }
        out
    }
}
