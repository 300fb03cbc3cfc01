//! `bench profile`: every dispatch timed, by timestamps inside the pass, by a pass of its own
//! with timestamps at its ends, or by a submission of its own (lavapipe offers all three).

mod common;

use moestream::bench::profile::{self, ProfileOptions};
use moestream::gpu::profiler::ProfileTiming;
use moestream::gpu::GpuOptions;
use moestream::{Engine, EngineOptions};

fn engine(profile: bool) -> Engine {
    engine_timed(profile, None)
}

fn engine_timed(profile: bool, profile_timing: Option<ProfileTiming>) -> Engine {
    let mut options = EngineOptions::new(common::fixtures_dir().join("mixtral"));
    options.context = Some(256);
    options.gpu = GpuOptions { profile, profile_timing, ..Default::default() };
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
    assert_eq!(r.shader_checks, engine.gpu().caps.shader_checks, "the report says how its kernels were built");
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
    // Per (MoE) layer q|k|v in one, o and the router; then the lm_head: one matvec each per
    // step (every matrix fits one chunk); per layer the input norm (which adds the previous
    // layer's experts' outputs), the FFN norm and the top-k; the final norm adds the last ones.
    assert!(spec.moe_layers.iter().all(|&m| m));
    let layers = spec.layers as u64;
    assert_eq!(decode("matvec").dispatches, 4 * (3 * layers + 1));
    assert_eq!(decode("rms_norm").dispatches, 4 * (2 * layers + 1));
    assert_eq!(decode("router_topk").dispatches, 4 * layers);
    assert!(r.decode.kernels.iter().all(|k| k.kernel != "moe_combine"), "the final norm adds the last experts");
    // Per layer one kv_store and one attention (one KV chunk, context 256 = one split).
    assert_eq!(decode("kv_store").dispatches, 4 * spec.layers as u64);
    assert_eq!(decode("attention").dispatches, 4 * spec.layers as u64);
    assert_eq!(decode("expert_gate_up").dispatches, 4 * spec.layers as u64);
    // Dense matrices prefill in the tiled GEMM on GPUs, through the matvec on CPU adapters.
    let dense = if engine.gpu().caps.tiled_prefill { "matmul" } else { "matvec" };
    assert!(r.prefill.kernels.iter().any(|k| k.kernel == dense), "{dense} in prefill");
    assert!(r.markdown().contains("| matvec |"));
}

#[test]
fn profiling_does_not_change_results() {
    let tokens = [3u32, 1, 4, 1, 5, 9, 2, 6];
    let plain = engine(false).score(&tokens).unwrap().logprobs;
    for timing in ProfileTiming::ALL {
        let profiled = engine_timed(true, Some(timing)).score(&tokens).unwrap().logprobs;
        assert_eq!(plain, profiled, "{timing:?}");
    }
}

#[test]
fn every_timing_times_the_same_dispatches() {
    // The fallbacks (a pass per dispatch for adapters without timestamps inside passes, e.g.
    // Apple GPUs; a submission per dispatch for adapters without timestamps) see every
    // dispatch the in-pass timestamps see, and generate the same tokens.
    let o = ProfileOptions { prompt_tokens: 12, decode_tokens: 4, seed: 5 };
    let reports: Vec<_> = ProfileTiming::ALL
        .into_iter()
        .map(|timing| {
            let engine = engine_timed(true, Some(timing));
            let r = profile::run(&engine, &o).unwrap();
            assert_eq!(r.timing, timing);
            assert!(r.markdown().contains("| matvec |"));
            r
        })
        .collect();
    let counts = |p: &moestream::gpu::profiler::StepKindProfile| {
        let mut c: Vec<(String, u64)> = p.kernels.iter().map(|k| (k.kernel.clone(), k.dispatches)).collect();
        c.sort();
        c
    };
    for r in &reports {
        for p in [&r.decode, &r.prefill] {
            assert!(p.gpu_ms > 0.0, "{:?}: no time", r.timing);
            assert!(p.kernels.iter().all(|k| k.ms > 0.0), "{:?}: a kernel timed at 0 ms", r.timing);
            let share: f64 = p.kernels.iter().map(|k| k.share).sum();
            assert!((share - 1.0).abs() < 1e-9, "{:?}: shares sum to {share}", r.timing);
        }
        // The dispatches of a decode step take part of its wall-clock time, never more.
        let busy = r.decode_busy_share;
        assert!(busy > 0.0 && busy <= 1.0, "{:?}: GPU busy for {busy} of a decode step", r.timing);
        assert!(r.markdown().contains("GPU busy"));
        assert_eq!(counts(&r.decode), counts(&reports[0].decode), "{:?} decode", r.timing);
        assert_eq!(counts(&r.prefill), counts(&reports[0].prefill), "{:?} prefill", r.timing);
    }
    let json = serde_json::to_value(&reports[1]).unwrap();
    assert_eq!(json["timing"], "pass-boundaries");
}

