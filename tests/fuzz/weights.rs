//! Non-finite weights: NaN and ±infinity written into the weights of a safetensors checkpoint
//! (bf16), a GGUF file (f16/f32) and an MLX 4-bit directory (f16 scales, biases and norms),
//! through engine load, scoring and greedy generation.
//!
//! The engine's answer: weights it encodes at load (int4 experts, f16 matrices) are checked as
//! they are encoded (a typed error naming the tensor and the value); weights uploaded as stored
//! (f32, GGUF types, MLX norms) are not scanned, but the step kernels flag NaN or infinite logits
//! and the engine returns `Error::NonFiniteOutput` instead of tokens or log-probabilities. A weight
//! that a run never reads (another token's embedding row, an expert not routed to) leaves the
//! run as it was. So the property, in the default formats and with every weight f32: a typed
//! error about the non-finite value, or exactly the clean model's log-probabilities and tokens;
//! never other numbers (silent garbage).

use std::path::Path;

use moestream::ops::WeightFormat;
use moestream::runtime::GenerateOptions;
use moestream::{Engine, EngineOptions};
use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::Value;

use crate::common::{self, TempDir};
use crate::gguf::{fields, FieldKind};
use crate::harness::{fuzz, guarded, Outcome};
use crate::{dir_with, text};

/// A float encoding of stored weights.
#[derive(Clone, Copy, Debug, PartialEq)]
enum FloatType {
    F32,
    F16,
    Bf16,
}

/// A run of stored floats: where it starts, how many, in what encoding.
#[derive(Clone, Copy, Debug)]
struct Floats {
    start: usize,
    count: usize,
    ty: FloatType,
}

/// What is written.
#[derive(Clone, Copy, Debug)]
enum Special {
    Nan,
    Inf,
    NegInf,
}

/// One weight (element `element` of float run `run`, both modulo their counts) overwritten.
#[derive(Clone, Debug)]
struct Injection {
    run: usize,
    element: usize,
    value: Special,
}

fn injections() -> impl Strategy<Value = Vec<Injection>> {
    let value = prop::sample::select(vec![Special::Nan, Special::Inf, Special::NegInf]);
    vec(
        (any::<usize>(), any::<usize>(), value).prop_map(|(run, element, value)| Injection { run, element, value }),
        1..=2,
    )
}

fn inject(bytes: &[u8], runs: &[Floats], injections: &[Injection]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for i in injections {
        let run = runs[i.run % runs.len()];
        let e = i.element % run.count;
        let (f32_bits, f16_bits) = match i.value {
            Special::Nan => (0x7fc0_0000u32, 0x7e00u16),
            Special::Inf => (0x7f80_0000, 0x7c00),
            Special::NegInf => (0xff80_0000, 0xfc00),
        };
        match run.ty {
            FloatType::F32 => b[run.start + 4 * e..][..4].copy_from_slice(&f32_bits.to_le_bytes()),
            FloatType::F16 => b[run.start + 2 * e..][..2].copy_from_slice(&f16_bits.to_le_bytes()),
            FloatType::Bf16 => b[run.start + 2 * e..][..2].copy_from_slice(&((f32_bits >> 16) as u16).to_le_bytes()),
        }
    }
    b
}

/// The float tensors of a safetensors file (integer tensors, such as MLX codes, left out).
fn safetensors_floats(file: &[u8]) -> Vec<Floats> {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let mut runs: Vec<(String, Floats)> = header
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .filter_map(|(name, t)| {
            let (ty, width) = match t["dtype"].as_str().unwrap() {
                "F32" => (FloatType::F32, 4),
                "F16" => (FloatType::F16, 2),
                "BF16" => (FloatType::Bf16, 2),
                _ => return None,
            };
            let offsets = t["data_offsets"].as_array().unwrap();
            let (a, b) = (offsets[0].as_u64().unwrap() as usize, offsets[1].as_u64().unwrap() as usize);
            Some((name, Floats { start: 8 + n + a, count: (b - a) / width, ty }))
        })
        .collect();
    runs.sort_by(|a, b| a.0.cmp(&b.0));
    runs.into_iter().map(|(_, f)| f).collect()
}

