//! End-to-end speed of one model: a prefill of seeded random token ids, then a decode (greedy
//! unless a temperature is given; end-of-sequence ignored), once to warm up and then `runs`
//! times; medians are reported.

use std::time::Instant;

use serde::Serialize;

use super::timing::{in_turn, median};
use super::workload::random_tokens;
use crate::convert::{is_converted, ModelManifest};
use crate::decoder::OptimisticSteps;
use crate::error::Result;
use crate::experts::residency::ExpertStats;
use crate::runtime::drafts::{tokens_per_verify_step, PromptLookup};
use crate::runtime::stats::Stats;
use crate::runtime::{GenerateOptions, SamplingParams};
use crate::Engine;

/// What to run.
#[derive(Clone, Debug)]
pub struct ModelBenchOptions {
    /// Prompt length (random ids).
    pub prompt_tokens: usize,
    /// Tokens generated per run.
    pub decode_tokens: usize,
    /// Timed runs after the warm-up.
    pub runs: usize,
    /// Seed of the prompt's ids.
    pub seed: u64,
    /// Also time decode with chained steps against one step at a time ([`DecodeComparison`]).
    pub compare_chained: bool,
    /// Also time streaming decode with optimistic steps always against never
    /// ([`crate::decoder::OptimisticSteps`]).
    pub compare_optimistic: bool,
    /// Also time decode with these prompt-lookup drafts against one token a step
    /// ([`DraftsComparison`]).
    pub drafts: Option<PromptLookup>,
    /// With drafts and streaming experts, also decode with drafts with their verify steps'
    /// experts read ahead against without ([`DraftPrefetchComparison`]).
    pub compare_draft_prefetch: bool,
    /// Also time decode with this many MTP drafts a step against one token a step (the engine
    /// loaded with its MTP module); takes the place of `drafts`.
    pub mtp_drafts: usize,
    /// Sampling temperature of every run (0: greedy).
    pub temperature: f32,
    /// The prompt is its random block this many times over (a prompt that repeats itself is
    /// what prompt lookup drafts from: quotes, code edits).
    pub prompt_repeats: usize,
    /// Text whose first `prompt_tokens` tokens (the model's tokenizer's) are the prompt instead
    /// of random ids: held-out text, for drafts that predict what the model will say.
    pub prompt_text: Option<String>,
}

/// Decode with drafts (on) against one token a step (off), in turn, with what the drafts did.
#[derive(Clone, Debug, Serialize)]
pub struct DraftsComparison {
    /// Where the drafts came from: `mtp` or `prompt lookup`.
    pub source: &'static str,
    /// Decode speeds, on and off.
    #[serde(flatten)]
    pub decode: DecodeComparison,
    /// Drafts proposed over the runs with them.
    pub draft_tokens: usize,
    /// Of those, accepted.
    pub accepted_draft_tokens: usize,
    /// `accepted_draft_tokens / draft_tokens`.
    pub acceptance_rate: f64,
    /// Tokens each verify step produced, on average: its accepted drafts and the token after
    /// them.
    pub tokens_per_verify_step: f64,
    /// Expert bytes read from the store per generated token with drafts (streaming only).
    pub bytes_read_per_token_on: f64,
    /// The same without.
    pub bytes_read_per_token_off: f64,
}

/// Decode with drafts whose verify steps' experts are read ahead (on) against without (off), in
/// turn ([`Engine::set_draft_prefetch`]).
#[derive(Clone, Debug, Serialize)]
pub struct DraftPrefetchComparison {
    /// Decode speeds, on and off.
    #[serde(flatten)]
    pub decode: DecodeComparison,
    /// The expert cache with the reads ahead.
    pub on: ExpertsPerToken,
    /// The expert cache without.
    pub off: ExpertsPerToken,
}

/// Expert-cache figures of a set of runs, per generated token.
#[derive(Clone, Debug, Serialize)]
pub struct ExpertsPerToken {
    /// Experts that had to be read when a layer needed them.
    pub misses_per_token: f64,
    /// Milliseconds the GPU pipeline waited for expert reads.
    pub stall_ms_per_token: f64,
    /// Bytes read from the expert store.
    pub bytes_read_per_token: f64,
    /// Experts read ahead, over the runs.
    pub prefetch_issued: u64,
    /// Of those, used.
    pub prefetch_used: u64,
}

