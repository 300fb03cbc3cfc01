//! Server figures for `GET /metrics` (Prometheus text format): requests, tokens, speed of the
//! last reply, queue depth, and the engine's cumulative expert-cache counters.

use std::fmt::Write;

use crate::experts::residency::ExpertStats;

/// What the server has done so far.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Replies finished (any reason).
    pub requests: u64,
    /// Requests that failed with an error.
    pub failed: u64,
    /// Replies stopped because the client went away.
    pub cancelled: u64,
    /// Prompt tokens of the requests.
    pub prompt_tokens: u64,
    /// Prompt tokens whose KV cache was reused from the request before (not prefilled).
    pub reused_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Requests waiting for the engine.
    pub queued: u64,
    /// Prefill speed of the last reply, tokens/s.
    pub last_prefill_tokens_per_s: f64,
    /// Decode speed of the last reply, tokens/s.
    pub last_decode_tokens_per_s: f64,
    /// The engine's expert-cache figures since it was loaded.
    pub experts: ExpertStats,
    /// Engine steps run.
    pub steps: u64,
    /// Sequences those steps carried, summed (over `steps`: the mean batch).
    pub step_sequences: u64,
    /// Draft tokens proposed (MTP or prompt lookup, `serve --speculative`).
    pub draft_tokens: u64,
    /// Of those, the tokens the verification accepted.
    pub accepted_draft_tokens: u64,
}

impl Metrics {
    /// The Prometheus exposition text.
    pub fn render(&self) -> String {
        let e = &self.experts;
        let rows: [(&str, &str, &str, f64); 20] = [
            ("moestream_requests_total", "counter", "Replies finished.", self.requests as f64),
            ("moestream_requests_failed_total", "counter", "Requests that failed.", self.failed as f64),
            (
                "moestream_requests_cancelled_total",
                "counter",
                "Replies stopped by a client disconnect.",
                self.cancelled as f64,
            ),
            ("moestream_prompt_tokens_total", "counter", "Prompt tokens of the requests.", self.prompt_tokens as f64),
            (
                "moestream_reused_prompt_tokens_total",
                "counter",
                "Prompt tokens reused from the KV cache.",
                self.reused_tokens as f64,
            ),
            ("moestream_generated_tokens_total", "counter", "Tokens generated.", self.generated_tokens as f64),
            ("moestream_draft_tokens_total", "counter", "Draft tokens proposed.", self.draft_tokens as f64),
            (
                "moestream_accepted_draft_tokens_total",
                "counter",
                "Draft tokens the verification accepted.",
                self.accepted_draft_tokens as f64,
            ),
            ("moestream_queue_depth", "gauge", "Requests waiting for the engine.", self.queued as f64),
            ("moestream_steps_total", "counter", "Engine steps run.", self.steps as f64),
            (
                "moestream_step_sequences_total",
                "counter",
                "Sequences the steps carried, summed (over steps: the mean batch).",
                self.step_sequences as f64,
            ),
            (
                "moestream_prefill_tokens_per_second",
                "gauge",
                "Prefill speed of the last reply.",
                self.last_prefill_tokens_per_s,
            ),
            (
                "moestream_decode_tokens_per_second",
                "gauge",
                "Decode speed of the last reply.",
                self.last_decode_tokens_per_s,
            ),
            ("moestream_expert_hits_total", "counter", "Expert needs found in a GPU slot.", e.expert_hits as f64),
            ("moestream_expert_misses_total", "counter", "Expert needs loaded on demand.", e.expert_misses as f64),
            ("moestream_expert_hit_rate", "gauge", "Hits over needs since start.", e.hit_rate),
            ("moestream_expert_prefetch_issued_total", "counter", "Experts prefetched.", e.prefetch_issued as f64),
            (
                "moestream_expert_prefetch_used_total",
                "counter",
                "Prefetched experts then used.",
                e.prefetch_used as f64,
            ),
            ("moestream_expert_bytes_read_total", "counter", "Bytes read from the expert store.", e.bytes_read as f64),
            (
                "moestream_expert_stall_seconds_total",
                "counter",
                "Time the GPU waited for experts.",
                e.stall_ms / 1000.0,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
        out
    }
}
