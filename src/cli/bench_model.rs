//! `moestream bench model`: load time, prefill and decode speed, memory, expert-cache figures,
//! and decode with a setting on against off (chained or optimistic steps, drafts).

use std::path::PathBuf;

use clap::Args;

use super::bench::print_json;
use super::model_args::{DraftArgs, ModelArgs, Speculative, DEFAULT_MTP_DRAFTS};
use moestream::bench::model::{self, ModelBenchOptions};
use moestream::runtime::MtpLoad;
use moestream::{Error, Result};

/// Flags of `bench model`.
#[derive(Args, Debug)]
pub struct ModelBenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length (seeded random token ids).
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens generated per run (greedy, end-of-sequence ignored).
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Timed runs after the warm-up.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seed of the prompt's ids.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also time decode with chained steps and one step at a time, run by run in turn (their
    /// ratio from one process, where the adapter's speed drifts between processes).
    #[arg(long)]
    compare_chained: bool,
    /// With streaming experts (`--expert-slots`), also time decode with optimistic steps
    /// (one submission per token, rerun layer by layer when an expert was missing) always
    /// against never, run by run in turn.
    #[arg(long)]
    compare_optimistic: bool,
    // With `--speculative mtp` (MTP drafts), or `ngram` / `--draft N` (prompt lookup): also decode
    // with drafts against one token a step, run by run in turn, with the acceptance rate and
    // tokens per verify step.
    #[command(flatten)]
    drafts: DraftArgs,
    /// With drafts and streaming experts (`--expert-slots`), also decode with drafts whose
    /// verify steps' experts are read ahead against without, run by run in turn: misses, stall
    /// time and bytes read per token.
    #[arg(long)]
    compare_draft_prefetch: bool,
    /// Sampling temperature of every run (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// The prompt is its random block this many times over (what prompt lookup drafts from).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    prompt_repeats: u64,
    /// The prompt is this file's first `--prompt-tokens` tokens instead of random ids (held-out
    /// text, e.g. the bundled model's `validation.txt`, for MTP drafts).
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `bench model`.
pub fn run(a: ModelBenchArgs) -> Result<()> {
    let mtp = a.drafts.speculative == Speculative::Mtp;
    let o = ModelBenchOptions {
        prompt_tokens: a.prompt_tokens,
        decode_tokens: a.decode_tokens,
        runs: a.runs,
        seed: a.seed,
        compare_chained: a.compare_chained,
        compare_optimistic: a.compare_optimistic,
        compare_draft_prefetch: a.compare_draft_prefetch,
        // MTP drafts are compared when named (`auto` compares prompt lookup with `--draft`).
        drafts: match mtp {
            true => None,
            false => a.drafts.lookup()?,
        },
        mtp_drafts: match mtp {
            true => a.drafts.draft.unwrap_or(DEFAULT_MTP_DRAFTS),
            false => 0,
        },
        temperature: a.temperature,
        prompt_repeats: a.prompt_repeats as usize,
        prompt_text: a
            .prompt_file
            .as_ref()
            .map(|f| std::fs::read_to_string(f).map_err(|e| Error::io(f, e)))
            .transpose()?,
    };
    let load = if mtp { MtpLoad::Required } else { MtpLoad::Off };
    let r = model::run(|| a.model.load_with(load), &o)?;
    if a.json {
        print_json(&r);
        return Ok(());
    }
    println!(
        "{} ({} weights, {} experts) on {}, loaded in {:.1} s",
        r.model, r.weights.dense, r.weights.experts, r.adapter, r.load_s
    );
    println!("prefill  {:>10.1} tok/s  ({} tokens, median of {})", r.prefill_tokens_per_s, r.prompt_tokens, r.runs);
    println!(
        "decode   {:>10.1} tok/s  ({} tokens, median of {}; {:.1} GPU waits per token)",
        r.decode_tokens_per_s, r.decode_tokens, r.runs, r.decode_waits_per_token
    );
    println!("peak RSS {:>10.0} MiB", r.peak_rss_bytes as f64 / 1048576.0);
    println!("GPU      {:>10.0} MiB", r.gpu_bytes as f64 / 1048576.0);
    println!("experts  {}", r.experts);
    let compared = [
        (
            "chained",
            a.compare_chained,
            &r.chained,
            "one step at a time",
            "this model's steps cannot chain (streaming experts, a trace, a prerouter or linear attention)",
        ),
        (
            "optimistic",
            a.compare_optimistic,
            &r.optimistic,
            "layer by layer",
            "every expert has a slot (give --expert-slots below the total)",
        ),
    ];
    if let Some(d) = &r.drafts {
        let c = &d.decode;
        println!(
            "drafts     {:>8.1} tok/s vs {:.1} one token a step: {:.3}x  ({} of {} {} drafts accepted, {:.2} tokens per verify step; MB read per token {:.2} vs {:.2})",
            c.on_tokens_per_s,
            c.off_tokens_per_s,
            c.ratio,
            d.accepted_draft_tokens,
            d.draft_tokens,
            d.source,
            d.tokens_per_verify_step,
            d.bytes_read_per_token_on / 1e6,
            d.bytes_read_per_token_off / 1e6
        );
    }
    if let Some(p) = &r.draft_prefetch {
        let (c, on, off) = (&p.decode, &p.on, &p.off);
        println!(
            "read ahead {:>8.1} tok/s vs {:.1} without: {:.3}x  (per token: misses {:.2} vs {:.2}, stall {:.2} vs {:.2} ms, MB read {:.3} vs {:.3}; {} of {} read ahead used)",
            c.on_tokens_per_s,
            c.off_tokens_per_s,
            c.ratio,
            on.misses_per_token,
            off.misses_per_token,
            on.stall_ms_per_token,
            off.stall_ms_per_token,
            on.bytes_read_per_token / 1e6,
            off.bytes_read_per_token / 1e6,
            on.prefetch_used,
            on.prefetch_issued
        );
    } else if a.compare_draft_prefetch {
        println!(
            "read ahead not compared: it needs drafts (--speculative, --draft) and --expert-slots below the total"
        );
    }
    for (name, asked, c, off, why_not) in compared {
        if asked && c.is_none() {
            println!("{name:<10} not compared: {why_not}");
        }
        if let Some(c) = c {
            println!(
                "{name:<10} {:>8.1} tok/s vs {:.1} {off}: {:.3}x  (runs in turn, median of {}; GPU waits per token {:.1} vs {:.1})",
                c.on_tokens_per_s, c.off_tokens_per_s, c.ratio, r.runs, c.on_waits_per_token, c.off_waits_per_token
            );
        }
    }
    Ok(())
}