impl ExpertsPerToken {
    fn of(runs: &[Stats], tokens_per_run: usize) -> ExpertsPerToken {
        let tokens = (runs.len() * tokens_per_run).max(1) as f64;
        let sum = |f: fn(&ExpertStats) -> f64| runs.iter().map(|s| f(&s.experts)).sum::<f64>();
        ExpertsPerToken {
            misses_per_token: sum(|e| e.expert_misses as f64) / tokens,
            stall_ms_per_token: sum(|e| e.stall_ms) / tokens,
            bytes_read_per_token: sum(|e| e.bytes_read as f64) / tokens,
            prefetch_issued: runs.iter().map(|s| s.experts.prefetch_issued).sum(),
            prefetch_used: runs.iter().map(|s| s.experts.prefetch_used).sum(),
        }
    }
}

/// Decode with a setting on against off, `runs` of each, one after the other in turn (their
/// ratio from one process, where the adapter's speed drifts between processes).
#[derive(Clone, Debug, Serialize)]
pub struct DecodeComparison {
    /// Median decode tokens per second with the setting on.
    pub on_tokens_per_s: f64,
    /// Median decode tokens per second with it off.
    pub off_tokens_per_s: f64,
    /// `on_tokens_per_s / off_tokens_per_s`.
    pub ratio: f64,
    /// Every run with it on.
    pub on_runs: Vec<f64>,
    /// Every run with it off.
    pub off_runs: Vec<f64>,
    /// Median times the host waited for the GPU per decode token, with it on and off.
    pub on_waits_per_token: f64,
    /// See `on_waits_per_token`.
    pub off_waits_per_token: f64,
}

/// The weight formats a run used ([`crate::ops::WeightFormat::name`]).
#[derive(Clone, Debug, Serialize)]
pub struct WeightsReport {
    /// Attention and the other resident matrices (`as stored` for a GGUF model, whose matrices
    /// each keep their own ggml type).
    pub dense: String,
    /// The routed experts.
    pub experts: String,
}

/// Speed and memory of one model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelReport {
    /// Adapter name.
    pub adapter: String,
    /// Model directory.
    pub model: String,
    /// The weight formats the run used, as the engine loaded them (a converted model runs in
    /// its own, whatever `--dtype` says): `dense` for attention and other resident matrices,
    /// `experts` for the routed experts.
    pub weights: WeightsReport,
    /// Seconds to load the model (including any quantization at load).
    pub load_s: f64,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Tokens generated per run.
    pub decode_tokens: usize,
    /// Timed runs.
    pub runs: usize,
    /// Median prompt tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Median generated tokens per second.
    pub decode_tokens_per_s: f64,
    /// Prefill speed of every timed run.
    pub prefill_runs: Vec<f64>,
    /// Decode speed of every timed run.
    pub decode_runs: Vec<f64>,
    /// Median times the host waited for the GPU per decode token.
    pub decode_waits_per_token: f64,
    /// Peak resident set size of the process, in bytes.
    pub peak_rss_bytes: u64,
    /// GPU buffer bytes allocated.
    pub gpu_bytes: u64,
    /// Whether the timed runs' greedy decode chained its steps (the engine's default here).
    pub chained_decode: bool,
    /// With `compare_chained`, where steps can chain: chained (on) against one step at a
    /// time (off), in turn.
    pub chained: Option<DecodeComparison>,
    /// With `compare_optimistic`, where experts stream: optimistic steps always (on) against
    /// never (off), in turn.
    pub optimistic: Option<DecodeComparison>,
    /// With `drafts`: decode with them (on) against one token a step (off), in turn.
    pub drafts: Option<DraftsComparison>,
    /// With `compare_draft_prefetch`, drafts and streaming experts: drafts with their verify
    /// steps' experts read ahead (on) against without (off), in turn.
    pub draft_prefetch: Option<DraftPrefetchComparison>,
    /// Expert-cache figures over the timed runs.
    #[serde(flatten)]
    pub experts: ExpertStats,
}