#[test]
fn the_best_timing_follows_the_adapters_features() {
    use wgpu::Features as F;
    let inside = F::TIMESTAMP_QUERY | F::TIMESTAMP_QUERY_INSIDE_PASSES;
    assert_eq!(ProfileTiming::best(inside | F::SUBGROUP), ProfileTiming::InsidePasses);
    assert_eq!(ProfileTiming::best(F::TIMESTAMP_QUERY), ProfileTiming::PassBoundaries);
    assert_eq!(ProfileTiming::best(F::SHADER_F16), ProfileTiming::Submits);
    for t in ProfileTiming::ALL {
        assert_eq!(ProfileTiming::parse(t.name()), Ok(t));
    }
    let err = ProfileTiming::parse("fast").unwrap_err();
    assert!(err.contains("inside-passes, pass-boundaries, submits"), "{err}");
}

#[test]
fn sections_split_a_hybrid_step_by_layer_kind() {
    // Qwen3-Next fixture: layers 0-2 Gated DeltaNet, layer 3 gated full attention; layers 1 and
    // 3 MoE, 0 and 2 dense.
    let mut options = EngineOptions::new(common::fixtures_dir().join("qwen3_next"));
    options.context = Some(64);
    options.gpu = GpuOptions { profile: true, ..Default::default() };
    let engine = Engine::load(&options).unwrap();
    let r = profile::run(&engine, &ProfileOptions { prompt_tokens: 12, decode_tokens: 3, seed: 1 }).unwrap();
    for p in [&r.decode, &r.prefill] {
        let mut names: Vec<&str> = p.sections.iter().map(|s| s.section.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            ["MoE FFN", "dense FFN", "embed", "final norm + lm_head", "full attention", "linear attention"]
        );
        let share: f64 = p.sections.iter().map(|s| s.share).sum();
        assert!((share - 1.0).abs() < 1e-9, "section shares sum to {share}");
        let dispatches = |it: &mut dyn Iterator<Item = u64>| it.sum::<u64>();
        assert_eq!(
            dispatches(&mut p.sections.iter().map(|s| s.dispatches)),
            dispatches(&mut p.kernels.iter().map(|k| k.dispatches))
        );
    }
    let section = |name: &str| r.decode.sections.iter().find(|s| s.section == name).unwrap().dispatches;
    let kernel = |name: &str| r.decode.kernels.iter().find(|k| k.kernel == name).unwrap().dispatches;
    // Every conv and delta-rule dispatch is a linear-attention layer's; three such layers per step.
    assert_eq!(kernel("gated_delta_rule"), 3 * r.decode.steps);
    assert!(section("linear attention") > kernel("causal_conv1d") + kernel("gated_delta_rule"));
    assert!(r.markdown().contains("| linear attention |"));
}

#[test]
fn devices_name_the_timing_bench_profile_uses() {
    for d in moestream::gpu::Gpu::list_adapters() {
        let has = |f: &str| d.features.iter().any(|n| n == f);
        let want = match (has("TIMESTAMP_QUERY"), has("TIMESTAMP_QUERY_INSIDE_PASSES")) {
            (true, true) => ProfileTiming::InsidePasses,
            (true, false) => ProfileTiming::PassBoundaries,
            _ => ProfileTiming::Submits,
        };
        assert_eq!(d.profile_timing, want, "{}: {:?}", d.name, d.features);
    }
}
