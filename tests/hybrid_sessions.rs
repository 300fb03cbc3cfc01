//! Sessions on the hybrid linear-attention models (Qwen3-Next's Gated DeltaNet, Ling's KDA and
//! MLA): a recurrent state cannot be rolled back, so appending a turn continues it and a
//! rollback resumes from the nearest snapshot of the states (or recomputes the sequence from
//! position 0); each must give exactly what a fresh run of
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

#[test]
fn states_are_held_once_until_drafts_need_their_copy() {
    use moestream::decoder::StepOutput;
    use moestream::experts::policy::Phase;
    use moestream::model::{ArchSpec, CacheShape};
    let e = engine("qwen3_next");
    let m = e.model();
    let spec = ArchSpec::from_dir(&fixtures_dir().join("qwen3_next")).unwrap();
    // A resident model: each state once, as llama.cpp holds it; plain steps make no copy.
    let shape = CacheShape { state_copy: false, ..m.options().cache_shape() };
    let once = spec.kv_cache_bytes(shape, m.options().kv_dtype);
    let prompt: Vec<u32> = (1..30).collect();
    let cache = m.new_cache().unwrap();
    assert_eq!(cache.bytes(), once);
    m.step(&cache, &prompt, 0, Phase::Prefill, StepOutput::None).unwrap();
    assert_eq!(cache.bytes(), once, "plain steps make no copy");
    // A step of drafts keeps each token's states: their per-token copies are made then, from
    // the KV budget, and cutting the step back to the kept tokens equals running them alone.
    // A longer step saves the states first (one copy of every state) and runs the kept tokens
    // again, to the same end.
    let rows = moestream::decoder::TOKEN_STATE_ROWS;
    let cut_back = |cache: &moestream::decoder::SequenceCache, drafted: &[u32], kept: usize| {
        m.step_drafted(cache, drafted, prompt.len()).unwrap();
        m.keep_drafted(cache, drafted, prompt.len(), kept).unwrap();
        let next = prompt.len() + kept;
        let after = m.step(cache, &[43], next, Phase::Decode, StepOutput::Logits).unwrap();
        let fresh = m.new_cache().unwrap();
        m.step(&fresh, &[&prompt[..], &drafted[..kept]].concat(), 0, Phase::Prefill, StepOutput::None).unwrap();
        let want = m.step(&fresh, &[43], next, Phase::Decode, StepOutput::Logits).unwrap();
        let (a, b) = (after.into_logits().unwrap(), want.into_logits().unwrap());
        assert!(common::max_abs_diff(&a, &b) < 1e-4, "{} drafted, {kept} kept vs the kept tokens alone", drafted.len());
    };
    cut_back(&cache, &[40, 41, 42], 1);
    assert_eq!(cache.bytes(), once + rows as u64 * spec.linear_state_bytes(), "per-token copies of every state");
    for kept in [2, 3] {
        let cache = m.new_cache().unwrap();
        m.step(&cache, &prompt, 0, Phase::Prefill, StepOutput::None).unwrap();
        cut_back(&cache, &[40, 41, 42], kept);
    }
    let cache = m.new_cache().unwrap();
    m.step(&cache, &prompt, 0, Phase::Prefill, StepOutput::None).unwrap();
    let long: Vec<u32> = (40..40 + rows as u32 + 2).collect();
    cut_back(&cache, &long, 2);
    assert_eq!(cache.bytes(), once + spec.linear_state_bytes(), "one copy of every state");
}

#[test]
fn rollbacks_resume_from_the_nearest_state_snapshot() {
    for snapshots in [2, 0] {
        let mut o = EngineOptions::new(fixtures_dir().join("qwen3_next")).with_format(WeightFormat::F32);
        o.context = Some(512);
        o.state_snapshots = snapshots;
        let e = Engine::load_on(gpu(), &o).unwrap();
        let greedy = GenerateOptions { max_tokens: 5, ignore_eos: true, ..Default::default() };
        // Turn 1: 150 tokens, prefilled in chunks of 64: its last chunk starts at 128.
        let (turn1, turn2): (Vec<u32>, Vec<u32>) = ((1..151).collect(), (200..300).map(|t| t % 380).collect());
        let mut s = e.new_session().unwrap();
        e.generate_in(&mut s, &turn1, &greedy, |_, _| true).unwrap();
        let one_state = s.cache_bytes();
        // Turn 2: 100 more tokens after the reply; the cache holds 154 (the last reply token is
        // not run), so its chunks start at 154 and 218.
        e.generate_in(&mut s, &turn2, &greedy, |_, _| true).unwrap();
        // Regenerate turn 2's reply: from the snapshot at 218, not from 0.
        let end2 = turn1.len() + 5 + turn2.len();
        s.truncate(end2);
        let again = e.generate_in(&mut s, &[], &greedy, |_, _| true).unwrap();
        let fresh = e.generate(&s.tokens()[..end2], &greedy, |_, _| true).unwrap();
        assert_eq!(again.tokens, fresh.tokens, "snapshots {snapshots}: regenerated reply");
        assert_eq!(again.stats.reused_tokens, if snapshots > 0 { 218 } else { 0 }, "snapshots {snapshots}");
        // Back into turn 1's reply: the snapshot at 128.
        s.truncate(152);
        let back = e.generate_in(&mut s, &[], &greedy, |_, _| true).unwrap();
        let fresh = e.generate(&s.tokens()[..152], &greedy, |_, _| true).unwrap();
        assert_eq!(back.tokens, fresh.tokens, "snapshots {snapshots}: after the rollback into turn 1");
        assert_eq!(back.stats.reused_tokens, if snapshots > 0 { 128 } else { 0 }, "snapshots {snapshots}");
        // Before every snapshot: from 0.
        s.truncate(100);
        let start = e.generate_in(&mut s, &[], &greedy, |_, _| true).unwrap();
        assert_eq!(start.stats.reused_tokens, 0);
        // Each snapshot holds the states once, from the KV budget.
        let spec = e.spec();
        assert!(s.cache_bytes() <= one_state + snapshots as u64 * spec.linear_state_bytes());
    }
}
