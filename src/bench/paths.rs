//! Every switchable fast path against the plain path it replaces, in one process, run by run
//! in turn (`moestream bench paths`): weight tiles, 8-byte loads, kernels without naga's checks, the decode layout, dense and expert prefill, chained
//! decode, optimistic streaming steps and MTP drafts. A fast path whose every run is more than
//! [`SLOWER_LIMIT`]× slower than the plain run beside it is a regression nothing else would
//! notice (lavapipe's speed drifts up to 2× between processes, never both ways in every pair of
//! runs); `.ci/run` fails on it.

use serde::Serialize;

use super::timing::{in_turn, median};
use super::workload::random_tokens;
use crate::decoder::OptimisticSteps;
use crate::error::Result;
use crate::gpu::{Caps, GpuOptions};
use crate::ops::experts::ExpertPrefill;
use crate::ops::matmul::LayoutChoice;
use crate::runtime::drafts::DEFAULT_MTP_DRAFTS;
use crate::runtime::{EngineOptions, ExpertBudget, GenerateOptions, MtpLoad, SamplingParams};
use crate::Engine;

/// A fast path fails the comparison when every one of its runs is slower than the plain run
/// beside it by more than this factor (in decode or in prefill).
pub const SLOWER_LIMIT: f64 = 2.0;

/// What to run.
#[derive(Clone, Debug)]
pub struct PathsBenchOptions {
    /// Prompt length (seeded random ids).
    pub prompt_tokens: usize,
    /// Tokens generated per run (greedy, end-of-sequence ignored).
    pub decode_tokens: usize,
    /// Runs of each path, in turn, after one warm-up of each.
    pub runs: usize,
    /// Seed of the prompt's ids.
    pub seed: u64,
    /// Only these paths (by name); `None`: every one.
    pub only: Option<Vec<String>>,
}

/// Fast against plain speeds of one phase (prefill or decode), run by run.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseComparison {
    /// Tokens per second of each fast run.
    pub fast_runs: Vec<f64>,
    /// Tokens per second of each plain run, in the same order.
    pub plain_runs: Vec<f64>,
    /// fast / plain of each pair of runs.
    pub ratios: Vec<f64>,
    /// The median of `ratios`.
    pub median_ratio: f64,
    /// Whether every ratio is below 1 / [`SLOWER_LIMIT`].
    pub slower_beyond_limit: bool,
}

impl PhaseComparison {
    fn new(fast_runs: Vec<f64>, plain_runs: Vec<f64>) -> PhaseComparison {
        let ratios: Vec<f64> = fast_runs.iter().zip(&plain_runs).map(|(f, p)| f / p).collect();
        let slower_beyond_limit = !ratios.is_empty() && ratios.iter().all(|r| *r * SLOWER_LIMIT < 1.0);
        PhaseComparison { median_ratio: median(&ratios), fast_runs, plain_runs, ratios, slower_beyond_limit }
    }
}

/// One fast path against its plain path.
#[derive(Clone, Debug, Serialize)]
pub struct PathComparison {
    /// The path's name (`weight_tiles`, `words64`, ...).
    pub name: &'static str,
    /// What the engine does by default here.
    pub fast: String,
    /// What it replaces.
    pub plain: String,
    /// Why it was not compared (the default does not take it here), if it was not.
    pub not_compared: Option<String>,
    /// Prefill speeds, fast against plain.
    pub prefill: Option<PhaseComparison>,
    /// Decode speeds, fast against plain.
    pub decode: Option<PhaseComparison>,
}

impl PathComparison {
    /// Whether the fast path was slower than the plain one beyond [`SLOWER_LIMIT`] in every run
    /// of prefill or of decode.
    pub fn regressed(&self) -> bool {
        [&self.prefill, &self.decode].iter().any(|p| p.as_ref().is_some_and(|p| p.slower_beyond_limit))
    }
}

