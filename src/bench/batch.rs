//! Many requests at once through the runtime's [`Scheduler`]: for each count of concurrent
//! requests, the aggregate generated tokens per second, each request's latency, the mean
//! sequences per step and, where experts stream, the bytes read from the store per generated
//! token. The counts run in turn, `runs` times each, in one process (the adapter's speed
//! drifts between processes); medians are reported, and each count's throughput is also given
//! relative to one request's. With MTP drafts, each round of a count runs once without and
//! once with them, in turn, and the drafted figures are given beside the plain ones.

use std::time::Instant;

use serde::Serialize;

use super::timing::median;
use super::workload::random_tokens;
use crate::error::{Error, Result};
use crate::runtime::drafts::tokens_per_verify_step;
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
    /// Also run every count with this many MTP drafts a step (0: not; the engine loaded with
    /// its MTP module).
    pub mtp_drafts: usize,
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
    /// The same count with MTP drafts, where asked for.
    pub drafted: Option<DraftedPoint>,
}

/// One count of concurrent requests with MTP drafts.
#[derive(Clone, Debug, Serialize)]
pub struct DraftedPoint {
    /// Median aggregate generated tokens per second, as [`BatchPoint::aggregate_tokens_per_s`].
    pub aggregate_tokens_per_s: f64,
    /// Over the same count's without drafts.
    pub speedup: f64,
    /// Every round's aggregate.
    pub runs: Vec<f64>,
    /// Drafts accepted over drafts proposed.
    pub accepted_fraction: f64,
    /// Tokens each verify step produced, on average (accepted drafts and the token after).
    pub tokens_per_verify_step: f64,
    /// Bytes read from the expert store per generated token.
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
    /// MTP drafts a step in the drafted rounds (0: none ran).
    pub mtp_drafts: usize,
    /// One entry per count of requests.
    pub points: Vec<BatchPoint>,
}

/// One round of `n` requests: aggregate tok/s, latencies, mean sequences per step, bytes read
/// per token, and drafts (proposed, accepted, verify steps).
struct Round {
    tokens_per_s: f64,
    latencies: Vec<f64>,
    sequences_per_step: f64,
    bytes_per_token: f64,
    drafts: (usize, usize, usize),
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
    let mut round = |n: usize, mtp_drafts: usize| -> Result<Round> {
        let options =
            GenerateOptions { max_tokens: o.decode_tokens, ignore_eos: true, mtp_drafts, ..Default::default() };
        let before = (engine.expert_stats().bytes_read, scheduler.step_counts());
        let started = Instant::now();
        for _ in 0..n {
            seed += 1;
            let prompt = random_tokens(o.prompt_tokens, engine.spec().vocab, seed);
            scheduler.submit(prompt, options.clone(), Box::new(|_, _, _| true))?;
        }
        let mut latencies = Vec::with_capacity(n);
        let (mut generated, mut drafts) = (0, (0, 0, 0));
        while !scheduler.is_idle() {
            for f in scheduler.step()? {
                let g = f.result?;
                generated += g.tokens.len();
                let s = &g.stats;
                drafts = (drafts.0 + s.draft_tokens, drafts.1 + s.accepted_draft_tokens, drafts.2 + s.draft_steps);
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
            drafts,
        })
    };
    // Without drafts, then with them where asked for.
    let settings: &[usize] = if o.mtp_drafts > 0 { &[0, o.mtp_drafts] } else { &[0] };
    for &n in &o.requests {
        for &mtp in settings {
            round(n, mtp)?;
        }
    }
    let mut rounds: Vec<[Vec<Round>; 2]> = o.requests.iter().map(|_| Default::default()).collect();
    for _ in 0..o.runs {
        for (i, &n) in o.requests.iter().enumerate() {
            for (j, &mtp) in settings.iter().enumerate() {
                rounds[i][j].push(round(n, mtp)?);
            }
        }
    }
    let median_of = |rs: &[Round], f: fn(&Round) -> f64| median(&rs.iter().map(f).collect::<Vec<_>>());
    let mean_of = |rs: &[Round], f: fn(&Round) -> f64| rs.iter().map(f).sum::<f64>() / rs.len() as f64;
    let mut points: Vec<BatchPoint> = o
        .requests
        .iter()
        .zip(&rounds)
        .map(|(&requests, [rs, drafted])| {
            let latencies: Vec<f64> = rs.iter().flat_map(|r| r.latencies.iter().copied()).collect();
            let aggregate = median_of(rs, |r| r.tokens_per_s);
            let drafted = (!drafted.is_empty()).then(|| {
                let (proposed, accepted, steps) =
                    (drafted.iter()).fold((0, 0, 0), |(p, a, s), r| (p + r.drafts.0, a + r.drafts.1, s + r.drafts.2));
                let with = median_of(drafted, |r| r.tokens_per_s);
                DraftedPoint {
                    aggregate_tokens_per_s: with,
                    speedup: with / aggregate.max(1e-9),
                    runs: drafted.iter().map(|r| r.tokens_per_s).collect(),
                    accepted_fraction: accepted as f64 / proposed.max(1) as f64,
                    tokens_per_verify_step: tokens_per_verify_step(accepted, steps),
                    bytes_read_per_token: mean_of(drafted, |r| r.bytes_per_token),
                }
            });
            BatchPoint {
                requests,
                aggregate_tokens_per_s: aggregate,
                scaling: 0.0,
                runs: rs.iter().map(|r| r.tokens_per_s).collect(),
                latency_s: median(&latencies),
                sequences_per_step: mean_of(rs, |r| r.sequences_per_step),
                bytes_read_per_token: mean_of(rs, |r| r.bytes_per_token),
                drafted,
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
        mtp_drafts: o.mtp_drafts,
        points,
    })
}

impl BatchReport {
    /// The sweep as a markdown table.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| requests | aggregate tok/s | × one request | latency s | sequences per step | MB read per token |",
        );
        let drafts = self.mtp_drafts;
        if drafts > 0 {
            out += &format!(" with {drafts} MTP drafts: tok/s | × without | accepted | tokens per verify step | MB read per token |");
        }
        out += &format!(
            "\n|---:|---:|---:|---:|---:|---:|{}\n",
            if drafts > 0 { "---:|---:|---:|---:|---:|" } else { "" }
        );
        for p in &self.points {
            out += &format!(
                "| {} | {:.1} | {:.2}× | {:.2} | {:.2} | {:.2} |",
                p.requests,
                p.aggregate_tokens_per_s,
                p.scaling,
                p.latency_s,
                p.sequences_per_step,
                p.bytes_read_per_token / 1e6
            );
            if let Some(d) = &p.drafted {
                out += &format!(
                    " {:.1} | {:.2}× | {:.0}% | {:.2} | {:.2} |",
                    d.aggregate_tokens_per_s,
                    d.speedup,
                    100.0 * d.accepted_fraction,
                    d.tokens_per_verify_step,
                    d.bytes_read_per_token / 1e6
                );
            }
            out += "\n";
        }
        out
    }
}
