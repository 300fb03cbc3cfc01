//! Kernels built without naga's bounds and loop checks (on Vulkan adapters that bound buffer
//! accesses themselves, lavapipe among them: `Caps::shader_checks` off) compute exactly what
//! the checked build computes. For every fixture family in f16 and int4, and for GGUF files of
//! ggml block types, in the CPU and the GPU layouts (8- and 32-lane teams), the prefill and
//! decode logits are bit-identical. An index past a private or workgroup array's end, which the
//! checked build clamps and the unchecked one does not, would differ here; so for split-K decode
//! attention, after a prompt of 1100 tokens. (On an adapter whose kernels keep every check there
//! is nothing to compare, and the comparisons say so.)

mod common;

use common::{
    assert_bits_eq, fixtures, fixtures_dir, gpu, gpu_layouts, gpu_layouts_team32, lane_wide_formats, TempDir,
};
use std::path::Path;
use std::sync::Arc;

use moestream::experts::policy::Phase;
use moestream::gpu::{Gpu, GpuOptions};
use moestream::model::decoder::{StepOutput, StepResult};
use moestream::ops::WeightFormat;
use moestream::runtime::sampler::argmax;
use moestream::runtime::{Engine, EngineOptions};

/// The adapter with every kernel checked, in the default or the GPU layouts (teams of
/// `decode_team` lanes).
fn checked(gpu_layouts: bool, decode_team: Option<u32>) -> Arc<Gpu> {
    Gpu::new(&GpuOptions { shader_checks: true, gpu_layouts, decode_team, ..Default::default() }).unwrap()
}

/// The logits of `prompt`'s last prefill chunk and those of 4 greedy decode steps after it.
fn logits(gpu: Arc<Gpu>, path: &Path, format: Option<WeightFormat>, prompt: &[u32]) -> Vec<Vec<f32>> {
    let cache = TempDir::new("shader_checks_cache");
    let mut o = EngineOptions::new(path);
    if let Some(format) = format {
        o = o.with_format(format);
    }
    o.cache_dir = Some(cache.path().to_path_buf());
    let e = Engine::load_on(gpu, &o).unwrap();
    let m = e.model();
    let kv = m.new_cache().unwrap();
    let what = format!("{} {format:?} (checks {})", path.display(), m.gpu().caps.shader_checks);
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

/// Asserts the two builds give the same bits for `path` in `format`.
fn same_either_way(
    layout: &str,
    unchecked: &Arc<Gpu>,
    checked: &Arc<Gpu>,
    path: &Path,
    format: Option<WeightFormat>,
    prompt: &[u32],
) {
    assert!(checked.caps.shader_checks);
    if unchecked.caps.shader_checks {
        eprintln!(
            "{}: kernels keep every check here (no robustBufferAccess); nothing to compare",
            unchecked.adapter.name
        );
        return;
    }
    let got = logits(unchecked.clone(), path, format, prompt);
    let want = logits(checked.clone(), path, format, prompt);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_bits_eq(&format!("{} {format:?} {layout}: step {i} against the checked build", path.display()), g, w);
    }
}

/// Every fixture family in f16 and int4, and the GGUFs, both ways in one layout.
fn every_model_either_way(layout: &str, unchecked: Arc<Gpu>, checked: Arc<Gpu>) {
    let mut families = 0;
    for (dir, golden) in fixtures() {
        let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
        for format in lane_wide_formats() {
            same_either_way(layout, &unchecked, &checked, &dir, Some(format), prompt);
        }
        families += 1;
    }
    assert!(families >= 10, "only {families} fixture families");
    for file in ["qwen3_moe-q4km.gguf", "qwen3_5_moe-q4km.gguf", "gpt_oss-mxfp4.gguf", "qwen3_moe-restaged.gguf"] {
        let path = fixtures_dir().join("gguf").join(file);
        same_either_way(layout, &unchecked, &checked, &path, None, &[1, 5, 9, 2, 7, 3]);
    }
}

#[test]
fn unchecked_kernels_compute_what_checked_ones_do_in_the_cpu_layout() {
    every_model_either_way("CPU layout", gpu(), checked(false, None));
}

#[test]
fn unchecked_kernels_compute_what_checked_ones_do_in_the_gpu_layout() {
    every_model_either_way("GPU layout", gpu_layouts(), checked(true, None));
}

#[test]
fn unchecked_kernels_compute_what_checked_ones_do_with_32_lane_teams() {
    every_model_either_way("GPU layout, 32-lane teams", gpu_layouts_team32(), checked(true, Some(32)));
}

#[test]
fn split_decode_attention_either_way() {
    // Decode over more than 1024 keys runs split-K attention in both layouts (the CPU layout's
    // `attention_keys` splits from 1024 keys, the GPU layout's from 256): grouped attention with
    // q/k norms, sinks and a sliding window, MLA, and a hybrid's gated attention.
    let prompt: Vec<u32> = (0..1100u32).map(|i| (i * 37 + 11) % 384).collect();
    let [_, int4] = lane_wide_formats();
    for (layout, unchecked, checked) in
        [("CPU layout", gpu(), checked(false, None)), ("GPU layout", gpu_layouts(), checked(true, None))]
    {
        for family in ["qwen3_moe", "gpt_oss", "deepseek_v2", "qwen3_next"] {
            let dir = fixtures_dir().join(family);
            same_either_way(layout, &unchecked, &checked, &dir, Some(int4), &prompt);
        }
    }
}

#[test]
fn devices_say_which_checks_kernels_keep() {
    // lavapipe offers robustBufferAccess, so its kernels are built without naga's clamps; every
    // adapter's `devices` entry says which checks its kernels keep.
    let adapters = Gpu::list_adapters();
    for d in adapters.iter().filter(|d| d.software && d.backend == "Vulkan") {
        assert!(d.driver_bounds_buffers, "{d:?}");
    }
    assert_eq!(gpu().caps.shader_checks, !gpu().adapter.driver_bounds_buffers);
    assert!(checked(false, None).caps.shader_checks);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_moestream")).arg("devices").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("    kernel checks: ").count(), adapters.len(), "{text}");
    let unchecked = adapters.iter().filter(|d| d.driver_bounds_buffers).count();
    assert_eq!(
        text.matches("kernel checks: the driver bounds buffer accesses (robustBufferAccess)").count(),
        unchecked
    );
}
