//! End-to-end speed of one model: a prefill of seeded random token ids, then a greedy decode
//! (end-of-sequence ignored), once to warm up and then `runs` times; medians are reported.

use std::time::Instant;

use serde::Serialize;

use super::timing::median;
use super::workload::random_tokens;
use crate::error::Result;
use crate::experts::residency::ExpertStats;
use crate::runtime::{GenerateOptions, SamplingParams};
use crate::Engine;

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct ModelBenchOptions {
    /// Prompt length (random ids).
    pub prompt_tokens: usize,
    /// Tokens generated per run.
    pub decode_tokens: usize,
    /// Timed runs after the warm-up.
    pub runs: usize,
    /// Seed of the prompt's ids.
    pub seed: u64,
    /// Also time decode with chained steps and one step at a time ([`ChainedComparison`]).
    pub compare_chained: bool,
}

/// Decode with chained steps ([`crate::model::decoder::GpuModel::submit_chained`]) against one
/// step at a time, `runs` of each, one after the other in turn.
#[derive(Clone, Debug, Serialize)]
pub struct ChainedComparison {
    /// Median decode tokens per second with chained steps.
    pub chained_tokens_per_s: f64,
    /// Median decode tokens per second one step at a time.
    pub stepwise_tokens_per_s: f64,
    /// `chained_tokens_per_s / stepwise_tokens_per_s`.
    pub ratio: f64,
    /// Every chained run.
    pub chained_runs: Vec<f64>,
    /// Every one-step-at-a-time run.
    pub stepwise_runs: Vec<f64>,
}

/// Speed and memory of one model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelReport {
    /// Adapter name.
    pub adapter: String,
    /// Model directory.
    pub model: String,
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
    /// Peak resident set size of the process, in bytes.
    pub peak_rss_bytes: u64,
    /// GPU buffer bytes allocated.
    pub gpu_bytes: u64,
    /// Whether the timed runs' greedy decode chained its steps (the engine's default here).
    pub chained_decode: bool,
    /// With `compare_chained`, where steps can chain: both ways, in turn.
    pub chained: Option<ChainedComparison>,
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
    let prompt = random_tokens(o.prompt_tokens, engine.spec().vocab, o.seed);
    let options =
        GenerateOptions { max_tokens: o.decode_tokens, sampling: SamplingParams::default(), ignore_eos: true };
    engine.generate(&prompt, &options, |_, _| true)?;
    let before = engine.expert_stats();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let mut last = None;
    for _ in 0..o.runs {
        let g = engine.generate(&prompt, &options, |_, _| true)?;
        prefill.push(g.stats.prefill_tokens_per_s);
        decode.push(g.stats.decode_tokens_per_s);
        last = Some(g.stats);
    }
    let last = last.expect("runs > 0");
    let chained = match o.compare_chained && engine.model().can_chain() {
        true => Some(compare_chained(&engine, &prompt, &options, o.runs)?),
        false => None,
    };
    Ok(ModelReport {
        adapter: engine.gpu().adapter.name.clone(),
        model: engine.model_dir().display().to_string(),
        load_s,
        prompt_tokens: o.prompt_tokens,
        decode_tokens: o.decode_tokens,
        runs: o.runs,
        prefill_tokens_per_s: median(&prefill),
        decode_tokens_per_s: median(&decode),
        prefill_runs: prefill,
        decode_runs: decode,
        peak_rss_bytes: last.peak_rss_bytes,
        gpu_bytes: last.gpu_bytes,
        chained_decode: engine.chains_decode(),
        chained,
        experts: engine.expert_stats().since(&before),
    })
}

/// Decode speed with chained steps and one step at a time, `runs` of each in turn; the
/// engine's setting is left as it was.
fn compare_chained(
    engine: &Engine,
    prompt: &[u32],
    options: &GenerateOptions,
    runs: usize,
) -> Result<ChainedComparison> {
    let default = engine.chained_decode();
    let (mut chained, mut stepwise) = (Vec::new(), Vec::new());
    let timed = (0..runs).try_for_each(|_| {
        [(true, &mut chained), (false, &mut stepwise)].into_iter().try_for_each(|(on, speeds)| {
            engine.set_chained_decode(on);
            speeds.push(engine.generate(prompt, options, |_, _| true)?.stats.decode_tokens_per_s);
            Ok::<_, crate::Error>(())
        })
    });
    engine.set_chained_decode(default);
    timed?;
    let (c, s) = (median(&chained), median(&stepwise));
    Ok(ChainedComparison {
        chained_tokens_per_s: c,
        stepwise_tokens_per_s: s,
        ratio: c / s,
        chained_runs: chained,
        stepwise_runs: stepwise,
    })
}