/// The F32 and F16 tensors of a GGUF file (found by the header walker; data aligned to 32).
fn gguf_floats(file: &[u8]) -> Vec<Floats> {
    let (fields, header) = fields(file);
    let data = header.next_multiple_of(32);
    let mut runs = Vec::new();
    let mut elements = 1usize;
    let mut ty = 0u32;
    for f in fields {
        let value = u64::from_le_bytes(file[f.at..f.at + 8].try_into().unwrap()) as usize;
        match f.kind {
            FieldKind::Dims => elements = 1,
            FieldKind::Dim => elements *= value,
            FieldKind::TensorType => ty = value as u32,
            FieldKind::Offset => {
                let ty = match ty {
                    0 => FloatType::F32,
                    1 => FloatType::F16,
                    _ => continue,
                };
                runs.push(Floats { start: data + value, count: elements, ty });
            }
            _ => {}
        }
    }
    runs
}

/// What a run gives: the log-probabilities of a fixed prompt and 4 greedy tokens.
type Run = (Vec<f32>, Vec<u32>);

fn run(model: &Path, f32: bool) -> Result<Run, String> {
    let mut options = EngineOptions::new(model);
    if f32 {
        options = options.with_format(WeightFormat::F32);
    }
    options.context = Some(16);
    let engine = text(Engine::load_on(common::gpu(), &options))?;
    let prompt = [1, 2, 3, 4, 5, 6];
    let logprobs = text(engine.score(&prompt))?.logprobs;
    let options = GenerateOptions { max_tokens: 4, ignore_eos: true, ..GenerateOptions::default() };
    let tokens = text(engine.generate(&prompt, &options, |_, _| true))?.tokens;
    Ok((logprobs, tokens))
}

/// The property of a mutant's run against the clean run.
fn same_or_refused(model: &Path, f32: bool, clean: &Run) -> Outcome {
    match run(model, f32) {
        Ok(got) => {
            assert!(
                got.0 == clean.0 && got.1 == clean.1,
                "non-finite weights gave other numbers: {got:?} vs {clean:?}"
            );
            Ok(())
        }
        Err(e) => {
            let named = ["non-finite", "not finite", "NaN", "inf"].iter().any(|w| e.contains(w));
            assert!(named, "not an error about the non-finite weight: {e}");
            Err(e)
        }
    }
}

/// Fuzzes `file` of model directory `src` (or the file itself when `src` is the file).
fn fuzz_file(name: &str, src: &Path, file: &str, runs: impl Fn(&[u8]) -> Vec<Floats>) {
    let path = if src.is_file() { src.to_path_buf() } else { src.join(file) };
    let original = std::fs::read(&path).unwrap();
    let clean = [run(src, false).unwrap(), run(src, true).unwrap()];
    let runs = runs(&original);
    let src = src.to_path_buf();
    let file = file.to_string();
    fuzz(name, 24, (injections(), any::<bool>()), |(inj, f32)| {
        let bytes = inject(&original, &runs, &inj);
        let (dir, model) = match src.is_file() {
            true => {
                let dir = TempDir::new("fuzz-nonfinite");
                std::fs::write(dir.path().join(&file), &bytes).unwrap();
                let model = dir.path().join(&file);
                (dir, model)
            }
            false => {
                let dir = dir_with(&src, &file, &bytes);
                let model = dir.path().to_path_buf();
                (dir, model)
            }
        };
        let clean = clean[f32 as usize].clone();
        guarded(move || {
            let _dir = &dir;
            same_or_refused(&model, f32, &clean)
        })
    });
}

#[test]
fn non_finite_safetensors_weights() {
    fuzz_file("nonfinite/safetensors", &crate::fixture(), "model.safetensors", safetensors_floats);
}

#[test]
fn non_finite_gguf_weights() {
    let path = common::fixtures_dir().join("gguf/qwen3_moe-f16.gguf");
    fuzz_file("nonfinite/gguf", &path, "m.gguf", gguf_floats);
}

#[test]
fn non_finite_mlx_weights() {
    let src = common::fixtures_dir().join("mlx/olmoe_4bit");
    fuzz_file("nonfinite/mlx", &src, "model.safetensors", safetensors_floats);
}

/// The fixture with `tensor`'s element `element` set to `value`.
fn fixture_with(tensor: &str, element: usize, value: Special) -> TempDir {
    let src = crate::fixture();
    let original = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&original[8..8 + n]).unwrap();
    let start = 8 + n + header[tensor]["data_offsets"][0].as_u64().unwrap() as usize;
    let runs = [Floats { start, count: usize::MAX, ty: FloatType::Bf16 }];
    let bytes = inject(&original, &runs, &[Injection { run: 0, element, value }]);
    dir_with(&src, "model.safetensors", &bytes)
}

