//! The CPU layout's wide decode kernels and attention load 16-byte weight groups and KV-cache
//! chunks as two 8-byte integers where the adapter has them (`Caps::words64`, `WORDS64`): the
//! same words as four 4-byte loads, so for every fixture family in f16 and int4 and for GGUF
//! files of the ggml block types with 16-byte loads (Q4_K, Q6_K), the prefill and decode logits
//! are bit-identical either way.

mod common;

use common::gpu;
use common::logits::{assert_same_logits, for_every_model};

use moestream::gpu::{Gpu, GpuOptions};

#[test]
fn eight_byte_loads_compute_what_four_byte_loads_do() {
    let four = Gpu::new(&GpuOptions { four_byte_words: true, ..Default::default() }).unwrap();
    assert!(!four.caps.words64);
    let eight = gpu();
    if !eight.caps.words64 {
        eprintln!(
            "{}: no 8-byte loads here (a GPU layout, or no SHADER_INT64); nothing to compare",
            eight.adapter.name
        );
        return;
    }
    for_every_model(|path, format, prompt| {
        assert_same_logits("8-byte loads against 4-byte ones", &eight, &four, path, format, prompt)
    });
}

#[test]
fn lavapipe_loads_eight_bytes_at_a_time() {
    // lavapipe (llvmpipe) has SHADER_INT64 and takes the CPU layout, so its wide kernels load 8
    // bytes at a time; only the CPU layout ever does.
    let g = gpu();
    if g.adapter.name.contains("llvmpipe") {
        assert!(g.caps.words64, "{:?}", g.caps);
    }
    assert!(!g.caps.words64 || g.caps.cpu_layouts, "{:?}", g.caps);
}
