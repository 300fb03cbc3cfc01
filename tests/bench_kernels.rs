//! `bench kernels` on a small matrix: every figure is measured, and the read roofline is the
//! faster of its 16-byte loads (`vec2<u64>` ones wherever the device has 8-byte integers).

mod common;

use common::gpu;

use moestream::bench::kernels::{self, KernelBenchOptions};

#[test]
fn the_read_roofline_is_the_faster_of_its_loads() {
    let g = gpu();
    let o = KernelBenchOptions {
        rows: 256,
        cols: 512,
        seconds: 0.05,
        working_set: 4 << 20,
        kv_len: 256,
        ..Default::default()
    };
    let r = kernels::run(&g, &o).unwrap();
    for (name, gbps) in [("int4", r.int4_gbps), ("f16", r.f16_gbps), ("copy", r.copy_gbps), ("read", r.read_gbps)] {
        assert!(gbps.is_finite() && gbps > 0.0, "{name}: {gbps}");
    }
    let has_int64 = g.device.features().contains(wgpu::Features::SHADER_INT64);
    assert_eq!(r.read_u64_gbps.is_some(), has_int64, "{r:?}");
    assert_eq!(r.read_gbps, r.read_u64_gbps.unwrap_or(0.0).max(r.read_vec4_gbps), "{r:?}");
    assert_eq!(r.int4_vs_read, r.int4_gbps / r.read_gbps);
}

#[test]
fn columns_not_a_multiple_of_64_are_refused() {
    let o = KernelBenchOptions { rows: 64, cols: 100, ..Default::default() };
    let e = kernels::run(&gpu(), &o).unwrap_err().to_string();
    assert!(e.contains("multiple of 64"), "{e}");
}
