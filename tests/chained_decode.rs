//! Chained greedy decode (each one-token step submitted before the previous step's token is
//! read, its token taken from the GPU): the same tokens as steps run one at a time, for every
//! fixture family; a reply cut short (cancelled, or at `max_tokens`) leaves a session that
//! continues exactly as a fresh run; models whose steps cannot chain (linear-attention state,
//! streaming) say so and still generate; misuse of the step-level API is refused.

mod common;

use common::{fixtures, gpu, Rng};
use moestream::decoder::StepOutput;
use moestream::experts::predictor::PrefetchKind;
use moestream::ops::WeightFormat;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions};
use moestream::Error;

/// An engine on `dir` that chains greedy steps (not its default on lavapipe).
fn engine(dir: &std::path::Path) -> Engine {
    let e = Engine::load_on(gpu(), &EngineOptions::new(dir).with_format(WeightFormat::F32)).unwrap();
    e.set_chained_decode(true);
    e
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_tokens: n, ignore_eos: true, ..Default::default() }
}

fn prompt(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.below(vocab) as u32).collect()
}

#[test]
fn chained_tokens_equal_one_step_at_a_time() {
    let mut chained_families = 0;
    for (dir, golden) in fixtures() {
        let e = engine(&dir);
        let chains = e.chains_decode();
        let p = golden.prompts.iter().find(|p| p.name == "short").unwrap();
        let chained = e.generate(&p.tokens, &greedy(p.greedy.len()), |_, _| true).unwrap().tokens;
        e.set_chained_decode(false);
        let stepwise = e.generate(&p.tokens, &greedy(p.greedy.len()), |_, _| true).unwrap().tokens;
        assert_eq!(chained, stepwise, "{}: chained vs one step at a time", golden.architecture);
        assert_eq!(chained, p.greedy, "{}: chained vs transformers", golden.architecture);
        let hybrid = e.spec().hybrid.is_some();
        assert_eq!(
            chains, !hybrid,
            "{}: steps chain unless linear-attention state cannot roll back",
            golden.architecture
        );
        chained_families += chains as usize;
    }
    assert!(chained_families >= 10, "only {chained_families} fixtures chained their steps");
}

#[test]
fn a_reply_cut_short_continues_as_a_fresh_run() {
    let (dir, _) = fixtures().into_iter().find(|(d, _)| d.ends_with("mixtral")).unwrap();
    let e = engine(&dir);
    let vocab = e.spec().vocab;
    let (a, b) = (prompt(7, 20, vocab), prompt(8, 5, vocab));
    // Cancelled after 3 tokens: the step run ahead on the 4th token's position is discarded.
    let mut s = e.new_session().unwrap();
    let mut seen = 0;
    let first = e
        .generate_in(&mut s, &a, &greedy(10), |_, _| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!(first.tokens.len(), 3);
    let next = e.generate_in(&mut s, &b, &greedy(6), |_, _| true).unwrap();
    let whole: Vec<u32> = [&a[..], &first.tokens, &b].concat();
    e.set_chained_decode(false);
    assert_eq!(next.tokens, e.generate(&whole, &greedy(6), |_, _| true).unwrap().tokens, "after a cancelled reply");
    // At max_tokens no step runs ahead; the session continues likewise.
    e.set_chained_decode(true);
    let mut s = e.new_session().unwrap();
    let first = e.generate_in(&mut s, &a, &greedy(4), |_, _| true).unwrap();
    let next = e.generate_in(&mut s, &b, &greedy(6), |_, _| true).unwrap();
    let whole: Vec<u32> = [&a[..], &first.tokens, &b].concat();
    e.set_chained_decode(false);
    assert_eq!(next.tokens, e.generate(&whole, &greedy(6), |_, _| true).unwrap().tokens, "after max_tokens");
}

/// One layer's top-k: the smallest expert budget.
fn top_k(dir: &std::path::Path) -> usize {
    moestream::model::ArchSpec::from_dir(dir).unwrap().moe.unwrap().top_k
}

#[test]
fn streaming_steps_do_not_chain_and_match_resident() {
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with("qwen3_moe")).unwrap();
    let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
    let resident = engine(&dir).generate(prompt, &greedy(8), |_, _| true).unwrap().tokens;
    let mut o = EngineOptions::new(&dir).with_format(WeightFormat::F32);
    o.budget = ExpertBudget::Slots(top_k(&dir));
    o.prefetch = PrefetchKind::None;
    let e = Engine::load_on(gpu(), &o).unwrap();
    e.set_chained_decode(true);
    assert!(!e.chains_decode(), "streaming needs each layer's routing");
    assert_eq!(e.generate(prompt, &greedy(8), |_, _| true).unwrap().tokens, resident);
}

#[test]
fn step_level_misuse_is_refused() {
    let (dir, _) = fixtures().into_iter().find(|(d, _)| d.ends_with("llama")).unwrap();
    let e = engine(&dir);
    let m = e.model();
    let vocab = e.spec().vocab as u32;
    let cache = m.new_cache().unwrap();
    let other = engine(&dir);
    let foreign = other.model().new_cache().unwrap();
    let invalid = |r: Result<_, Error>, what: &str| match r {
        Err(Error::InvalidArgument(_)) => {}
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    // Nothing on the GPU to chain from yet, a cache of another model, a token out of range.
    invalid(m.submit_chained(&cache, None, 0).map(|_| ()), "chaining from nothing");
    invalid(m.submit_chained(&foreign, Some(1), 0).map(|_| ()), "another model's cache");
    assert!(matches!(m.submit_chained(&cache, Some(vocab), 0).map(|_| ()), Err(Error::TokenOutOfRange { .. })));
    assert!(matches!(m.submit_chained(&cache, Some(1), e.context()).map(|_| ()), Err(Error::ContextOverflow { .. })));
    // Two in flight at most; chaining only from the position the last greedy step ended at.
    let start = 3;
    let s0 = m.submit_chained(&cache, Some(start), 0).unwrap();
    invalid(m.submit_chained(&cache, None, 2).map(|_| ()), "chaining from another position");
    let s1 = m.submit_chained(&cache, None, 1).unwrap();
    invalid(m.submit_chained(&cache, None, 2).map(|_| ()), "a third step in flight");
    let (t0, t1) = (s0.finish().unwrap(), s1.finish().unwrap());
    assert_ne!(t0, start, "a token that tells the chained one from the one given before");
    // The same tokens as plain steps; a step that is not greedy leaves nothing to chain from.
    let plain = m.new_cache().unwrap();
    let want0 = m.step(&plain, &[start], 0, moestream::experts::policy::Phase::Decode, StepOutput::Argmax).unwrap();
    let want1 = m.step(&plain, &[t0], 1, moestream::experts::policy::Phase::Decode, StepOutput::Argmax).unwrap();
    assert_eq!((want0, want1), (moestream::decoder::StepResult::Token(t0), moestream::decoder::StepResult::Token(t1)));
    m.step(&cache, &[t1], 2, moestream::experts::policy::Phase::Decode, StepOutput::Logits).unwrap();
    invalid(m.submit_chained(&cache, None, 3).map(|_| ()), "chaining after a logits step");
    // A chained step dropped unread is waited for; its staging buffer serves the next one.
    drop(m.submit_chained(&cache, Some(t1), 2).unwrap());
    assert!(m.submit_chained(&cache, None, 3).unwrap().finish().is_ok());
}