/// Every path of one model.
#[derive(Clone, Debug, Serialize)]
pub struct PathsReport {
    /// Adapter name.
    pub adapter: String,
    /// Model directory.
    pub model: String,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Tokens generated per run.
    pub decode_tokens: usize,
    /// Runs of each path.
    pub runs: usize,
    /// The factor beyond which a fast path fails ([`SLOWER_LIMIT`]).
    pub slower_limit: f64,
    /// Each path.
    pub paths: Vec<PathComparison>,
    /// No path regressed.
    pub ok: bool,
}

/// The change to a context's options that gives a path's plain form, or why the fast one is not
/// taken here.
type PlainOptions = std::result::Result<fn(&mut GpuOptions), &'static str>;

/// How the plain path of a [`FastPath`] is reached.
enum Switch {
    /// Another GPU context: where `caps` (the default context's) show the fast path taken, the
    /// change to the options that gives the plain one; else why it is not taken.
    Context(fn(&Caps) -> PlainOptions),
    /// Chained greedy decode, switched on the default engine.
    Chained,
    /// Optimistic streaming steps, switched on an engine streaming half the experts.
    Optimistic,
    /// MTP drafts as the CLI's default takes them, on an engine loaded with the MTP module.
    MtpDrafts,
}

struct FastPath {
    name: &'static str,
    fast: &'static str,
    plain: &'static str,
    switch: Switch,
}

/// The paths, each with what the default does and what it replaces. The layouts name the CPU
/// adapter's default first; GPUs take the other one as their default, so there the two swap.
const PATHS: &[FastPath] = &[
    FastPath {
        name: "weight_tiles",
        fast: "int4 and f16 matrices in 64 x 64 tiles",
        plain: "row-major matrices",
        switch: Switch::Context(|caps| match caps.weight_tiles {
            true => Ok(|o| o.row_major_weights = true),
            false => Err("not taken here (GPU layouts, or MOESTREAM_WEIGHT_TILES=off)"),
        }),
    },
    FastPath {
        name: "words64",
        fast: "16-byte weight groups loaded as two u64",
        plain: "four 4-byte words",
        switch: Switch::Context(|caps| match caps.words64 {
            true => Ok(|o| o.four_byte_words = true),
            false => Err("not taken here (GPU layouts, no SHADER_INT64, or MOESTREAM_WORDS64=off)"),
        }),
    },
    FastPath {
        name: "unchecked_shaders",
        fast: "kernels without naga's bounds and loop checks",
        plain: "every naga check",
        switch: Switch::Context(|caps| match caps.shader_checks {
            false => Ok(|o| o.shader_checks = true),
            true => Err("kernels keep naga's checks on this adapter"),
        }),
    },
    FastPath {
        name: "decode_layout",
        fast: "the adapter's decode layout (CPU: a lane per row; GPU: lane teams)",
        plain: "the other layout",
        switch: Switch::Context(|caps| match caps.decode_layout {
            Some(_) => Err("MOESTREAM_DECODE_LAYOUT forces one"),
            None if caps.cpu_layouts => Ok(|o| o.decode_layout = Some(LayoutChoice::Teams)),
            None => Ok(|o| o.decode_layout = Some(LayoutChoice::Lanes)),
        }),
    },
    FastPath {
        name: "dense_prefill",
        fast: "the adapter's dense prefill (CPU: the decode matvec per token; GPU: the tiled GEMM)",
        plain: "the other one",
        switch: Switch::Context(|caps| match std::env::var_os("MOESTREAM_DENSE_PREFILL") {
            Some(_) => Err("MOESTREAM_DENSE_PREFILL forces one"),
            None if caps.tiled_prefill => Ok(|o| o.matvec_prefill = true),
            None => Ok(|o| o.tiled_prefill = true),
        }),
    },
    FastPath {
        name: "expert_prefill",
        fast: "the adapter's expert prefill (CPU: per (token, expert) pair; GPU: gathered GEMM tiles)",
        plain: "the other one",
        switch: Switch::Context(|caps| match caps.expert_prefill {
            Some(_) => Err("MOESTREAM_EXPERT_PREFILL forces one"),
            None if caps.cpu_layouts => Ok(|o| o.expert_prefill = Some(ExpertPrefill::Gather)),
            None => Ok(|o| o.expert_prefill = Some(ExpertPrefill::Pairs)),
        }),
    },
    FastPath {
        name: "chained_decode",
        fast: "greedy steps chained on the GPU",
        plain: "one step at a time",
        switch: Switch::Chained,
    },
    FastPath {
        name: "optimistic_steps",
        fast: "streaming steps optimistic when it pays (half the experts in slots)",
        plain: "layer by layer",
        switch: Switch::Optimistic,
    },
    FastPath {
        name: "mtp_drafts",
        fast: "MTP drafts as `--speculative auto` takes them (3 a step, the model's default sampling)",
        plain: "one token a step (same sampling)",
        switch: Switch::MtpDrafts,
    },
];

