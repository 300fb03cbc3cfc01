//! `bench context`: the sweep's bookkeeping (bytes read grow with depth by the KV cache's
//! bytes per position; the roofline ratio is step time over bytes / bandwidth) and its errors.

mod common;

use moestream::bench::context::{self, ContextBenchOptions, ContextReport};
use moestream::{Engine, EngineOptions, Error};

/// The fixture `family` with a context of 128, and its KV bytes per position.
fn engine(family: &str) -> (Engine, u64) {
    let mut options = EngineOptions::new(common::fixtures_dir().join(family));
    options.context = Some(128);
    let engine = Engine::load(&options).unwrap();
    let kv = engine.kv_plan().bytes_per_token;
    (engine, kv)
}

/// A sweep over `depths` with 4 decoded tokens each.
fn options(depths: Vec<usize>, prefill_last: Option<usize>) -> ContextBenchOptions {
    ContextBenchOptions { depths, decode_tokens: 4, seed: 1, kernel_seconds: 0.05, prefill_last }
}

/// Checks what every sweep of two depths must hold: the deeper one reads `kv` bytes more per
/// extra position, and each row's roofline ratio is its step time over its bound.
fn check_rows(r: &ContextReport, kv: u64, label: &str) {
    let (a, b) = (&r.depths[0], &r.depths[1]);
    assert_eq!(b.bytes_per_token - a.bytes_per_token, (b.depth - a.depth) as u64 * kv, "{label}");
    // The caches grow by `kv` per position (linear-attention states are there at any depth).
    assert_eq!(b.kv_bytes - a.kv_bytes, (b.depth - a.depth) as u64 * kv, "{label}");
    for d in &r.depths {
        assert!(d.decode_tokens_per_s > 0.0 && d.step_ms.is_finite(), "{label}");
        assert!((d.vs_roofline - d.step_ms / d.roofline_ms).abs() < 1e-9, "{label}");
    }
}

#[test]
fn depths_add_their_kv_bytes_to_the_bytes_read() {
    let (engine, kv) = engine("mixtral");
    let o = options(vec![8, 72], None);
    let r = context::run(&engine, &o).unwrap();
    assert_eq!(r.depths.len(), 2);
    assert!(r.read_gbps > 0.0 && r.weight_bytes_per_token > 0);
    check_rows(&r, kv, "mixtral");
    assert!(r.depths.iter().all(|d| d.prefilled_tokens == d.depth && d.prefill_tokens_per_s > 0.0));
    assert!(r.markdown().contains("| 72 |"));
    let too_deep = ContextBenchOptions { depths: vec![126], ..o };
    assert!(matches!(context::run(&engine, &too_deep), Err(Error::InvalidArgument(_))));
}

/// `prefill_last` prefills only each prompt's last tokens over a session that takes the rest as
/// cached (zeros): the same bytes per decode step, the prefill figure over those tokens only;
/// on an MLA model (latent cache) and a hybrid one (recurrent state). Out-of-range counts are
/// refused.
#[test]
fn prefill_of_the_last_tokens_measures_depth_without_the_whole_prompt() {
    for family in ["deepseek_v2", "qwen3_next"] {
        let (engine, kv) = engine(family);
        let r = context::run(&engine, &options(vec![8, 100], Some(5))).unwrap();
        check_rows(&r, kv, family);
        assert!(r.depths.iter().all(|d| d.prefilled_tokens == 5 && d.prefill_tokens_per_s > 0.0), "{family}");
        assert!(r.markdown().contains("| 100 | 5 |"), "{family}");
    }
    let (engine, _) = engine("mixtral");
    for bad in [0, 9] {
        let o = options(vec![8], Some(bad));
        assert!(matches!(context::run(&engine, &o), Err(Error::InvalidArgument(_))), "prefill_last {bad}");
    }
}
