//! Past the old 4096-token cap: a 4500-token prompt on a tiny llama whose maximum context is
//! 8192 (`tests/fixtures/long_context`, made by `make_long_context.py` with transformers),
//! prefilled in chunks of 64 and decoded with split-K attention (18 splits of 256 keys).
//! f32 KV cache: every log-prob and the last position's distribution within 1e-3, greedy tokens
//! exact. f16 KV cache: within 1e-2, greedy tokens exact. q8_0 KV cache (6.1e-2 measured):
//! within 0.1, greedy tokens exact. No step allocates GPU memory: what the
//! engine holds after the long prompt is what it held before.

mod common;

use common::{fixtures_dir, gpu, max_abs_diff};
use moestream::ops::{KvDtype, WeightFormat};
use moestream::runtime::{Engine, EngineOptions, GenerateOptions};

#[derive(serde::Deserialize)]
struct LongGolden {
    max_position_embeddings: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    last_logprobs: Vec<f32>,
    greedy: Vec<u32>,
}

fn golden() -> LongGolden {
    let path = fixtures_dir().join("long_context/long_golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn prompt_past_4096_tokens_matches_transformers() {
    let g = golden();
    assert!(g.tokens.len() > 4096);
    for (kv_dtype, tol) in [(KvDtype::F32, 1e-3), (KvDtype::F16, 1e-2), (KvDtype::Q8_0, 0.1)] {
        let mut o = EngineOptions::new(fixtures_dir().join("long_context")).with_format(WeightFormat::F32);
        o.kv_dtype = kv_dtype;
        let e = Engine::load_on(gpu(), &o).unwrap();
        assert_eq!(e.context(), g.max_position_embeddings, "the default context is the model's maximum");
        let held = e.gpu().bytes_allocated();
        let mut s = e.new_session().unwrap();
        let held_with_session = e.gpu().bytes_allocated();
        assert_eq!(held_with_session - held, s.cache_bytes());

        // One pass: score the prompt, then generate after it (only its last position is new).
        let scored = e.score_in(&mut s, &g.tokens).unwrap().logprobs;
        let err = max_abs_diff(&scored, &g.logprobs);
        assert_eq!(e.gpu().bytes_allocated(), held_with_session, "a long prompt allocates nothing");
        let last = e.next_logprobs_in(&mut s, &[]).unwrap();
        let last_err = max_abs_diff(&last, &g.last_logprobs);
        let opts = GenerateOptions { max_tokens: g.greedy.len(), ignore_eos: true, ..Default::default() };
        let out = e.generate_in(&mut s, &[], &opts, |_, _| true).unwrap();
        assert_eq!(out.tokens, g.greedy, "{kv_dtype:?}: greedy tokens");
        assert_eq!(out.stats.prefilled_tokens, 1);
        println!(
            "{kv_dtype:?} KV: max |Δ logprob| = {err:.2e} over {} positions, last position {last_err:.2e}",
            scored.len()
        );
        assert!(err < tol && last_err < tol, "{kv_dtype:?} KV: log-prob error {err}, last position {last_err}");
    }
}