/// The errors of scoring and of greedy generation on `dir`.
fn refusals(dir: TempDir) -> [String; 2] {
    let outcome = guarded(move || {
        // In f32 nothing is encoded at load, so the run meets the NaN.
        let mut options = EngineOptions::new(dir.path()).with_format(WeightFormat::F32);
        options.context = Some(16);
        let engine = Engine::load_on(common::gpu(), &options).unwrap();
        let scored = engine.score(&[1, 2, 3, 4]).map(|_| ()).expect_err("scoring must be refused");
        let options = GenerateOptions { max_tokens: 2, ..GenerateOptions::default() };
        let generated = engine.generate(&[1, 2], &options, |_, _| true).map(|_| ()).expect_err("generation too");
        Err(format!("{scored}\n{generated}"))
    });
    let e = outcome.unwrap().unwrap_err();
    let (a, b) = e.split_once('\n').unwrap();
    [a.to_string(), b.to_string()]
}

#[test]
fn nan_in_the_lm_head_is_a_typed_error_not_tokens() {
    // Only one logit NaN: greedy argmax used to skip it and return a token.
    for value in [Special::Nan, Special::Inf, Special::NegInf] {
        let [scored, generated] = refusals(fixture_with("lm_head.weight", 5 * 64 + 3, value));
        assert!(scored.contains("non-finite log-probabilities at position 0"), "{scored}");
        assert!(generated.contains("non-finite logits at position 1"), "{generated}");
    }
}

#[test]
fn nan_in_a_used_embedding_row_is_a_typed_error() {
    // Token 2 is the second of both prompts (the first position's scores are refused too: a
    // NaN value weighted by 0 in the causal mask is still NaN).
    let [scored, generated] = refusals(fixture_with("model.embed_tokens.weight", 2 * 64, Special::Nan));
    assert!(scored.contains("non-finite log-probabilities at position"), "{scored}");
    assert!(generated.contains("non-finite logits at position 1"), "{generated}");
}

#[test]
fn nan_encoded_at_load_names_the_tensor() {
    // The default formats encode the matrices at load (f16, int4 experts): refused there.
    let dir = fixture_with("model.layers.1.self_attn.q_proj.weight", 64 * 3 + 5, Special::Inf);
    let outcome = guarded(move || run(dir.path(), false).map(|_| ())).unwrap();
    let e = outcome.expect_err("refused at load");
    assert!(e.contains("layer 1: q (rows from 0): weight at row 3, column 5 is not finite (inf)"), "{e}");
}

// Regression cases: non-finite weights that gave other numbers instead of an error.

#[test]
fn regression_nan_norm_weight_routed_to_no_expert() {
    // NaN in a GGUF FFN norm weight: every router logit NaN, no expert won a comparison, the
    // layer's MoE added nothing, and the run gave other, finite numbers.
    let path = common::fixtures_dir().join("gguf/qwen3_moe-f16.gguf");
    let original = std::fs::read(&path).unwrap();
    let runs = gguf_floats(&original);
    let norms: Vec<usize> = (0..runs.len()).filter(|&i| runs[i].count == 64 && runs[i].ty == FloatType::F32).collect();
    let dir = TempDir::new("fuzz-nonfinite-norm");
    let model = dir.path().join("m.gguf");
    // Every 64-wide f32 vector (the norms), element 8, one at a time.
    for &run in &norms {
        std::fs::write(&model, inject(&original, &runs, &[Injection { run, element: 8, value: Special::Nan }]))
            .unwrap();
        let m = model.clone();
        let e = guarded(move || run_default(&m)).unwrap().expect_err("refused");
        assert!(e.contains("non-finite"), "vector {run}: {e}");
    }
}

#[test]
fn regression_infinite_router_weight_changed_the_numbers() {
    // -inf in a router row: that expert's logit -inf, a softmax over the rest, and log-probs
    // a rounding away from the clean run's. Any non-finite router logit is now refused.
    let dir = fixture_with("model.layers.0.block_sparse_moe.gate.weight", 304, Special::NegInf);
    let outcome = guarded(move || run(dir.path(), true).map(|_| ())).unwrap();
    let e = outcome.expect_err("refused");
    assert!(e.contains("non-finite"), "{e}");
}

/// [`run`] in the default formats, as an outcome.
fn run_default(model: &Path) -> Outcome {
    run(model, false).map(|_| ())
}
