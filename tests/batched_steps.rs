//! Batched steps ([`GpuModel::step_batch`]): several sequences of different lengths run
//! together give each sequence its solo greedy tokens exactly and its solo log-probs within
//! 1e-4, on every fixture family (f32 and int4), the GGUF block types, MLX, and streamed at one
//! layer's top-k of expert slots; a prompt chunk rides beside other sequences' decode tokens and
//! sequences join and leave mid-run.

mod common;

use std::path::Path;

use common::{fixtures, fixtures_dir, gpu, gpu_layouts, TempDir};
use moestream::decoder::{BatchEntry, GpuModel, Rows, SequenceCache, StepOutput};
use moestream::experts::policy::Phase;
use moestream::ops::WeightFormat;
use moestream::quant::{Int4Scheme, QuantParams};
use moestream::runtime::sampler::argmax;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget};

const DECODE: usize = 5;

/// The default int4: affine, groups of 32.
fn int4() -> WeightFormat {
    WeightFormat::Int4(QuantParams { scheme: Int4Scheme::Affine, group_size: 32 })
}

/// Log-softmax of `logits`.
fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|l| ((l - max) as f64).exp()).sum();
    let log_sum = sum.ln() as f32 + max;
    logits.iter().map(|l| l - log_sum).collect()
}

/// A sequence's greedy tokens and the log-probs each step gave.
#[derive(Default)]
struct Run {
    tokens: Vec<u32>,
    logprobs: Vec<Vec<f32>>,
}

impl Run {
    fn push(&mut self, logits: &[f32]) -> u32 {
        let t = argmax(logits);
        self.tokens.push(t);
        self.logprobs.push(log_softmax(logits));
        t
    }
}

/// `prompt` alone: prefill in one step, then `DECODE` greedy steps.
fn solo(m: &GpuModel, prompt: &[u32]) -> Run {
    let cache = m.new_cache().unwrap();
    let mut run = Run::default();
    let mut logits = m.step(&cache, prompt, 0, Phase::Prefill, StepOutput::Logits).unwrap().into_logits().unwrap();
    for i in 0..DECODE {
        let t = run.push(&logits);
        let step = m.step(&cache, &[t], prompt.len() + i, Phase::Decode, StepOutput::Logits);
        logits = step.unwrap().into_logits().unwrap();
    }
    run.push(&logits);
    run
}

/// One batched sequence: its cache, prompt, where it joins (the batched step it is prefilled
/// in) and what it produced.
struct Member<'a> {
    cache: SequenceCache,
    prompt: &'a [u32],
    joins: usize,
    run: Run,
}

/// The `prompts` together: each joins at its step (its prompt as one chunk beside the others'
/// decode tokens), decodes `DECODE` tokens and leaves.
fn batched(m: &GpuModel, prompts: &[(&[u32], usize)]) -> Vec<Run> {
    let mut members: Vec<Member> = prompts
        .iter()
        .map(|&(prompt, joins)| Member { cache: m.new_cache().unwrap(), prompt, joins, run: Run::default() })
        .collect();
    let last = prompts.iter().map(|p| p.1).max().unwrap() + DECODE;
    for step in 0..=last {
        // Each live member's tokens this step: its prompt when it joins, then its last token.
        let parts: Vec<(usize, Vec<u32>, usize)> = members
            .iter()
            .enumerate()
            .filter(|(_, mb)| step >= mb.joins && step <= mb.joins + DECODE)
            .map(|(i, mb)| match step == mb.joins {
                true => (i, mb.prompt.to_vec(), 0),
                false => (i, vec![*mb.run.tokens.last().unwrap()], mb.prompt.len() + mb.run.tokens.len() - 1),
            })
            .collect();
        let entries: Vec<BatchEntry> = parts
            .iter()
            .map(|(i, tokens, pos)| BatchEntry { cache: &members[*i].cache, tokens, pos: *pos, logits: Rows::Last })
            .collect();
        let phase = if step == 0 { Phase::Prefill } else { Phase::Decode };
        let out = m.step_batch(&entries, phase).unwrap();
        drop(entries);
        for ((i, _, _), logits) in parts.iter().zip(out) {
            members[*i].run.push(&logits[0]);
        }
    }
    members.into_iter().map(|mb| mb.run).collect()
}

/// Asserts the batched runs of prompts cut from `prompt` equal their solo runs on `m`.
fn check(what: &str, m: &GpuModel, prompt: &[u32]) {
    let n = prompt.len();
    let a = prompt;
    let b = &prompt[..n - 2];
    let c = &prompt[1..];
    let want: Vec<Run> = [a, b, c].iter().map(|p| solo(m, p)).collect();
    // A and B start together; C's prompt joins two steps later beside their decode tokens.
    let got = batched(m, &[(a, 0), (b, 0), (c, 2)]);
    for (s, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "{what}: sequence {s}'s tokens");
        for (step, (gl, wl)) in g.logprobs.iter().zip(&w.logprobs).enumerate() {
            let diff = gl.iter().zip(wl).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(diff <= 1e-4, "{what}: sequence {s} step {step}: log-probs differ by {diff}");
        }
    }
}

