//! int4 weights on the GPU against the CPU reference run on exactly the same (dequantized)
//! weights: log-probs within 1e-3 and greedy tokens exact, for both int4 schemes and both
//! group sizes, through the conversion that int4 runs of Hugging Face directories use.

mod common;

use common::{fixtures, gpu, max_abs_diff};
use moestream::decoder::DecoderOptions;
use moestream::ops::WeightFormat;
use moestream::quant::{Int4Scheme, QuantParams};
use moestream::reference::ReferenceModel;
use moestream::runtime::{Engine, EngineOptions, GenerateOptions};

fn int4(scheme: Int4Scheme, group_size: usize) -> WeightFormat {
    WeightFormat::Int4(QuantParams { scheme, group_size })
}

fn check(format: WeightFormat, prompt_names: &[&str]) {
    for (dir, golden) in fixtures() {
        let mut o = EngineOptions::new(&dir).with_format(format);
        o.context = Some(1200);
        o.kv_dtype = moestream::ops::KvDtype::F32;
        // int4 runs of Hugging Face directories convert once into this cache.
        o.cache_dir = Some(std::env::temp_dir().join(format!("moestream-int4-cache-{}", std::process::id())));
        let engine = Engine::load_on(gpu(), &o).unwrap();
        let decoder = DecoderOptions {
            experts: format,
            dense: format,
            context: 1200,
            kv_dtype: moestream::ops::KvDtype::F32,
            kv_budget: u64::MAX,
            max_batch: 64,
            window_rings: true,
            state_snapshots: 0,
            streaming: None,
            mtp: false,
        };
        let reference = ReferenceModel::load(&dir).unwrap().rounded_like(&decoder).unwrap();
        for p in golden.prompts.iter().filter(|p| prompt_names.contains(&p.name.as_str())) {
            let gpu_lp = engine.score(&p.tokens).unwrap().logprobs;
            let cpu_lp = reference.log_probs(&p.tokens).unwrap();
            let err = max_abs_diff(&gpu_lp, &cpu_lp);
            let drift = max_abs_diff(&gpu_lp, &p.logprobs);
            println!(
                "{} {} {}: |GPU-CPU| {err:.2e}, |int4-f32 golden| {drift:.3}",
                golden.architecture,
                format.name(),
                p.name
            );
            assert!(err < 1e-3, "{} {}: GPU vs reference on int4 weights: {err}", golden.architecture, p.name);
            let opts = GenerateOptions { max_tokens: 6, ignore_eos: true, ..Default::default() };
            let g = engine.generate(&p.tokens, &opts, |_, _| true).unwrap();
            assert_eq!(g.tokens, reference.greedy(&p.tokens, 6).unwrap(), "{} {}: greedy", golden.architecture, p.name);
        }
    }
}

#[test]
fn affine_g32_matches_reference_on_dequantized_weights() {
    check(int4(Int4Scheme::Affine, 32), &["short", "text"]);
}

#[test]
fn symmetric_g64_matches_reference_on_dequantized_weights() {
    check(int4(Int4Scheme::Symmetric, 64), &["short"]);
}
