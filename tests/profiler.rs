//! `bench profile`: per-kernel timestamps around every dispatch.

mod common;

use moestream::bench::profile::{self, ProfileOptions};
use moestream::gpu::GpuOptions;
use moestream::{Engine, EngineOptions};

fn engine(profile: bool) -> Engine {
    let mut options = EngineOptions::new(common::fixtures_dir().join("mixtral"));
    options.context = Some(256);
    options.gpu = GpuOptions { profile, ..Default::default() };
    Engine::load(&options).unwrap()
}

#[test]
fn every_kernel_of_a_step_is_timed_with_its_bytes() {
    let engine = engine(true);
    let spec = engine.spec().clone();
    let o = ProfileOptions { prompt_tokens: 20, decode_tokens: 5, seed: 3 };
    let r = profile::run(&engine, &o).unwrap();
    // The whole prompt is one prefill chunk (its last token's logits give the first generated
    // token); the next 4 generated tokens run as one-token steps.
    assert_eq!((r.decode.steps, r.decode.tokens), (4, 4));
    assert_eq!((r.prefill.steps, r.prefill.tokens), (1, 20));
    for p in [&r.decode, &r.prefill] {
        assert_eq!(p.untimed_dispatches, 0);
        let share: f64 = p.kernels.iter().map(|k| k.share).sum();
        assert!((share - 1.0).abs() < 1e-9, "shares sum to {share}");
        assert!(p.gpu_ms > 0.0);
        for k in &p.kernels {
            assert!(k.bytes > 0, "{} has no modelled bytes", k.kernel);
        }
    }
    let decode = |name: &str| r.decode.kernels.iter().find(|k| k.kernel == name).unwrap_or_else(|| panic!("{name}"));
    // Per (MoE) layer q, k, v, o and the router; then the lm_head: one matvec each per step
    // (every matrix fits one chunk).
    assert!(spec.moe_layers.iter().all(|&m| m));
    // Per layer one kv_store and one attention (one KV chunk, context 256 = one split).
    assert_eq!(decode("matvec").dispatches, 4 * (5 * spec.layers as u64 + 1));
    assert_eq!(decode("kv_store").dispatches, 4 * spec.layers as u64);
    assert_eq!(decode("attention").dispatches, 4 * spec.layers as u64);
    assert_eq!(decode("expert_gate_up").dispatches, 4 * spec.layers as u64);
    assert!(r.prefill.kernels.iter().any(|k| k.kernel == "matmul"));
    assert!(r.markdown().contains("| matvec |"));
}

#[test]
fn profiling_does_not_change_results() {
    let tokens = [3u32, 1, 4, 1, 5, 9, 2, 6];
    let plain = engine(false).score(&tokens).unwrap().logprobs;
    let profiled = engine(true).score(&tokens).unwrap().logprobs;
    assert_eq!(plain, profiled);
}
