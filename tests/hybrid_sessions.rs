//! Sessions on the hybrid linear-attention models (Qwen3-Next's Gated DeltaNet, Ling's KDA and
//! MLA): a recurrent state cannot be rolled back, so appending a turn continues it and a
//! rollback recomputes the sequence from position 0; both must give exactly what a fresh run of
//! the whole sequence gives.

mod common;

use common::{fixtures_dir, gpu};
use moestream::ops::WeightFormat;
use moestream::runtime::{Engine, EngineOptions, GenerateOptions};

fn engine(fixture: &str) -> Engine {
    let mut o = EngineOptions::new(fixtures_dir().join(fixture)).with_format(WeightFormat::F32);
    o.context = Some(256);
    Engine::load_on(gpu(), &o).unwrap()
}

#[test]
fn appended_turns_and_rollbacks_match_a_fresh_run() {
    for fixture in ["qwen3_next", "ling"] {
        appended_turns_and_rollbacks(fixture);
    }
}

fn appended_turns_and_rollbacks(fixture: &str) {
    let e = engine(fixture);
    let greedy = GenerateOptions { max_tokens: 5, ignore_eos: true, ..Default::default() };
    let (turn1, turn2, other): (Vec<u32>, Vec<u32>, Vec<u32>) =
        ((1..40).collect(), (100..110).collect(), (200..207).collect());
    let mut s = e.new_session().unwrap();
    e.generate_in(&mut s, &turn1, &greedy, |_, _| true).unwrap();
    let second = e.generate_in(&mut s, &turn2, &greedy, |_, _| true).unwrap();
    let whole = s.tokens()[..s.len() - second.tokens.len()].to_vec();
    let fresh = e.generate(&whole, &greedy, |_, _| true).unwrap();
    assert_eq!(second.tokens, fresh.tokens, "{fixture}: appended turn");
    assert!(second.stats.reused_tokens > turn1.len(), "the second turn continued the state");

    // Roll back to the first turn and take another branch: the state is recomputed from 0.
    s.truncate(turn1.len());
    let branch = e.generate_in(&mut s, &other, &greedy, |_, _| true).unwrap();
    let fresh = e.generate(&[turn1.clone(), other.clone()].concat(), &greedy, |_, _| true).unwrap();
    assert_eq!(branch.tokens, fresh.tokens, "{fixture}: rolled-back branch");

    // Scoring appended tokens continues the state too. The session's state went through
    // one-token decode steps (matvec) where the fresh run prefills (matmul): equal within the
    // golden tolerance, not bit for bit.
    let more: Vec<u32> = (300..306).collect();
    let scored = e.score_in(&mut s, &more).unwrap();
    let fresh = e.score(s.tokens()).unwrap();
    let tail = &fresh.logprobs[fresh.logprobs.len() - scored.logprobs.len()..];
    let err = common::max_abs_diff(&scored.logprobs, tail);
    assert!(err < 1e-3, "{fixture}: scored continuation differs by {err}");
}