/// Loads a model with `load` (timed) and measures it.
pub fn run(load: impl FnOnce() -> Result<Engine>, o: &ModelBenchOptions) -> Result<ModelReport> {
    if o.prompt_tokens == 0 || o.decode_tokens == 0 || o.runs == 0 {
        return Err(crate::Error::InvalidArgument("bench model needs prompt and decode tokens and runs > 0".into()));
    }
    let started = Instant::now();
    let engine = load()?;
    let load_s = started.elapsed().as_secs_f64();
    let block = match &o.prompt_text {
        None => random_tokens(o.prompt_tokens, engine.spec().vocab, o.seed),
        Some(text) => {
            let ids = engine.encode(text)?;
            if ids.len() < o.prompt_tokens {
                return Err(crate::Error::InvalidArgument(format!(
                    "the prompt text has {} tokens, fewer than the {} asked for",
                    ids.len(),
                    o.prompt_tokens
                )));
            }
            ids[..o.prompt_tokens].to_vec()
        }
    };
    let prompt = block.repeat(o.prompt_repeats.max(1));
    let sampling = SamplingParams { temperature: o.temperature, seed: o.seed, ..Default::default() };
    sampling.validate()?;
    let options = GenerateOptions { max_tokens: o.decode_tokens, sampling, ignore_eos: true, ..Default::default() };
    engine.generate(&prompt, &options, |_, _| true)?;
    let before = engine.expert_stats();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let mut waits = Vec::new();
    let mut last = None;
    for _ in 0..o.runs {
        let g = engine.generate(&prompt, &options, |_, _| true)?;
        prefill.push(g.stats.prefill_tokens_per_s);
        decode.push(g.stats.decode_tokens_per_s);
        waits.push(g.stats.decode_waits_per_token);
        last = Some(g.stats);
    }
    let last = last.expect("runs > 0");
    let chained = match o.compare_chained && engine.model().can_chain() {
        true => {
            let default = engine.chained_decode();
            let compared = compare(&engine, &prompt, &options, o.runs, |on| engine.set_chained_decode(on));
            engine.set_chained_decode(default);
            Some(compared?)
        }
        false => None,
    };
    let streams = engine.model().residency().is_some_and(|r| r.is_streaming());
    let optimistic = match o.compare_optimistic && streams {
        true => {
            let m = engine.model();
            let default = m.optimistic_steps();
            let compared = compare(&engine, &prompt, &options, o.runs, |on| {
                m.set_optimistic_steps(if on { OptimisticSteps::Always } else { OptimisticSteps::Never })
            });
            m.set_optimistic_steps(default);
            Some(compared?)
        }
        false => None,
    };
    let drafted = match (o.mtp_drafts, o.drafts) {
        (0, None) => None,
        (0, Some(d)) => Some(("prompt lookup", GenerateOptions { drafts: Some(d), ..options.clone() })),
        (n, _) => Some(("mtp", GenerateOptions { mtp_drafts: n, ..options.clone() })),
    };
    let drafts = drafted.as_ref().map(|with| compare_drafts(&engine, &prompt, &options, with, o.runs)).transpose()?;
    let draft_prefetch = match (drafted, o.compare_draft_prefetch && streams) {
        (Some((_, with)), true) => {
            let default = engine.draft_prefetch();
            let compared = compare_draft_prefetch(&engine, &prompt, &with, o.runs);
            engine.set_draft_prefetch(default);
            Some(compared?)
        }
        _ => None,
    };
    let weights = weights_report(&engine)?;
    Ok(ModelReport {
        adapter: engine.gpu().adapter.name.clone(),
        model: engine.model_dir().display().to_string(),
        weights,
        load_s,
        prompt_tokens: o.prompt_tokens,
        decode_tokens: o.decode_tokens,
        runs: o.runs,
        prefill_tokens_per_s: median(&prefill),
        decode_tokens_per_s: median(&decode),
        prefill_runs: prefill,
        decode_runs: decode,
        decode_waits_per_token: median(&waits),
        peak_rss_bytes: last.peak_rss_bytes,
        gpu_bytes: last.gpu_bytes,
        chained_decode: engine.chains_decode(),
        chained,
        optimistic,
        drafts,
        draft_prefetch,
        experts: engine.expert_stats().since(&before),
    })
}

