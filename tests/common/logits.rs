//! Whole-model logits for comparing two builds of the kernels bit for bit (tests/shader_checks.rs,
//! tests/words64.rs).

use std::path::Path;
use std::sync::Arc;

use moestream::decoder::{StepOutput, StepResult};
use moestream::experts::policy::Phase;
use moestream::gpu::Gpu;
use moestream::ops::WeightFormat;
use moestream::runtime::sampler::argmax;
use moestream::runtime::{Engine, EngineOptions};

use super::{assert_bits_eq, fixtures, fixtures_dir, lane_wide_formats, TempDir};

/// The logits of `prompt`'s last prefill chunk and those of 4 greedy decode steps after it, on
/// `gpu` (`format`: the converted dtype; `None` for a GGUF).
pub fn prefill_and_decode_logits(
    gpu: Arc<Gpu>,
    path: &Path,
    format: Option<WeightFormat>,
    prompt: &[u32],
) -> Vec<Vec<f32>> {
    let cache = TempDir::new("logits_cache");
    let mut o = EngineOptions::new(path);
    if let Some(format) = format {
        o = o.with_format(format);
    }
    o.cache_dir = Some(cache.path().to_path_buf());
    let e = Engine::load_on(gpu, &o).unwrap();
    let m = e.model();
    let kv = m.new_cache().unwrap();
    let what = format!("{} {format:?}", path.display());
    // All but the prompt's last 64-token chunk without output, as generation prefills.
    let last_chunk = (prompt.len() - 1) / 64 * 64;
    for (i, chunk) in prompt[..last_chunk].chunks(64).enumerate() {
        let step = m.step(&kv, chunk, i * 64, Phase::Prefill, StepOutput::None);
        step.unwrap_or_else(|err| panic!("{what}: {err}"));
    }
    let mut all = Vec::new();
    let (mut tokens, mut pos, mut phase) = (prompt[last_chunk..].to_vec(), last_chunk, Phase::Prefill);
    for _ in 0..5 {
        let step = m.step(&kv, &tokens, pos, phase, StepOutput::Logits);
        let StepResult::Logits(l) = step.unwrap_or_else(|err| panic!("{what}: {err}")) else { panic!("logits") };
        pos += tokens.len();
        (tokens, phase) = (vec![argmax(&l)], Phase::Decode);
        all.push(l);
    }
    all
}

/// Asserts `got` and `want` give the same bits for `path` in `format` (`what`: the two builds).
pub fn assert_same_logits(
    what: &str,
    got: &Arc<Gpu>,
    want: &Arc<Gpu>,
    path: &Path,
    format: Option<WeightFormat>,
    prompt: &[u32],
) {
    let got = prefill_and_decode_logits(got.clone(), path, format, prompt);
    let want = prefill_and_decode_logits(want.clone(), path, format, prompt);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_bits_eq(&format!("{} {format:?} {what}: step {i}", path.display()), g, w);
    }
}

/// Calls `compare(path, format, prompt)` for every fixture family in f16 and int4 (the
/// `LANE_WIDE` formats) and for GGUF files of the ggml block types: Q4_K_M (Q4_K and Q6_K), a
/// hybrid's Q4_K_M, MXFP4, and Q4_0 / Q6_K / Q8_0 restaged.
pub fn for_every_model(mut compare: impl FnMut(&Path, Option<WeightFormat>, &[u32])) {
    let mut families = 0;
    for (dir, golden) in fixtures() {
        let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
        for format in lane_wide_formats() {
            compare(&dir, Some(format), prompt);
        }
        families += 1;
    }
    assert!(families >= 10, "only {families} fixture families");
    for file in ["qwen3_moe-q4km.gguf", "qwen3_5_moe-q4km.gguf", "gpt_oss-mxfp4.gguf", "qwen3_moe-restaged.gguf"] {
        let path = fixtures_dir().join("gguf").join(file);
        compare(&path, None, &[1, 5, 9, 2, 7, 3]);
    }
}
