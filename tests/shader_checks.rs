//! Kernels built without naga's bounds and loop checks (on Vulkan adapters that bound buffer
//! accesses themselves, lavapipe among them: `Caps::shader_checks` off) compute exactly what
//! the checked build computes. For every fixture family in f16 and int4, and for GGUF files of
//! ggml block types, in the CPU and the GPU layouts (8- and 32-lane teams), the prefill and
//! decode logits are bit-identical. An index past a private or workgroup array's end, which the
//! checked build clamps and the unchecked one does not, would differ here; so for split-K decode
//! attention, after a prompt of 1100 tokens. (On an adapter whose kernels keep every check there
//! is nothing to compare, and the comparisons say so.)

mod common;

use common::logits::{assert_same_logits, for_every_model};
use common::{fixtures_dir, gpu, gpu_layouts, gpu_layouts_team32, lane_wide_formats};
use std::path::Path;
use std::sync::Arc;

use moestream::gpu::{Gpu, GpuOptions};
use moestream::ops::WeightFormat;

/// The adapter with every kernel checked, in the default or the GPU layouts (teams of
/// `decode_team` lanes).
fn checked(gpu_layouts: bool, decode_team: Option<u32>) -> Arc<Gpu> {
    Gpu::new(&GpuOptions { shader_checks: true, gpu_layouts, decode_team, ..Default::default() }).unwrap()
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
    assert_same_logits(&format!("{layout} against the checked build"), unchecked, checked, path, format, prompt);
}

/// Every fixture family in f16 and int4, and the GGUFs, both ways in one layout.
fn every_model_either_way(layout: &str, unchecked: Arc<Gpu>, checked: Arc<Gpu>) {
    for_every_model(|path, format, prompt| same_either_way(layout, &unchecked, &checked, path, format, prompt));
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