/// Decode speed with a setting on and off (`set` switches it), `runs` of each in turn.
fn compare(
    engine: &Engine,
    prompt: &[u32],
    options: &GenerateOptions,
    runs: usize,
    set: impl Fn(bool),
) -> Result<DecodeComparison> {
    let run_with = |setting| {
        set(setting);
        Ok(engine.generate(prompt, options, |_, _| true)?.stats)
    };
    Ok(decode_comparison(in_turn(runs, || run_with(true), || run_with(false))?))
}

/// Decode with the drafts of `with` (named `source`) against `options` without, `runs` of each
/// in turn.
fn compare_drafts(
    engine: &Engine,
    prompt: &[u32],
    options: &GenerateOptions,
    (source, with): &(&'static str, GenerateOptions),
    runs: usize,
) -> Result<DraftsComparison> {
    let run_with = |o: &GenerateOptions| Ok(engine.generate(prompt, o, |_, _| true)?.stats);
    let (on, off) = in_turn(runs, || run_with(with), || run_with(options))?;
    let source = *source;
    let sum = |runs: &[Stats], f: fn(&Stats) -> usize| runs.iter().map(f).sum::<usize>();
    let (proposed, accepted, steps) =
        (sum(&on, |s| s.draft_tokens), sum(&on, |s| s.accepted_draft_tokens), sum(&on, |s| s.draft_steps));
    let per_token = |runs: &[Stats]| ExpertsPerToken::of(runs, options.max_tokens).bytes_read_per_token;
    let (bytes_read_per_token_on, bytes_read_per_token_off) = (per_token(&on), per_token(&off));
    Ok(DraftsComparison {
        source,
        decode: decode_comparison((on, off)),
        draft_tokens: proposed,
        accepted_draft_tokens: accepted,
        acceptance_rate: accepted as f64 / proposed.max(1) as f64,
        tokens_per_verify_step: tokens_per_verify_step(accepted, steps),
        bytes_read_per_token_on,
        bytes_read_per_token_off,
    })
}

/// Decode with the drafts of `with`, their verify steps' experts read ahead and not, `runs` of
/// each in turn (a fresh session each run: the reads ahead draw on what the request's own
/// sequence routed).
fn compare_draft_prefetch(
    engine: &Engine,
    prompt: &[u32],
    with: &GenerateOptions,
    runs: usize,
) -> Result<DraftPrefetchComparison> {
    let run_with = |ahead| {
        engine.set_draft_prefetch(ahead);
        Ok(engine.generate(prompt, with, |_, _| true)?.stats)
    };
    let (on, off) = in_turn(runs, || run_with(true), || run_with(false))?;
    let (on_experts, off_experts) =
        (ExpertsPerToken::of(&on, with.max_tokens), ExpertsPerToken::of(&off, with.max_tokens));
    Ok(DraftPrefetchComparison { decode: decode_comparison((on, off)), on: on_experts, off: off_experts })
}

/// The medians of runs with a setting on and off.
fn decode_comparison((on, off): (Vec<Stats>, Vec<Stats>)) -> DecodeComparison {
    let speeds = |runs: &[Stats]| runs.iter().map(|s| s.decode_tokens_per_s).collect::<Vec<_>>();
    let waits = |runs: &[Stats]| median(&runs.iter().map(|s| s.decode_waits_per_token).collect::<Vec<_>>());
    let (on_runs, off_runs) = (speeds(&on), speeds(&off));
    let (a, b) = (median(&on_runs), median(&off_runs));
    DecodeComparison {
        on_tokens_per_s: a,
        off_tokens_per_s: b,
        ratio: a / b,
        on_runs,
        off_runs,
        on_waits_per_token: waits(&on),
        off_waits_per_token: waits(&off),
    }
}

/// The weight formats `engine` loaded.
fn weights_report(engine: &Engine) -> Result<WeightsReport> {
    let decoder = engine.model().options();
    let dir = engine.model_dir();
    let gguf = is_converted(dir) && ModelManifest::load(dir)?.gguf.is_some();
    let dense = match gguf {
        true => "as stored".to_string(),
        false => decoder.dense.name(),
    };
    Ok(WeightsReport { dense, experts: decoder.experts.name() })
}
