//! Speculative decoding with prompt-lookup drafts: greedy output token for token the same as one
//! token a step, on every family (hybrid recurrent states cut back after rejected drafts), GGUF
//! and MLX, streamed at one layer's top-k of expert slots, and across a session's turns; drafts
//! are accepted where the text repeats (the bundled model's loops); a streamed verify step's
//! experts are read ahead from the routing of the passage its drafts copy.

mod common;

use std::path::Path;

use common::{fixtures, fixtures_dir, gpu, TempDir};
use moestream::experts::predictor::PrefetchKind;
use moestream::model::ArchSpec;
use moestream::ops::WeightFormat;
use moestream::runtime::drafts::PromptLookup;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions, SamplingParams, Scheduler};

fn engine(path: &Path, format: Option<WeightFormat>, budget: ExpertBudget, cache: &TempDir) -> Engine {
    let mut o = EngineOptions::new(path);
    if let Some(f) = format {
        o = o.with_format(f);
    }
    o.budget = budget;
    o.cache_dir = Some(cache.path().to_path_buf());
    Engine::load_on(gpu(), &o).unwrap()
}

fn options(max_tokens: usize, drafts: Option<PromptLookup>) -> GenerateOptions {
    GenerateOptions { max_tokens, ignore_eos: true, drafts, ..Default::default() }
}

const LOOKUP: Option<PromptLookup> = Some(PromptLookup { ngram: 3, max_draft: 4 });

/// A prompt that repeats itself, so that lookups find drafts.
fn repeating(prompt: &[u32]) -> Vec<u32> {
    [prompt, prompt, &prompt[..prompt.len() / 2]].concat()
}

/// Fixture `name`'s directory and its short golden prompt, repeating.
fn repeating_fixture(name: &str) -> (std::path::PathBuf, Vec<u32>) {
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with(name)).unwrap();
    let prompt = repeating(&golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens);
    (dir, prompt)
}

#[test]
fn greedy_with_drafts_equals_one_token_a_step_on_every_family() {
    let cache = TempDir::new("drafts");
    let mut drafted = 0;
    for (dir, golden) in fixtures() {
        let prompt = repeating(&golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens);
        let e = engine(&dir, Some(WeightFormat::F32), ExpertBudget::Auto, &cache);
        let want = e.generate(&prompt, &options(16, None), |_, _| true).unwrap().tokens;
        let g = e.generate(&prompt, &options(16, LOOKUP), |_, _| true).unwrap();
        assert_eq!(g.tokens, want, "{}", golden.architecture);
        drafted += g.stats.draft_tokens;
    }
    assert!(drafted > 0, "repeating prompts found drafts");
    for file in ["gguf/qwen3_moe-q4km.gguf", "gguf/gpt_oss-mxfp4.gguf", "mlx/olmoe_4bit"] {
        let e = engine(&fixtures_dir().join(file), None, ExpertBudget::Auto, &cache);
        let prompt = repeating(&[1, 5, 9, 2, 7, 3, 11, 4]);
        let want = e.generate(&prompt, &options(12, None), |_, _| true).unwrap().tokens;
        assert_eq!(e.generate(&prompt, &options(12, LOOKUP), |_, _| true).unwrap().tokens, want, "{file}");
    }
}

#[test]
fn the_bundled_model_accepts_drafts_and_keeps_its_tokens() {
    let cache = TempDir::new("drafts_bundled");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe");
    let e = engine(&dir, None, ExpertBudget::Auto, &cache);
    let prompt = e.encode("The history of").unwrap();
    let want = e.generate(&prompt, &options(96, None), |_, _| true).unwrap();
    let mut seen = Vec::new();
    let g = e
        .generate(&prompt, &options(96, LOOKUP), |t, _| {
            seen.push(t);
            true
        })
        .unwrap();
    assert_eq!(g.tokens, want.tokens);
    assert_eq!(seen, g.tokens, "the callback saw every token once, in order");
    assert!(g.stats.accepted_draft_tokens > 0, "its loops repeat: {:?}", g.stats);
    assert!(g.stats.accepted_draft_tokens <= g.stats.draft_tokens);
    // Stopping inside a run of accepted drafts: exactly the tokens asked for.
    for n in [1, 5, 17] {
        let g = e.generate(&prompt, &options(n, LOOKUP), |_, _| true).unwrap();
        assert_eq!(g.tokens, want.tokens[..n]);
    }
    // Sampled with drafts: reproducible with a seed.
    let sampled = |seed| GenerateOptions {
        sampling: SamplingParams { temperature: 0.7, seed, ..Default::default() },
        ..options(24, LOOKUP)
    };
    let a = e.generate(&prompt, &sampled(5), |_, _| true).unwrap().tokens;
    assert_eq!(e.generate(&prompt, &sampled(5), |_, _| true).unwrap().tokens, a);
    // And the same text as without drafts: each position's token is drawn with the same random
    // number, a draft accepted when the draw is it.
    let plain = GenerateOptions { drafts: None, ..sampled(5) };
    assert_eq!(e.generate(&prompt, &plain, |_, _| true).unwrap().tokens, a, "sampled, drafts or not");
    let bad = PromptLookup { ngram: 0, max_draft: 4 };
    assert!(e.generate(&prompt, &options(4, Some(bad)), |_, _| true).is_err());
}

