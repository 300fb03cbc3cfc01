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

fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}
