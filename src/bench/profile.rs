//! `bench profile`: where a step's GPU time goes, per kernel, from the time of every dispatch
//! (timestamp queries where the adapter has them, see [`crate::gpu::profiler`]), for one-token (decode) steps and for
//! multi-token (prefill chunk) steps, with each kernel's modelled bytes and achieved GB/s, and
//! per section of the step (each attention kind's layers, FFNs, the head).

use serde::Serialize;

use super::workload::random_tokens;
use crate::error::{Error, Result};
use crate::gpu::profiler::{ProfileTiming, StepKindProfile};
use crate::runtime::{GenerateOptions, SamplingParams};
use crate::Engine;

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct ProfileOptions {
    /// Prompt length (seeded random ids); prompts longer than the activation batch run in
    /// several chunks, the last one including the prompt's last token.
    pub prompt_tokens: usize,
    /// Tokens generated (greedy, end-of-sequence ignored).
    pub decode_tokens: usize,
    /// Seed of the prompt's ids.
    pub seed: u64,
}

/// The profile of one request after a warm-up request.
#[derive(Clone, Debug, Serialize)]
pub struct ProfileReport {
    /// Adapter name.
    pub adapter: String,
    /// Model directory.
    pub model: String,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub decode_tokens: usize,
    /// How the dispatches were timed.
    pub timing: ProfileTiming,
    /// The kernels kept all of naga's runtime checks ([`crate::gpu::Caps::shader_checks`]).
    pub shader_checks: bool,
    /// Wall-clock decode speed of the profiled request (timing adds overhead: a little with
    /// timestamps inside passes, more with a pass or a submission per dispatch).
    pub decode_tokens_per_s: f64,
    /// A decode step's time in its dispatches over its wall-clock time (1000 /
    /// `decode_tokens_per_s` ms): how busy the GPU was; the rest is the host recording, submitting
    /// and waiting for each token (and the profiling itself).
    pub decode_busy_share: f64,
    /// One-token steps: decode (every generated token but the last, which nothing reads).
    pub decode: StepKindProfile,
    /// Multi-token steps: prefill chunks.
    pub prefill: StepKindProfile,
}

/// Profiles `engine`, which must run on a context opened with `GpuOptions::profile`.
pub fn run(engine: &Engine, o: &ProfileOptions) -> Result<ProfileReport> {
    let profiler = engine
        .gpu()
        .profiler()
        .ok_or_else(|| Error::InvalidArgument("the engine's GPU context was opened without profiling".into()))?;
    let prompt = random_tokens(o.prompt_tokens, engine.spec().vocab, o.seed);
    let options = GenerateOptions {
        max_tokens: o.decode_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..Default::default()
    };
    engine.generate(&prompt, &options, |_, _| true)?;
    profiler.reset();
    let generation = engine.generate(&prompt, &options, |_, _| true)?;
    let (decode, prefill) = profiler.report();
    Ok(ProfileReport {
        adapter: engine.gpu().adapter.name.clone(),
        model: engine.model_dir().display().to_string(),
        prompt_tokens: o.prompt_tokens,
        decode_tokens: o.decode_tokens,
        timing: profiler.timing(),
        shader_checks: engine.gpu().caps.shader_checks,
        decode_tokens_per_s: generation.stats.decode_tokens_per_s,
        decode_busy_share: decode.gpu_ms
            / decode.steps.max(1) as f64
            / ms_per_token(generation.stats.decode_tokens_per_s),
        decode,
        prefill,
    })
}

impl ProfileReport {
    /// Both tables in markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for (title, p) in
            [("one-token steps (decode)", &self.decode), ("multi-token steps (prefill chunks)", &self.prefill)]
        {
            out += &format!(
                "\n{title}: {} steps, {} tokens, {:.3} ms per step in its dispatches ({})\n\n",
                p.steps,
                p.tokens,
                p.gpu_ms / p.steps.max(1) as f64,
                match self.timing {
                    ProfileTiming::Submits => "host clock",
                    _ => "GPU timestamps",
                }
            );
            out += "| kernel | dispatches | ms | share | MB moved | GB/s |\n|---|---:|---:|---:|---:|---:|\n";
            for k in &p.kernels {
                let (mb, gbps) = match k.bytes {
                    0 => ("-".to_string(), "-".to_string()),
                    b => (format!("{:.2}", b as f64 / 1e6), format!("{:.2}", k.gbps)),
                };
                out += &format!(
                    "| {} | {} | {:.3} | {:.1}% | {mb} | {gbps} |\n",
                    k.kernel,
                    k.dispatches,
                    k.ms,
                    k.share * 100.0
                );
            }
            out += "\n| section | dispatches | ms | share |\n|---|---:|---:|---:|\n";
            for s in &p.sections {
                out += &format!("| {} | {} | {:.3} | {:.1}% |\n", s.section, s.dispatches, s.ms, s.share * 100.0);
            }
            if std::ptr::eq(p, &self.decode) {
                out += &format!(
                    "\nGPU busy {:.1}% of a decode step's wall-clock {:.3} ms (the rest: recording, submitting, waiting for the token, profiling)\n",
                    self.decode_busy_share * 100.0,
                    ms_per_token(self.decode_tokens_per_s)
                );
            }
            if p.untimed_dispatches > 0 {
                out +=
                    &format!("\n{} dispatches past the per-step query capacity were not timed\n", p.untimed_dispatches);
            }
        }
        out
    }
}

/// Milliseconds a token at `tokens_per_s`.
fn ms_per_token(tokens_per_s: f64) -> f64 {
    1000.0 / tokens_per_s.max(1e-9)
}
