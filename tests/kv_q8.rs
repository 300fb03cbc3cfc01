//! The quantized KV caches end to end. q8_0 (`--kv-dtype q8_0`): on every fixture family (f32
//! weights), its log-probs against transformers' f32 goldens stay within a stated bound with the
//! golden greedy tokens, or, where quantizing the cache by itself moves the model further, the
//! engine matches the CPU reference with a q8_0-rounded cache (grouped attention's keys and
//! values, MLA's latent) within 1e-2 and gives its greedy tokens (`tests/long_context.rs` runs
//! the 4500-token fixture through split decode). Its bytes are about half f16's, and what it
//! cannot hold is refused by name. q4_0 (`--kv-dtype q4_0`, grouped heads and MLA latents): the
//! same checks, its error against transformers stated per fixture.

mod common;

use common::{fixtures, fixtures_dir, gpu, max_abs_diff};
use moestream::model::{ArchSpec, MlaCacheKind};
use moestream::ops::{KvDtype, WeightFormat};
use moestream::reference::ReferenceModel;
use moestream::runtime::{Engine, EngineOptions, GenerateOptions};
use moestream::Error;

/// Log-prob error against transformers within which the greedy tokens must be the golden ones.
const CLOSE: f32 = 2e-2;

fn options(dir: &std::path::Path, context: usize, dtype: KvDtype) -> EngineOptions {
    let mut o = EngineOptions::new(dir).with_format(WeightFormat::F32);
    o.context = Some(context);
    o.kv_dtype = dtype;
    o
}

fn engine(dir: &std::path::Path, context: usize) -> Engine {
    Engine::load_on(gpu(), &options(dir, context, KvDtype::Q8_0)).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_tokens: n, ignore_eos: true, ..Default::default() }
}

#[test]
fn every_family_stays_close_to_transformers() {
    stays_close_to_transformers(KvDtype::Q8_0);
}

#[test]
fn q4_stays_close_to_transformers_or_to_its_reference() {
    stays_close_to_transformers(KvDtype::Q4_0);
}

/// Every fixture prompt's log-probs with a `dtype` cache against transformers'.
fn stays_close_to_transformers(dtype: KvDtype) {
    let mut worst = 0f32;
    let name = dtype.name();
    for (dir, golden) in fixtures() {
        let e =
            Engine::load_on(gpu(), &options(&dir, 1200, dtype)).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for p in golden.prompts.iter().filter(|p| p.tokens.len() > 1) {
            let s = e.score(&p.tokens).unwrap();
            let err = max_abs_diff(&s.logprobs, &p.logprobs);
            worst = worst.max(err);
            let g = e.generate(&p.tokens, &greedy(p.greedy.len()), |_, _| true).unwrap();
            let what = format!("{} {} {name} KV", golden.architecture, p.name);
            println!("{what}: max |Δ logprob| = {err:.2e}");
            if err < CLOSE {
                assert_eq!(g.tokens, p.greedy, "{what}: greedy tokens");
                continue;
            }
            // Past the bound: the engine must then be what a quantized cache makes of the model.
            let model = ReferenceModel::load(&dir).unwrap().with_kv_dtype(dtype);
            let logprobs = model.log_probs(&p.tokens).unwrap();
            let ref_err = max_abs_diff(&logprobs, &p.logprobs);
            let vs_ref = max_abs_diff(&s.logprobs, &logprobs);
            println!(
                "  the reference with a {name} cache: {ref_err:.2e} from transformers, {vs_ref:.2e} from the engine"
            );
            assert!(ref_err >= CLOSE / 2.0, "{what}: log-prob error {err}");
            // A value rounding the other way in the GPU's quantizer than in the reference's (its
            // input a float's width away) moves by its block's scale: 1/127 of the block's
            // largest value in q8_0, 1/7 in q4_0, which these random models amplify over a long
            // prompt; q4_0's engine must stay within a tenth of what quantizing did.
            let bound = match dtype {
                KvDtype::Q4_0 => (ref_err / 10.0).max(1e-2),
                _ => 1e-2,
            };
            assert!(vs_ref < bound, "{what}: {vs_ref} from the {name}-cache reference ({ref_err} from transformers)");
            let want = model.greedy(&p.tokens, p.greedy.len()).unwrap();
            assert_eq!(g.tokens, want, "{what}: greedy tokens");
        }
    }
    println!("worst {name} KV log-prob error over every fixture prompt: {worst:.2e}");
}

#[test]
fn q8_takes_about_half_the_bytes_of_f16() {
    for fixture in ["mixtral", "deepseek_v2", "qwen3_next", "gpt_oss"] {
        let spec = ArchSpec::from_dir(&fixtures_dir().join(fixture)).unwrap();
        let (q8, f16) = (spec.kv_row_bytes(KvDtype::Q8_0), spec.kv_row_bytes(KvDtype::F16));
        let ratio = q8 as f64 / f16 as f64;
        println!("{fixture}: {q8} bytes per position and layer in q8_0, {f16} in f16 ({ratio:.3})");
        assert!(ratio < 0.7, "{fixture}: q8_0 {ratio:.3} of f16");
        {
            let q4 = spec.kv_row_bytes(KvDtype::Q4_0);
            println!("{fixture}: {q4} bytes per position and layer in q4_0 ({:.3} of f16)", q4 as f64 / f16 as f64);
            assert!(q4 * 10 < f16 * 4, "{fixture}: q4_0 {q4} bytes against f16's {f16}");
            let e = Engine::load_on(gpu(), &options(&fixtures_dir().join(fixture), 256, KvDtype::Q4_0)).unwrap();
            let held = e.new_session().unwrap().cache_bytes();
            let formula = spec.kv_cache_bytes(e.model().options().cache_shape(), KvDtype::Q4_0);
            assert!((0..32 * spec.layers as u64).contains(&(held - formula)), "{fixture} q4_0: {held} vs {formula}");
        }
        let e = engine(&fixtures_dir().join(fixture), 256);
        // What a session holds: the formula's bytes, its buffers padded to 16 bytes.
        let held = e.new_session().unwrap().cache_bytes();
        let formula = spec.kv_cache_bytes(e.model().options().cache_shape(), KvDtype::Q8_0);
        assert!((0..32 * spec.layers as u64).contains(&(held - formula)), "{fixture}: {held} vs {formula}");
    }
}

#[test]
fn what_q8_cannot_hold_is_refused_by_name() {
    for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
        let mut o = options(&fixtures_dir().join("deepseek_v2"), 64, dtype);
        o.mla_cache = MlaCacheKind::Decompressed;
        let err = Engine::load_on(gpu(), &o).err().expect("quantized decompressed MLA cache");
        assert!(matches!(err, Error::UnsupportedConfig(_)) && err.to_string().contains(dtype.name()), "{err}");
    }
}
