//! The chunked gated delta rule in whole models: each hybrid fixture's 1100-token golden prompt
//! (Qwen3-Next's and Qwen3.5-MoE's Gated DeltaNet, Ling's KDA), prefilled in steps of 64 tokens
//! (two chunks each) with the chunked form and token by token: the prompt's log-probabilities
//! agree within 1e-3 (measured: 3.2e-4 Qwen3-Next, 2.0e-4 Qwen3.5-MoE, 4.6e-5 Ling; the delta rule's own
//! output agrees within 1e-4, tests/kernels_linear_attention.rs), greedy decoding after it gives
//! the same tokens, and the chunked form is no further from transformers' log-probabilities than
//! the token-by-token one.

mod common;

use common::{fixtures, gpu, gpu_sequential_delta_rule, max_abs_diff};
use moestream::gpu::Gpu;
use moestream::ops::WeightFormat;
use moestream::runtime::{Engine, EngineOptions, GenerateOptions};
use std::sync::Arc;

#[test]
fn chunked_prefill_matches_token_by_token_on_long_prompts() {
    for fixture in ["qwen3_next", "qwen3_5_moe", "ling"] {
        let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with(fixture)).unwrap();
        let long = golden.prompts.iter().find(|p| p.name == "long").unwrap();
        assert!(long.tokens.len() >= 1000);
        let gen = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
        let run = |gpu: Arc<Gpu>| {
            let mut o = EngineOptions::new(&dir).with_format(WeightFormat::F32);
            o.context = Some(1200);
            let e = Engine::load_on(gpu, &o).unwrap();
            (e.score(&long.tokens).unwrap().logprobs, e.generate(&long.tokens, &gen, |_, _| true).unwrap().tokens)
        };
        let (chunked, chunked_tokens) = run(gpu());
        let (sequential, sequential_tokens) = run(gpu_sequential_delta_rule());
        let err = max_abs_diff(&chunked, &sequential);
        let (from_golden, sequential_from_golden) =
            (max_abs_diff(&chunked, &long.logprobs), max_abs_diff(&sequential, &long.logprobs));
        println!(
            "{fixture}: chunked vs token by token, max |Δ log-prob| {err:.2e} over {}; from transformers \
             {from_golden:.2e} (token by token {sequential_from_golden:.2e})",
            chunked.len()
        );
        assert!(err <= 1e-3, "{fixture}: chunked prefill differs by {err}");
        assert_eq!(chunked_tokens, sequential_tokens, "{fixture}: greedy tokens after the prompt");
        assert!(
            from_golden <= sequential_from_golden + 2e-4,
            "{fixture}: chunked prefill is {from_golden} from transformers, token by token {sequential_from_golden}"
        );
    }
}
