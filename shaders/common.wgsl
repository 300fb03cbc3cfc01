// Shared by every kernel: the per-step uniform at binding 0 and the linear workgroup index
// (dispatches over the per-dimension limit are folded into x and y).
struct Step {
    n_tokens: u32,
    pos: u32,
    kv_len: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> step: Step;

fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// 1.0 when `x` is NaN or an infinity, else 0.0. Tested on the bits: WGSL lets a compiler
// assume floats are finite, so `x != x` may be folded away.
fn non_finite(x: f32) -> f32 {
    return select(0.0, 1.0, (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u);
}

fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}
