//! The q8_0 KV cache (`--kv-dtype q8_0`) end to end: on every fixture family (f32 weights),
//! its log-probs against transformers' f32 goldens stay within a stated bound with the golden
//! greedy tokens, or, where quantizing the cache by itself moves the model further, the engine
//! matches the CPU reference with a q8_0-rounded cache (grouped attention's keys and values,
//! MLA's latent) within 1e-2 and gives its greedy tokens (`tests/long_context.rs` runs the
//! 4500-token fixture through split decode). Its bytes are about half f16's, and what it cannot
//! hold is refused by name.

mod common;

use common::{fixtures, fixtures_dir, gpu, max_abs_diff};
use moestream::model::{ArchSpec, MlaCacheKind};
use moestream::ops::{KvDtype, WeightFormat};
use moestream::reference::ReferenceModel;
use moestream::runtime::{Engine, EngineOptions, GenerateOptions};
use moestream::Error;

/// Log-prob error against transformers within which the greedy tokens must be the golden ones.
const CLOSE: f32 = 2e-2;

fn engine(dir: &std::path::Path, context: usize) -> Engine {
    let mut o = EngineOptions::new(dir).with_format(WeightFormat::F32);
    o.context = Some(context);
    o.kv_dtype = KvDtype::Q8_0;
    Engine::load_on(gpu(), &o).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_tokens: n, ignore_eos: true, ..Default::default() }
}

#[test]
fn every_family_stays_close_to_transformers() {
    let mut worst = 0f32;
    for (dir, golden) in fixtures() {
        let e = engine(&dir, 1200);
        for p in golden.prompts.iter().filter(|p| p.tokens.len() > 1) {
            let s = e.score(&p.tokens).unwrap();
            let err = max_abs_diff(&s.logprobs, &p.logprobs);
            worst = worst.max(err);
            let g = e.generate(&p.tokens, &greedy(p.greedy.len()), |_, _| true).unwrap();
            println!("{} {} q8_0 KV: max |Δ logprob| = {err:.2e}", golden.architecture, p.name);
            if err < CLOSE {
                assert_eq!(g.tokens, p.greedy, "{} {} q8_0 KV: greedy tokens", golden.architecture, p.name);
                continue;
            }
            // Past the bound: the engine must then be what a q8_0 cache makes of the model.
            let model = ReferenceModel::load(&dir).unwrap().with_kv_dtype(KvDtype::Q8_0);
            let logprobs = model.log_probs(&p.tokens).unwrap();
            let ref_err = max_abs_diff(&logprobs, &p.logprobs);
            let vs_ref = max_abs_diff(&s.logprobs, &logprobs);
            println!(
                "  the reference with a q8_0 cache: {ref_err:.2e} from transformers, {vs_ref:.2e} from the engine"
            );
            assert!(ref_err >= CLOSE / 2.0, "{} {}: q8_0 KV log-prob error {err}", golden.architecture, p.name);
            assert!(vs_ref < 1e-2, "{} {}: {vs_ref} from the q8_0-cache reference", golden.architecture, p.name);
            let want = model.greedy(&p.tokens, p.greedy.len()).unwrap();
            assert_eq!(g.tokens, want, "{} {} q8_0 KV: greedy tokens", golden.architecture, p.name);
        }
    }
    println!("worst q8_0 KV log-prob error over every fixture prompt: {worst:.2e}");
}

#[test]
fn q8_takes_about_half_the_bytes_of_f16() {
    for fixture in ["mixtral", "deepseek_v2", "qwen3_next", "gpt_oss"] {
        let spec = ArchSpec::from_dir(&fixtures_dir().join(fixture)).unwrap();
        let (q8, f16) = (spec.kv_row_bytes(KvDtype::Q8_0), spec.kv_row_bytes(KvDtype::F16));
        let ratio = q8 as f64 / f16 as f64;
        println!("{fixture}: {q8} bytes per position and layer in q8_0, {f16} in f16 ({ratio:.3})");
        assert!(ratio < 0.7, "{fixture}: q8_0 {ratio:.3} of f16");
        let e = engine(&fixtures_dir().join(fixture), 256);
        // What a session holds: the formula's bytes, its buffers padded to 16 bytes.
        let held = e.new_session().unwrap().cache_bytes();
        let formula = spec.kv_cache_bytes(e.model().options().cache_shape(), KvDtype::Q8_0);
        assert!((0..32 * spec.layers as u64).contains(&(held - formula)), "{fixture}: {held} vs {formula}");
    }
}

#[test]
fn what_q8_cannot_hold_is_refused_by_name() {
    let mut o = EngineOptions::new(fixtures_dir().join("deepseek_v2")).with_format(WeightFormat::F32);
    o.context = Some(64);
    o.kv_dtype = KvDtype::Q8_0;
    o.mla_cache = MlaCacheKind::Decompressed;
    let err = Engine::load_on(gpu(), &o).err().expect("q8_0 decompressed MLA cache");
    assert!(matches!(err, Error::UnsupportedConfig(_)) && err.to_string().contains("q8_0"), "{err}");
}
