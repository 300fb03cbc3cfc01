//! Sessions keep a sequence's KV cache (grouped K/V or MLA's latent cache) between calls: a sequence fed in three calls (with
//! generated tokens in between) equals one call on the whole sequence (same greedy tokens,
//! next-token log-probs within 1e-5), truncation + regeneration equals a fresh run, interleaved
//! sessions do not disturb each other, each session's cache is reserved from the KV budget (a
//! typed error when one more does not fit), and a context over the budget is refused at load.

mod common;

use common::{fixtures_dir, gpu, max_abs_diff, Rng};
use moestream::ops::{KvDtype, WeightFormat};
use moestream::runtime::{Engine, EngineOptions, GenerateOptions, Session};
use moestream::Error;

const TOL: f32 = 1e-5;

fn options(fixture: &str) -> EngineOptions {
    let mut o = EngineOptions::new(fixtures_dir().join(fixture)).with_format(WeightFormat::F32);
    o.context = Some(300);
    o.kv_dtype = KvDtype::F32;
    o
}

fn engine(fixture: &str) -> Engine {
    Engine::load_on(gpu(), &options(fixture)).unwrap()
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_tokens: n, ignore_eos: true, ..Default::default() }
}

fn prompt(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.below(vocab) as u32).collect()
}

/// Runs `turns` (user tokens, tokens to generate) on `session`; returns each turn's tokens.
fn converse(e: &Engine, session: &mut Session, turns: &[(&[u32], usize)]) -> Vec<Vec<u32>> {
    turns.iter().map(|(user, n)| e.generate_in(session, user, &greedy(*n), |_, _| true).unwrap().tokens).collect()
}

#[test]
fn three_calls_equal_one_call() {
    // Grouped attention (dense and MoE, full and with a 16-key sliding window that every call
    // crosses) and MLA (DeepSeek-V3: compressed queries, the latent cache a per-session state
    // like grouped K/V).
    for fixture in ["llama", "mixtral", "mixtral_swa", "deepseek_v3"] {
        let e = engine(fixture);
        let vocab = e.spec().vocab;
        // Chunks longer than the prefill batch (64) and turns with generated tokens between.
        let (a, b, c) = (prompt(1, 70, vocab), prompt(2, 5, vocab), prompt(3, 130, vocab));
        let mut s = e.new_session().unwrap();
        let turns = converse(&e, &mut s, &[(&a, 4), (&b, 0), (&c, 6)]);
        assert_eq!(turns[1], Vec::<u32>::new());
        let whole: Vec<u32> = [&a[..], &turns[0], &b, &c].concat();
        assert_eq!(s.tokens(), [&whole[..], &turns[2]].concat(), "{fixture}: session history");

        let fresh = e.generate(&whole, &greedy(6), |_, _| true).unwrap();
        assert_eq!(turns[2], fresh.tokens, "{fixture}: tokens after three calls vs one");
        let g = e.generate_in(&mut s, &[], &greedy(0), |_, _| true).unwrap();
        assert_eq!(g.stats.reused_tokens, s.len() - 1, "{fixture}: appending nothing recomputes one position");
        let got = e.next_logprobs_in(&mut s, &[]).unwrap();
        let want = e.next_logprobs(s.tokens()).unwrap();
        let err = max_abs_diff(&got, &want);
        println!("{fixture}: session vs one call, max |Δ logprob| = {err:.2e}");
        assert!(err < TOL, "{fixture}: next-token log-probs differ by {err}");

        // Later turns prefill only their own tokens (plus the last generated one, not yet run).
        let mut s2 = e.new_session().unwrap();
        converse(&e, &mut s2, &[(&a, 4)]);
        let g = e.generate_in(&mut s2, &b, &greedy(0), |_, _| true).unwrap();
        assert_eq!((g.stats.prefilled_tokens, g.stats.reused_tokens), (b.len() + 1, a.len() + 3));
        let g = e.generate_in(&mut s2, &c, &greedy(1), |_, _| true).unwrap();
        assert_eq!(g.stats.prefilled_tokens, c.len(), "{fixture}: prefill of a continued session");
    }
}

#[test]
fn truncate_and_regenerate_equals_a_fresh_run() {
    // Full attention, and windowed layers (12 keys) whose window the rollback point lies past.
    for fixture in ["qwen3", "qwen2_swa"] {
        let e = engine(fixture);
        let p = prompt(7, 90, e.spec().vocab);
        let mut s = e.new_session().unwrap();
        let first = e.generate_in(&mut s, &p, &greedy(8), |_, _| true).unwrap().tokens;
        // Roll back to the prompt: the same answer again, from the cache.
        s.truncate(p.len());
        assert_eq!(s.tokens(), &p[..]);
        let again = e.generate_in(&mut s, &[], &greedy(8), |_, _| true).unwrap();
        assert_eq!(again.tokens, first, "{fixture}");
        assert_eq!(again.stats.reused_tokens, p.len() - 1);
        // Roll back into the prompt and append a different ending.
        s.truncate(50);
        let ending = prompt(8, 20, e.spec().vocab);
        let edited = e.generate_in(&mut s, &ending, &greedy(8), |_, _| true).unwrap().tokens;
        let fresh = e.generate(&[&p[..50], &ending].concat(), &greedy(8), |_, _| true).unwrap().tokens;
        assert_eq!(edited, fresh, "{fixture}");
    }
}

