//! `bench context`: the sweep's bookkeeping (bytes read grow with depth by the KV cache's
//! bytes per position; the roofline ratio is step time over bytes / bandwidth) and its errors.

mod common;

use moestream::bench::context::{self, ContextBenchOptions};
use moestream::{Engine, EngineOptions, Error};

#[test]
fn depths_add_their_kv_bytes_to_the_bytes_read() {
    let mut options = EngineOptions::new(common::fixtures_dir().join("mixtral"));
    options.context = Some(128);
    let engine = Engine::load(&options).unwrap();
    let kv = engine.kv_plan().bytes_per_token;
    let o = ContextBenchOptions {
        depths: vec![8, 72],
        decode_tokens: 4,
        seed: 1,
        kernel_seconds: 0.05,
        skip_prefill: false,
    };
    let r = context::run(&engine, &o).unwrap();
    assert_eq!(r.depths.len(), 2);
    assert!(r.read_gbps > 0.0 && r.weight_bytes_per_token > 0);
    let (a, b) = (&r.depths[0], &r.depths[1]);
    assert_eq!(b.bytes_per_token - a.bytes_per_token, 64 * kv);
    assert_eq!(b.kv_bytes, 72 * kv);
    for d in &r.depths {
        assert!(d.prefill_tokens_per_s.is_some_and(|t| t > 0.0) && d.decode_tokens_per_s > 0.0);
        assert!((d.vs_roofline - d.step_ms / d.roofline_ms).abs() < 1e-9);
    }
    assert!(r.markdown().contains("| 72 |"));
    let too_deep = ContextBenchOptions { depths: vec![126], ..o };
    assert!(matches!(context::run(&engine, &too_deep), Err(Error::InvalidArgument(_))));
}

/// `skip_prefill` decodes at each depth over a session that takes the prompt as cached (zeros):
/// the same bytes per step, no prefill figure; on an MLA model (latent cache) and a hybrid one
/// (recurrent state) too.
#[test]
fn skipped_prefill_decodes_at_depth_without_prefill_figures() {
    for family in ["deepseek_v2", "qwen3_next"] {
        let mut options = EngineOptions::new(common::fixtures_dir().join(family));
        options.context = Some(128);
        let engine = Engine::load(&options).unwrap();
        let kv = engine.kv_plan().bytes_per_token;
        let o = ContextBenchOptions {
            depths: vec![8, 100],
            decode_tokens: 4,
            seed: 1,
            kernel_seconds: 0.05,
            skip_prefill: true,
        };
        let r = context::run(&engine, &o).unwrap();
        let (a, b) = (&r.depths[0], &r.depths[1]);
        assert_eq!(b.bytes_per_token - a.bytes_per_token, 92 * kv, "{family}");
        for d in &r.depths {
            assert_eq!(d.prefill_tokens_per_s, None, "{family}");
            assert!(d.decode_tokens_per_s > 0.0 && d.step_ms.is_finite(), "{family}");
        }
        assert!(r.markdown().contains("| 100 | skipped |"), "{family}");
    }
}
