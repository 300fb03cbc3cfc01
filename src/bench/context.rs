//! `bench context`: prefill and decode speed at several context depths, against the roofline.
//!
//! For each depth `d`: a prompt of `d` seeded random ids (prefill tokens/s), then `decode_tokens`
//! greedy tokens after it (decode tokens/s at depth ≈ d). The roofline of a decode step at depth
//! `d` is the bytes it must read — the weights one token touches
//! ([`crate::Engine::weight_bytes_per_token`]) plus the keys and values it attends
//! ([`crate::model::ArchSpec::kv_bytes_attended`]: `d` positions, a windowed layer's window) —
//! divided by the
//! compute-read bandwidth `bench kernels` measures on the same adapter in the same run.
//!
//! With `prefill_last: Some(n)` only the last `n` tokens of each prompt are computed: a new
//! session takes the first `d - n` as already cached (its cache holds zeros), then prefills
//! the `n` (prefill tokens/s at depth `d - n`, what `llama-bench -p n -d …` reports) and decodes.
//! A step reads and computes the same at a depth whatever the cache holds, so these figures
//! stand; they make deep contexts measurable where prefilling the whole depth would take hours
//! (lavapipe).

use serde::Serialize;

use super::kernels::{self, KernelBenchOptions};
use super::workload::random_tokens;
use crate::error::{Error, Result};
use crate::model::CacheShape;
use crate::runtime::{GenerateOptions, SamplingParams};
use crate::Engine;

/// What to run.
#[derive(Clone, Debug)]
pub struct ContextBenchOptions {
    /// Prompt lengths (context depths), each below the engine's context.
    pub depths: Vec<usize>,
    /// Tokens generated after each prompt.
    pub decode_tokens: usize,
    /// Seed of the prompts' ids.
    pub seed: u64,
    /// Seconds of the bandwidth measurement.
    pub kernel_seconds: f64,
    /// Prefill only this many last tokens of each prompt, over a cache that takes the rest as
    /// computed (see the module docs); `None`: the whole prompt.
    pub prefill_last: Option<usize>,
}

/// One depth's figures.
#[derive(Clone, Debug, Serialize)]
pub struct DepthReport {
    /// Prompt length.
    pub depth: usize,
    /// Tokens the prefill computed: the whole prompt, or its last `prefill_last`.
    pub prefilled_tokens: usize,
    /// Prefilled tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Generated tokens per second after the prompt.
    pub decode_tokens_per_s: f64,
    /// Bytes of one sequence's caches at this depth (sliding-window rings and linear-attention
    /// states included).
    pub kv_bytes: u64,
    /// Bytes one decode step reads at this depth: weights plus the KV cache.
    pub bytes_per_token: u64,
    /// Milliseconds a decode step would take at the measured read bandwidth.
    pub roofline_ms: f64,
    /// Milliseconds a decode step took.
    pub step_ms: f64,
    /// `step_ms / roofline_ms`: 1 is the roofline.
    pub vs_roofline: f64,
}

/// The whole sweep.
#[derive(Clone, Debug, Serialize)]
pub struct ContextReport {
    /// Adapter name.
    pub adapter: String,
    /// Model directory.
    pub model: String,
    /// The engine's context (KV-cache positions).
    pub context: usize,
    /// Bytes a sequence's KV cache grows by per position (the layers without a window ring).
    pub kv_bytes_per_token: u64,
    /// Weight bytes one decode token reads.
    pub weight_bytes_per_token: u64,
    /// Compute-shader read bandwidth of this adapter (`bench kernels`), GB/s.
    pub read_gbps: f64,
    /// Per depth.
    pub depths: Vec<DepthReport>,
}

/// Runs the sweep on `engine`.
pub fn run(engine: &Engine, o: &ContextBenchOptions) -> Result<ContextReport> {
    let kv_bytes_per_token = engine.kv_plan().bytes_per_token;
    let (shape, dtype) = (engine.model().options().cache_shape(), engine.model().options().kv_dtype);
    if o.depths.is_empty() || o.decode_tokens == 0 {
        return Err(Error::InvalidArgument("bench context needs depths and decode tokens".into()));
    }
    if let Some(&d) = o.depths.iter().find(|&&d| o.prefill_last.is_some_and(|n| n == 0 || n > d)) {
        return Err(Error::InvalidArgument(format!(
            "--prefill-last must be in 1..=depth (depth {d}, prefill-last {})",
            o.prefill_last.unwrap_or(0)
        )));
    }
    if let Some(&d) = o.depths.iter().find(|&&d| d == 0 || d + o.decode_tokens > engine.context()) {
        return Err(Error::InvalidArgument(format!(
            "depth {d} + {} decoded tokens does not fit the context of {} (pass --context)",
            o.decode_tokens,
            engine.context()
        )));
    }
    let read_gbps =
        kernels::run(engine.gpu(), &KernelBenchOptions { seconds: o.kernel_seconds, ..Default::default() })?.read_gbps;
    let weights = engine.weight_bytes_per_token();
    let options = GenerateOptions {
        max_tokens: o.decode_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..Default::default()
    };
    // Warm-up: pipelines and caches.
    engine.generate(&random_tokens(8, engine.spec().vocab, o.seed), &options, |_, _| true)?;
    let mut depths = Vec::new();
    for &depth in &o.depths {
        let prompt = random_tokens(depth, engine.spec().vocab, o.seed);
        let g = match o.prefill_last {
            Some(n) => {
                let mut session = engine.new_session()?;
                session.assume_cached(&prompt[..depth - n]);
                engine.generate_in(&mut session, &prompt[depth - n..], &options, |_, _| true)?
            }
            None => engine.generate(&prompt, &options, |_, _| true)?,
        };
        let kv_bytes = engine.spec().kv_cache_bytes(CacheShape { context: depth, ..shape }, dtype);
        // The decode steps read from depth to depth + decode_tokens positions: their middle.
        let bytes_per_token = weights + engine.spec().kv_bytes_attended(depth + o.decode_tokens / 2, dtype);
        let roofline_ms = bytes_per_token as f64 / (read_gbps * 1e6);
        let step_ms = 1e3 / g.stats.decode_tokens_per_s.max(1e-9);
        depths.push(DepthReport {
            depth,
            prefilled_tokens: g.stats.prefilled_tokens,
            prefill_tokens_per_s: g.stats.prefill_tokens_per_s,
            decode_tokens_per_s: g.stats.decode_tokens_per_s,
            kv_bytes,
            bytes_per_token,
            roofline_ms,
            step_ms,
            vs_roofline: step_ms / roofline_ms,
        });
    }
    Ok(ContextReport {
        adapter: engine.gpu().adapter.name.clone(),
        model: engine.model_dir().display().to_string(),
        context: engine.context(),
        kv_bytes_per_token,
        weight_bytes_per_token: weights,
        read_gbps,
        depths,
    })
}

impl ContextReport {
    /// The sweep as a markdown table.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| depth | prefilled | prefill tok/s | decode tok/s | KV MiB | MB read per token | step ms | roofline ms | vs roofline |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for d in &self.depths {
            out += &format!(
                "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2}× |\n",
                d.depth,
                d.prefilled_tokens,
                d.prefill_tokens_per_s,
                d.decode_tokens_per_s,
                d.kv_bytes as f64 / 1048576.0,
                d.bytes_per_token as f64 / 1e6,
                d.step_ms,
                d.roofline_ms,
                d.vs_roofline
            );
        }
        out
    }
}