/// A prompt and the generation every run does.
struct Workload {
    prompt: Vec<u32>,
    options: GenerateOptions,
}

impl Workload {
    /// One run: (prefill, decode) tokens per second.
    fn run(&self, engine: &Engine) -> Result<(f64, f64)> {
        let s = engine.generate(&self.prompt, &self.options, |_, _| true)?.stats;
        Ok((s.prefill_tokens_per_s, s.decode_tokens_per_s))
    }

    /// `runs` of `fast` and `plain` in turn after one warm-up of each: prefill and decode,
    /// fast against plain.
    fn alternate(
        &self,
        runs: usize,
        mut fast: impl FnMut() -> Result<(f64, f64)>,
        mut plain: impl FnMut() -> Result<(f64, f64)>,
    ) -> Result<(PhaseComparison, PhaseComparison)> {
        fast()?;
        plain()?;
        let (f, p) = in_turn(runs, fast, plain)?;
        let phase =
            |i: fn(&(f64, f64)) -> f64| PhaseComparison::new(f.iter().map(i).collect(), p.iter().map(i).collect());
        Ok((phase(|r| r.0), phase(|r| r.1)))
    }
}

/// Compares every path on the model `base` loads (its options are the default path).
pub fn run(base: &EngineOptions, o: &PathsBenchOptions) -> Result<PathsReport> {
    if o.prompt_tokens < 2 || o.decode_tokens == 0 || o.runs == 0 {
        return Err(crate::Error::InvalidArgument(
            "bench paths needs at least 2 prompt tokens, 1 decode token and 1 run".into(),
        ));
    }
    if let Some(unknown) = o.only.iter().flatten().find(|n| !PATHS.iter().any(|p| p.name == n.as_str())) {
        let names: Vec<&str> = PATHS.iter().map(|p| p.name).collect();
        return Err(crate::Error::InvalidArgument(format!("no path {unknown:?}: expected {}", names.join(", "))));
    }
    let engine = Engine::load(base)?;
    let work = Workload {
        prompt: random_tokens(o.prompt_tokens, engine.spec().vocab, o.seed),
        options: GenerateOptions {
            max_tokens: o.decode_tokens,
            sampling: SamplingParams::default(),
            ignore_eos: true,
            ..Default::default()
        },
    };
    let mut paths = Vec::new();
    for path in PATHS.iter().filter(|p| o.only.as_ref().is_none_or(|only| only.iter().any(|n| n == p.name))) {
        let mut c = PathComparison {
            name: path.name,
            fast: path.fast.into(),
            plain: path.plain.into(),
            not_compared: None,
            prefill: None,
            decode: None,
        };
        let compared = match &path.switch {
            Switch::Context(plain_options) => match plain_options(&engine.gpu().caps) {
                Err(why) => Err(why.to_string()),
                Ok(set) => {
                    let mut plain = base.clone();
                    set(&mut plain.gpu);
                    let plain = Engine::load(&plain)?;
                    Ok(work.alternate(o.runs, || work.run(&engine), || work.run(&plain))?)
                }
            },
            Switch::Chained => match (engine.chained_decode(), engine.chains_decode()) {
                (false, _) => Err("off by default on this adapter (a software one)".to_string()),
                (true, false) => {
                    Err("this model's steps cannot chain (prerouter, linear attention or streaming)".to_string())
                }
                (true, true) => {
                    let set = |on| {
                        engine.set_chained_decode(on);
                        work.run(&engine)
                    };
                    let compared = work.alternate(o.runs, || set(true), || set(false));
                    engine.set_chained_decode(true);
                    Ok(compared?)
                }
            },
            Switch::MtpDrafts => {
                let with = Engine::load(&EngineOptions { mtp: MtpLoad::Available, ..base.clone() })?;
                match with.model().has_mtp() {
                    false => Err("the model has no MTP module that runs".to_string()),
                    true => {
                        let sampled = |mtp_drafts| Workload {
                            prompt: work.prompt.clone(),
                            options: GenerateOptions {
                                sampling: with.sampling_defaults(),
                                mtp_drafts,
                                ..work.options.clone()
                            },
                        };
                        let (on, off) = (sampled(DEFAULT_MTP_DRAFTS), sampled(0));
                        Ok(work.alternate(o.runs, || on.run(&with), || off.run(&with))?)
                    }
                }
            }
            Switch::Optimistic => match streamed_half(base, &engine) {
                None => Err("the model has no routed experts to stream".to_string()),
                Some(options) => {
                    let streamed = Engine::load(&options)?;
                    let m = streamed.model();
                    let default = m.optimistic_steps();
                    let set = |mode| {
                        m.set_optimistic_steps(mode);
                        work.run(&streamed)
                    };
                    Ok(work.alternate(o.runs, || set(default), || set(OptimisticSteps::Never))?)
                }
            },
        };
        match compared {
            Ok((prefill, decode)) => (c.prefill, c.decode) = (Some(prefill), Some(decode)),
            Err(why) => c.not_compared = Some(why),
        }
        paths.push(c);
    }
    Ok(PathsReport {
        adapter: engine.gpu().adapter.name.clone(),
        model: engine.model_dir().display().to_string(),
        prompt_tokens: o.prompt_tokens,
        decode_tokens: o.decode_tokens,
        runs: o.runs,
        slower_limit: SLOWER_LIMIT,
        ok: !paths.iter().any(PathComparison::regressed),
        paths,
    })
}