#[test]
fn streamed_and_session_turns_with_drafts_equal_plain_decoding() {
    let cache = TempDir::new("drafts_streamed");
    for fixture in ["mixtral", "qwen3_next"] {
        let (dir, prompt) = repeating_fixture(fixture);
        let top_k = ArchSpec::from_dir(&dir).unwrap().moe.unwrap().top_k;
        let resident = engine(&dir, Some(WeightFormat::F32), ExpertBudget::Auto, &cache);
        let want = resident.generate(&prompt, &options(12, None), |_, _| true).unwrap().tokens;
        // Two turns of a session, one token a step.
        let mut plain = resident.new_session().unwrap();
        let first = resident.generate_in(&mut plain, &prompt, &options(8, None), |_, _| true).unwrap().tokens;
        let second = resident.generate_in(&mut plain, &prompt[..4], &options(8, None), |_, _| true).unwrap().tokens;
        drop(plain);
        drop(resident);
        let streamed = engine(&dir, Some(WeightFormat::F32), ExpertBudget::Slots(top_k), &cache);
        assert_eq!(streamed.generate(&prompt, &options(12, LOOKUP), |_, _| true).unwrap().tokens, want, "{fixture}");
        let mut s = streamed.new_session().unwrap();
        assert_eq!(streamed.generate_in(&mut s, &prompt, &options(8, LOOKUP), |_, _| true).unwrap().tokens, first);
        assert_eq!(
            streamed.generate_in(&mut s, &prompt[..4], &options(8, LOOKUP), |_, _| true).unwrap().tokens,
            second
        );
    }
}

/// Streaming at half the experts with no predictor of its own: only the reads ahead of verify
/// steps prefetch. They do (and are used), the tokens stay those of the resident model, alone
/// and through the scheduler, on a grouped-attention MoE and a hybrid (linear attention and MLA).
#[test]
fn verify_steps_read_the_experts_of_the_passage_their_drafts_copy() {
    let cache = TempDir::new("drafts_prefetch");
    for fixture in ["mixtral", "ling"] {
        let (dir, prompt) = repeating_fixture(fixture);
        let spec = ArchSpec::from_dir(&dir).unwrap();
        let moe_layers = (0..spec.layers).filter(|&l| spec.is_moe_layer(l)).count();
        let half = moe_layers * spec.moe.as_ref().unwrap().num_experts / 2;
        let resident = engine(&dir, Some(WeightFormat::F32), ExpertBudget::Auto, &cache);
        let prompts = [&prompt[..], &prompt[1..]];
        let wants: Vec<Vec<u32>> =
            prompts.iter().map(|p| resident.generate(p, &options(16, None), |_, _| true).unwrap().tokens).collect();
        let want = &wants[0];
        drop(resident);
        let streamed = |ahead: bool| {
            let mut o = EngineOptions::new(&dir).with_format(WeightFormat::F32);
            (o.budget, o.prefetch, o.cache_dir) =
                (ExpertBudget::Slots(half), PrefetchKind::None, Some(cache.path().into()));
            let e = Engine::load_on(gpu(), &o).unwrap();
            // Drafts proposed by acceptance alone, so both engines draft alike.
            e.set_draft_payoff(false);
            e.set_draft_prefetch(ahead);
            e
        };
        let (off, on) = (streamed(false), streamed(true));
        let plain = off.generate(&prompt, &options(16, LOOKUP), |_, _| true).unwrap();
        let ahead = on.generate(&prompt, &options(16, LOOKUP), |_, _| true).unwrap();
        assert_eq!((&plain.tokens, &ahead.tokens), (want, want), "{fixture}");
        assert!(ahead.stats.draft_steps > 0, "{fixture}: {:?}", ahead.stats);
        let (p, a) = (plain.stats.experts, ahead.stats.experts);
        assert_eq!(p.prefetch_issued, 0, "{fixture}: nothing else prefetches");
        assert!(a.prefetch_used > 0 && a.prefetch_used <= a.prefetch_issued, "{fixture}: {a:?}");
        assert!(a.expert_misses < p.expert_misses, "{fixture}: {a:?} against {p:?}");
        // Two sequences at once through the scheduler, each remembering its own routing: their
        // verify steps read ahead what they use, and miss less, with their solo tokens.
        let scheduled = |e: &Engine| {
            let mut s = Scheduler::new(e, 2).unwrap();
            let ids: Vec<u64> = (prompts.iter())
                .map(|p| s.submit(p.to_vec(), options(16, LOOKUP), Box::new(|_, _, _| true)).unwrap())
                .collect();
            let before = e.expert_stats();
            for f in s.run().unwrap() {
                let which = ids.iter().position(|&id| id == f.id).unwrap();
                assert_eq!(f.result.unwrap().tokens, wants[which], "{fixture}: request {which}");
            }
            e.expert_stats().since(&before)
        };
        let (p, a) = (scheduled(&streamed(false)), scheduled(&streamed(true)));
        assert_eq!(p.prefetch_issued, 0, "{fixture}");
        assert!(a.prefetch_used > 0 && a.expert_misses < p.expert_misses, "{fixture}: {a:?} against {p:?}");
    }
}

