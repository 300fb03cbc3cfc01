//! MLA's two cache forms run the same model: the latent cache (absorbed attention) and the
//! decompressed per-head K/V cache (`--mla-cache decompressed`: `kv_b_proj · latent` stored per
//! head, plain attention) give the same log-probabilities and greedy tokens on the DeepSeek-V2
//! (plain `q_proj`, group-limited routing) and DeepSeek-V3 (compressed queries, sigmoid routing)
//! fixtures, for a prompt scored in prefill chunks and for decode steps past the split-K
//! threshold (256 keys), with f32 and f16 caches; and each states its own KV bytes per token.
//!
//! Tolerance on log-probs: f32 caches 2e-5 (the same attention in two summation orders; seen:
//! 4e-6); f16 caches 5e-3 (the two forms round different numbers to f16, the latent vs every
//! head's keys and values; seen: 1.5e-3).

mod common;

use common::{fixtures_dir, gpu, max_abs_diff, Rng};
use moestream::model::MlaCacheKind;
use moestream::ops::{KvDtype, WeightFormat};
use moestream::runtime::{Engine, EngineOptions, GenerateOptions};

fn engine(fixture: &str, cache: MlaCacheKind, kv_dtype: KvDtype) -> Engine {
    let mut o = EngineOptions::new(fixtures_dir().join(fixture)).with_format(WeightFormat::F32);
    o.context = Some(320);
    o.kv_dtype = kv_dtype;
    o.mla_cache = cache;
    Engine::load_on(gpu(), &o).unwrap()
}

fn prompt(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.below(vocab) as u32).collect()
}

#[test]
fn latent_and_decompressed_caches_agree() {
    for fixture in ["deepseek_v2", "deepseek_v3"] {
        for (dtype, tol) in [(KvDtype::F32, 2e-5), (KvDtype::F16, 5e-3)] {
            let latent = engine(fixture, MlaCacheKind::Latent, dtype);
            let decompressed = engine(fixture, MlaCacheKind::Decompressed, dtype);
            let what = format!("{fixture} {dtype:?}");
            let spec = latent.spec();
            let m = spec.mla().expect("an MLA fixture");
            let layers = spec.layers as u64;
            let bytes = dtype.row_bytes(1) as u64;
            assert_eq!(latent.kv_plan().bytes_per_token, layers * (m.kv_lora_rank + m.qk_rope_head_dim) as u64 * bytes);
            let per_head = (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) as u64;
            assert_eq!(decompressed.kv_plan().bytes_per_token, layers * spec.heads as u64 * per_head * bytes, "{what}");

            // Prefill: 150 tokens in chunks of the activation batch.
            let tokens = prompt(5, 150, spec.vocab);
            let (a, b) = (latent.score(&tokens).unwrap(), decompressed.score(&tokens).unwrap());
            let d = max_abs_diff(&a.logprobs, &b.logprobs);
            assert!(d <= tol, "{what}: scored log-probs differ by {d}");

            // Decode past 256 keys (split-K): one token per step after a 280-token prompt.
            let prompt = prompt(6, 280, spec.vocab);
            let (mut sa, mut sb) = (latent.new_session().unwrap(), decompressed.new_session().unwrap());
            let mut next = prompt.clone();
            for step in 0..6 {
                let la = latent.next_logprobs_in(&mut sa, &next).unwrap();
                let lb = decompressed.next_logprobs_in(&mut sb, &next).unwrap();
                let d = max_abs_diff(&la, &lb);
                assert!(d <= tol, "{what}: next-token log-probs at decode step {step} differ by {d}");
                next = vec![(step * 37 % spec.vocab) as u32];
            }
            let greedy = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
            let ga = latent.generate(&prompt, &greedy, |_, _| true).unwrap();
            let gb = decompressed.generate(&prompt, &greedy, |_, _| true).unwrap();
            if dtype == KvDtype::F32 {
                assert_eq!(ga.tokens, gb.tokens, "{what}: greedy tokens");
            }
        }
    }
}
