//! `moestream generate`.

use std::io::Write;

use clap::Args;

use super::model_args::{parse_tokens, ModelArgs};
use moestream::runtime::{GenerateOptions, SamplingParams};
use moestream::Result;

/// Flags of `generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text.
    #[arg(long, conflicts_with = "tokens", required_unless_present = "tokens")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long)]
    tokens: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Do not stop at end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// Runs `generate`.
pub fn run(a: GenerateArgs) -> Result<()> {
    let engine = a.model.load()?;
    let prompt = match (&a.prompt, &a.tokens) {
        (_, Some(t)) => parse_tokens(t)?,
        (Some(p), None) => engine.encode(p)?,
        (None, None) => unreachable!("clap requires --prompt or --tokens"),
    };
    let options = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: SamplingParams { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed },
        ignore_eos: a.ignore_eos,
    };
    let mut stdout = std::io::stdout().lock();
    if !a.json {
        if let Some(p) = &a.prompt {
            let _ = write!(stdout, "{p}");
        }
    }
    let g = engine.generate(&prompt, &options, |_, piece| {
        if !a.json {
            let _ = write!(stdout, "{piece}");
            let _ = stdout.flush();
        }
        true
    })?;
    if a.json {
        writeln!(stdout, "{}", serde_json::to_string(&g).expect("serialisable")).ok();
    } else {
        writeln!(stdout).ok();
        let s = &g.stats;
        eprintln!(
            "[{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, peak RSS {:.0} MiB, GPU {:.0} MiB, {}]",
            g.prompt_tokens.len(),
            s.prefill_tokens_per_s,
            g.tokens.len(),
            s.decode_tokens_per_s,
            s.peak_rss_bytes as f64 / 1048576.0,
            s.gpu_bytes as f64 / 1048576.0,
            engine.gpu().adapter.name,
        );
        let e = &s.experts;
        if e.expert_hits + e.expert_misses > 0 {
            eprintln!(
                "[experts: hit rate {:.1}% ({} hits, {} misses), prefetch {}/{} used, {:.1} MiB read, {:.0} ms stalled]",
                e.hit_rate * 100.0,
                e.expert_hits,
                e.expert_misses,
                e.prefetch_used,
                e.prefetch_issued,
                e.bytes_read as f64 / 1048576.0,
                e.stall_ms,
            );
        }
    }
    Ok(())
}