/// A model trained here to copy code (`benches/make_copy_model.py`, converted to int4:
/// `tests/fixtures/copy_moe`) rewriting a two-function file with a rename, 128 tokens: prompt
/// lookup (the default n-gram and draft length, paced by acceptance) drafts the passages it
/// copies, nearly all accepted, and gives the plain tokens; at a quarter of the experts in slots
/// its verify steps need fewer expert reads than one token a step (the benchmark's figures:
/// benches/README.md, "On a code-editing prompt").
#[test]
fn prompt_lookup_drafts_the_passages_a_copying_model_copies() {
    let dir = fixtures_dir().join("copy_moe");
    let load = |budget| {
        let mut o = EngineOptions::new(&dir);
        o.budget = budget;
        let e = Engine::load_on(gpu(), &o).unwrap();
        e.set_draft_payoff(false);
        e.set_draft_prefetch(false);
        e
    };
    let e = load(ExpertBudget::Auto);
    let prompt = e.encode(&std::fs::read_to_string(dir.join("prompt.txt")).unwrap()).unwrap();
    let lookup = Some(PromptLookup::default());
    let plain = e.generate(&prompt, &options(128, None), |_, _| true).unwrap();
    let drafted = e.generate(&prompt, &options(128, lookup), |_, _| true).unwrap();
    assert_eq!(drafted.tokens, plain.tokens);
    let s = &drafted.stats;
    let per_step = moestream::runtime::drafts::tokens_per_verify_step(s.accepted_draft_tokens, s.draft_steps);
    assert!(
        s.accepted_draft_tokens * 10 >= s.draft_tokens * 8,
        "{} of {} accepted",
        s.accepted_draft_tokens,
        s.draft_tokens
    );
    assert!(per_step >= 3.5 && s.draft_steps * 3 < 128, "{per_step:.2} tokens per verify step over {}", s.draft_steps);
    drop(e);
    let quarter = load(ExpertBudget::Slots(8));
    let one_a_step = quarter.generate(&prompt, &options(128, None), |_, _| true).unwrap();
    let with_drafts = quarter.generate(&prompt, &options(128, lookup), |_, _| true).unwrap();
    assert_eq!((&one_a_step.tokens, &with_drafts.tokens), (&plain.tokens, &plain.tokens));
    let misses = |g: &moestream::runtime::Generation| g.stats.experts.expert_misses;
    assert!(
        misses(&with_drafts) * 10 < misses(&one_a_step) * 9,
        "{:?} against {:?}",
        with_drafts.stats.experts,
        one_a_step.stats.experts
    );
}