#[test]
fn interleaved_sessions_do_not_disturb_each_other() {
    // Grouped K/V caches and MLA latent caches alike are per session.
    for fixture in ["mixtral", "deepseek_v2"] {
        let e = engine(fixture);
        let v = e.spec().vocab;
        let (a1, a2, b1, b2) = (prompt(11, 40, v), prompt(12, 9, v), prompt(13, 75, v), prompt(14, 3, v));
        let alone = |t1: &[u32], t2: &[u32]| {
            let mut s = e.new_session().unwrap();
            converse(&e, &mut s, &[(t1, 5), (t2, 5)])
        };
        let (want_a, want_b) = (alone(&a1, &a2), alone(&b1, &b2));
        let (mut sa, mut sb) = (e.new_session().unwrap(), e.new_session().unwrap());
        let got_a1 = converse(&e, &mut sa, &[(&a1, 5)]);
        let got_b1 = converse(&e, &mut sb, &[(&b1, 5)]);
        let got_a2 = converse(&e, &mut sa, &[(&a2, 5)]);
        // The default session runs in between, too.
        e.generate(&b2, &greedy(3), |_, _| true).unwrap();
        let got_b2 = converse(&e, &mut sb, &[(&b2, 5)]);
        assert_eq!([&got_a1[0], &got_a2[0]], [&want_a[0], &want_a[1]]);
        assert_eq!([&got_b1[0], &got_b2[0]], [&want_b[0], &want_b[1]]);
    }
}

#[test]
fn sessions_are_reserved_from_the_kv_budget() {
    fn assert_send<T: Send + 'static>() {}
    assert_send::<Session>();
    let mut o = options("llama");
    let spec = moestream::model::ArchSpec::from_dir(&o.model_dir).unwrap();
    let per_session = (2 * spec.layers * spec.kv_dim() * 4 * 300) as u64;
    o.kv_memory = Some(per_session * 5 / 2);
    let e = Engine::load_on(gpu(), &o).unwrap();
    assert_eq!(e.kv_plan().bytes_per_token * 300, per_session);
    let a = e.new_session().unwrap();
    assert_eq!(a.cache_bytes(), per_session);
    let b = e.new_session().unwrap();
    match e.new_session() {
        Err(Error::KvCacheTooLarge { needed, available, .. }) => {
            assert_eq!((needed, available), (per_session, per_session / 2))
        }
        Err(other) => panic!("expected KvCacheTooLarge, got {other}"),
        Ok(_) => panic!("a third session fit a budget of two and a half"),
    }
    drop(a);
    let _c = e.new_session().unwrap();
    drop(b);

    // A context larger than the budget is refused at load; by default the context is what fits.
    o.context = Some(1000);
    o.kv_memory = Some(per_session);
    assert!(matches!(Engine::load_on(gpu(), &o), Err(Error::KvCacheTooLarge { .. })));
    o.context = None;
    assert_eq!(Engine::load_on(gpu(), &o).unwrap().context(), 300);
    o.kv_memory = None;
    assert_eq!(Engine::load_on(gpu(), &o).unwrap().context(), spec.max_positions);

    // A session of one engine cannot run on another.
    let other = engine("llama");
    let mut s = e.new_session().unwrap();
    assert!(matches!(other.generate_in(&mut s, &[1, 2], &greedy(1), |_, _| true), Err(Error::InvalidArgument(_))));
}

#[test]
fn scoring_a_session_in_parts_equals_scoring_it_whole() {
    let e = engine("qwen3");
    let p = prompt(21, 150, e.spec().vocab);
    let whole = e.score(&p).unwrap().logprobs;
    let mut s = e.new_session().unwrap();
    let mut parts = e.score_in(&mut s, &p[..1]).unwrap().logprobs;
    assert!(parts.is_empty(), "a first token has nothing before it");
    parts.extend(e.score_in(&mut s, &p[1..70]).unwrap().logprobs);
    parts.extend(e.score_in(&mut s, &p[70..]).unwrap().logprobs);
    assert_eq!(parts.len(), whole.len());
    let err = max_abs_diff(&parts, &whole);
    assert!(err < TOL, "scored in parts vs whole: {err}");
    // A generation after scoring equals one on the whole prompt.
    let g = e.generate_in(&mut s, &[], &greedy(5), |_, _| true).unwrap().tokens;
    assert_eq!(g, e.generate(&p, &greedy(5), |_, _| true).unwrap().tokens);
}
