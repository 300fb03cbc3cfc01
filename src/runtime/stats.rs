//! Run statistics reported with `--json` and in the text summary.

use serde::Serialize;

/// Speed and memory figures of one request.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    /// Prompt tokens processed per second.
    pub prefill_tokens_per_s: f64,
    /// Generated tokens per second.
    pub decode_tokens_per_s: f64,
    /// Times the host waited for the GPU per generated token (one for a step that is one
    /// submission; one more per MoE layer when streaming experts layer by layer). Counted on
    /// the GPU context, so other engines' or sessions' steps at the same time count too.
    pub decode_waits_per_token: f64,
    /// Positions prefilled by this request (new tokens, plus the last one again when the
    /// session's cache already held it).
    pub prefilled_tokens: usize,
    /// Positions of the session's cache reused without recomputation.
    pub reused_tokens: usize,
    /// Tokens drafted by prompt lookup (speculative decoding).
    pub draft_tokens: usize,
    /// Drafted tokens the verification accepted (each a decode step saved).
    pub accepted_draft_tokens: usize,
    /// Steps that verified drafts (each carried its drafts after a decode token).
    pub draft_steps: usize,
    /// Positions per sequence.
    pub context: usize,
    /// KV-cache bytes per position (every layer's keys and values).
    pub kv_bytes_per_token: u64,
    /// Element type of the KV cache.
    pub kv_dtype: &'static str,
    /// Peak resident set size of the process, in bytes.
    pub peak_rss_bytes: u64,
    /// GPU buffer bytes allocated.
    pub gpu_bytes: u64,
    /// Expert cache figures (hits, misses, prefetches, bytes read, stall time).
    #[serde(flatten)]
    pub experts: crate::experts::residency::ExpertStats,
}