fn engine(path: &Path, format: Option<WeightFormat>, budget: ExpertBudget, cache: &TempDir) -> Engine {
    engine_on(gpu(), path, format, budget, cache)
}

fn engine_on(
    gpu: std::sync::Arc<moestream::gpu::Gpu>,
    path: &Path,
    format: Option<WeightFormat>,
    budget: ExpertBudget,
    cache: &TempDir,
) -> Engine {
    let mut o = EngineOptions::new(path);
    if let Some(f) = format {
        o = o.with_format(f);
    }
    o.budget = budget;
    o.cache_dir = Some(cache.path().to_path_buf());
    Engine::load_on(gpu, &o).unwrap()
}

#[test]
fn every_family_batched_equals_solo() {
    let cache = TempDir::new("batched");
    let mut families = 0;
    for (dir, golden) in fixtures() {
        let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
        for format in [WeightFormat::F32, int4()] {
            let e = engine(&dir, Some(format), ExpertBudget::Auto, &cache);
            check(&format!("{} {format:?}", golden.architecture), e.model(), prompt);
        }
        // The GPUs' kernel layouts (team reductions, the gathered expert GEMM for prefill).
        let e = engine_on(gpu_layouts(), &dir, Some(WeightFormat::F16), ExpertBudget::Auto, &cache);
        check(&format!("{} f16, GPU layouts", golden.architecture), e.model(), prompt);
        families += 1;
    }
    assert!(families >= 10);
}

#[test]
fn gguf_and_mlx_batched_equal_solo() {
    let cache = TempDir::new("batched_gguf");
    let prompt = [1, 5, 9, 2, 7, 3, 11, 4];
    for file in ["qwen3_moe-q4km.gguf", "qwen3_5_moe-q4km.gguf", "gpt_oss-mxfp4.gguf", "deepseek_v3-f32.gguf"] {
        let e = engine(&fixtures_dir().join("gguf").join(file), None, ExpertBudget::Auto, &cache);
        check(file, e.model(), &prompt);
    }
    for mlx in ["olmoe_4bit", "llama_4bit"] {
        let e = engine(&fixtures_dir().join("mlx").join(mlx), None, ExpertBudget::Auto, &cache);
        check(mlx, e.model(), &prompt);
    }
}

#[test]
fn streamed_at_the_smallest_budget_batched_equals_resident_solo() {
    let cache = TempDir::new("batched_streamed");
    for (dir, golden) in fixtures() {
        let spec = moestream::model::ArchSpec::from_dir(&dir).unwrap();
        let Some(moe) = spec.moe.clone() else { continue };
        let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
        let resident = engine(&dir, Some(WeightFormat::F32), ExpertBudget::Auto, &cache);
        let n = prompt.len();
        let want: Vec<Run> = [&prompt[..], &prompt[..n - 2]].iter().map(|p| solo(resident.model(), p)).collect();
        drop(resident);
        let streamed = engine(&dir, Some(WeightFormat::F32), ExpertBudget::Slots(moe.top_k), &cache);
        let got = batched(streamed.model(), &[(&prompt[..], 0), (&prompt[..n - 2], 1)]);
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.tokens, w.tokens, "{}: streamed sequence {s}", golden.architecture);
        }
        let stats = streamed.expert_stats();
        assert!(stats.expert_misses > 0, "{}: one layer's top-k of slots must miss", golden.architecture);
    }
}

fn entry<'a>(cache: &'a SequenceCache, tokens: &'a [u32], pos: usize) -> BatchEntry<'a> {
    BatchEntry { cache, tokens, pos, logits: Rows::Last }
}

#[test]
fn bad_batches_are_refused() {
    let (dir, _) = fixtures().into_iter().find(|(d, _)| d.ends_with("qwen3_moe")).unwrap();
    let cache = TempDir::new("batched_bad");
    let e = engine(&dir, Some(WeightFormat::F32), ExpertBudget::Auto, &cache);
    let m = e.model();
    let (a, b) = (m.new_cache().unwrap(), m.new_cache().unwrap());
    let twice = m.step_batch(&[entry(&a, &[1, 2], 0), entry(&a, &[3], 2)], Phase::Prefill);
    assert!(twice.unwrap_err().to_string().contains("twice"));
    let empty = m.step_batch(&[entry(&a, &[1], 0), entry(&b, &[], 0)], Phase::Prefill);
    assert!(empty.is_err());
    let too_many = vec![1u32; m.options().max_batch];
    assert!(m.step_batch(&[entry(&a, &too_many, 0), entry(&b, &[1], 0)], Phase::Prefill).is_err());
    let vocab = m.spec().vocab as u32;
    assert!(m.step_batch(&[entry(&a, &[1], 0), entry(&b, &[vocab], 0)], Phase::Prefill).is_err());
    // The refused steps changed nothing: both sequences still run.
    assert!(m.step_batch(&[entry(&a, &[1], 0), entry(&b, &[2, 3], 0)], Phase::Prefill).is_ok());
}
