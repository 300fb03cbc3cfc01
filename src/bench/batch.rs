//! Many requests at once through the runtime's [`Scheduler`]: for each count of concurrent
//! requests, the aggregate generated tokens per second, each request's latency, the mean
//! sequences per step and, where experts stream, the bytes read from the store per generated
//! token. The counts run in turn, `runs` times each, in one process (the adapter's speed
//! drifts between processes); medians are reported, and each count's throughput is also given
//! relative to one request's.

use std::time::Instant;

use serde::Serialize;

use super::timing::median;
use super::workload::random_tokens;
use crate::error::{Error, Result};
use crate::runtime::{Engine, GenerateOptions, Scheduler};

/// What to run.
#[derive(Clone, Debug)]
pub struct BatchBenchOptions {
    /// Counts of requests submitted together.
    pub requests: Vec<usize>,
    /// Prompt length of each request (random ids, different for every request).
    pub prompt_tokens: usize,
    /// Tokens each request generates (end-of-sequence ignored).
    pub decode_tokens: usize,
    /// Timed rounds (each runs every count once), after one warm-up round.
    pub runs: usize,
    /// Seed of the prompts' ids.
    pub seed: u64,
}

/// One count of concurrent requests.
#[derive(Clone, Debug, Serialize)]
pub struct BatchPoint {
    /// Requests submitted together.
    pub requests: usize,
    /// Median of the rounds' generated tokens (all requests) per second of wall time, from
    /// the submission to the last request's end (prefill included).
    pub aggregate_tokens_per_s: f64,
    /// `aggregate_tokens_per_s` over one request's.
    pub scaling: f64,
    /// Every round's aggregate.
    pub runs: Vec<f64>,
    /// Median seconds from submission to a request's end.
    pub latency_s: f64,
    /// Mean sequences per step.
    pub sequences_per_step: f64,
    /// Bytes read from the expert store per generated token (0 when every expert is
    /// resident).
    pub bytes_read_per_token: f64,
}

/// The sweep.
#[derive(Clone, Debug, Serialize)]
pub struct BatchReport {
    /// Adapter name.
    pub adapter: String,
    /// Model directory.
    pub model: String,
    /// Expert slots on the GPU (`None`: every expert resident).
    pub expert_slots: Option<usize>,
    /// Prompt length of each request.
    pub prompt_tokens: usize,
    /// Tokens each request generates.
    pub decode_tokens: usize,
    /// One entry per count of requests.
    pub points: Vec<BatchPoint>,
}

/// One round of `n` requests: (aggregate tok/s, latencies, steps, sequence-steps, bytes read).
struct Round {
    tokens_per_s: f64,
    latencies: Vec<f64>,
    sequences_per_step: f64,
    bytes_per_token: f64,
}

/// Runs the sweep on `engine`, whose memory plan must hold as many sequences as the largest
/// count ([`crate::runtime::EngineOptions::parallel`]).
pub fn run(engine: &Engine, o: &BatchBenchOptions) -> Result<BatchReport> {
    let most = o.requests.iter().copied().max().unwrap_or(0);
    if most == 0 || o.prompt_tokens == 0 || o.decode_tokens == 0 || o.runs == 0 || o.requests.contains(&0) {
        return Err(Error::InvalidArgument(
            "bench batch needs request counts, prompt and decode tokens and runs > 0".into(),
        ));
    }
    let mut scheduler = Scheduler::new(engine, most)?;
    let mut seed = o.seed;
    let mut round = |n: usize| -> Result<Round> {
        let options = GenerateOptions { max_tokens: o.decode_tokens, ignore_eos: true, ..Default::default() };
        let before = (engine.expert_stats().bytes_read, scheduler.step_counts());
        let started = Instant::now();
        for _ in 0..n {
            seed += 1;
            let prompt = random_tokens(o.prompt_tokens, engine.spec().vocab, seed);
            scheduler.submit(prompt, options.clone(), Box::new(|_, _, _| true))?;
        }
        let mut latencies = Vec::with_capacity(n);
        let mut generated = 0;
        while !scheduler.is_idle() {
            for f in scheduler.step()? {
                generated += f.result?.tokens.len();
                latencies.push(started.elapsed().as_secs_f64());
            }
        }
        let wall = started.elapsed().as_secs_f64();
        let (steps, sequences) = scheduler.step_counts();
        let (steps, sequences) = (steps - before.1 .0, sequences - before.1 .1);
        Ok(Round {
            tokens_per_s: generated as f64 / wall.max(1e-9),
            latencies,
            sequences_per_step: sequences as f64 / steps.max(1) as f64,
            bytes_per_token: (engine.expert_stats().bytes_read - before.0) as f64 / generated.max(1) as f64,
        })
    };
    for &n in &o.requests {
        round(n)?;
    }
    let mut rounds: Vec<Vec<Round>> = o.requests.iter().map(|_| Vec::new()).collect();
    for _ in 0..o.runs {
        for (i, &n) in o.requests.iter().enumerate() {
            rounds[i].push(round(n)?);
        }
    }
    let mut points: Vec<BatchPoint> = o
        .requests
        .iter()
        .zip(&rounds)
        .map(|(&requests, rs)| {
            let runs: Vec<f64> = rs.iter().map(|r| r.tokens_per_s).collect();
            let latencies: Vec<f64> = rs.iter().flat_map(|r| r.latencies.iter().copied()).collect();
            let mean = |f: fn(&Round) -> f64| rs.iter().map(f).sum::<f64>() / rs.len() as f64;
            BatchPoint {
                requests,
                aggregate_tokens_per_s: median(&runs),
                scaling: 0.0,
                runs,
                latency_s: median(&latencies),
                sequences_per_step: mean(|r| r.sequences_per_step),
                bytes_read_per_token: mean(|r| r.bytes_per_token),
            }
        })
        .collect();
    let one = points.iter().find(|p| p.requests == 1).map(|p| p.aggregate_tokens_per_s);
    for p in &mut points {
        p.scaling = one.map_or(0.0, |one| p.aggregate_tokens_per_s / one.max(1e-9));
    }
    Ok(BatchReport {
        adapter: engine.gpu().adapter.name.clone(),
        model: engine.model_dir().display().to_string(),
        expert_slots: engine.expert_slots(),
        prompt_tokens: o.prompt_tokens,
        decode_tokens: o.decode_tokens,
        points,
    })
}

impl BatchReport {
    /// The sweep as a markdown table.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| requests | aggregate tok/s | × one request | latency s | sequences per step | MB read per token |\n|---:|---:|---:|---:|---:|---:|\n",
        );
        for p in &self.points {
            out += &format!(
                "| {} | {:.1} | {:.2}× | {:.2} | {:.2} | {:.2} |\n",
                p.requests,
                p.aggregate_tokens_per_s,
                p.scaling,
                p.latency_s,
                p.sequences_per_step,
                p.bytes_read_per_token / 1e6
            );
        }
        out
    }
}