/// `base` with half of the model's routed experts in slots (at least one layer's top-k), if it
/// has routed experts.
fn streamed_half(base: &EngineOptions, engine: &Engine) -> Option<EngineOptions> {
    let spec = engine.spec();
    let moe = spec.moe.as_ref()?;
    let total = spec.moe_layers.iter().filter(|m| **m).count() * moe.num_experts;
    let mut options = base.clone();
    options.budget = ExpertBudget::Slots((total / 2).max(moe.top_k));
    Some(options)
}

#[cfg(test)]
mod tests {
    use super::PhaseComparison;

    #[test]
    fn slower_only_when_every_run_is_beyond_the_limit() {
        let slow = PhaseComparison::new(vec![10.0, 11.0, 9.0], vec![30.0, 25.0, 40.0]);
        assert!(slow.slower_beyond_limit);
        assert_eq!(slow.ratios.len(), 3);
        // One pair within the limit: drift, not a regression.
        let drift = PhaseComparison::new(vec![10.0, 20.0, 9.0], vec![30.0, 25.0, 40.0]);
        assert!(!drift.slower_beyond_limit);
        assert!(!PhaseComparison::new(vec![], vec![]).slower_beyond_limit);
        assert_eq!(PhaseComparison::new(vec![20.0, 40.0], vec![10.0, 10.0]).median_ratio, 3.0);
    }
}
