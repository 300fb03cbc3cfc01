// h[t, i] = silu(gu[t, i]) * gu[t, inter + i], where gu is a fused gate|up projection output.
//#include common

struct Params {
    inter: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> gu: array<f32>;
@group(0) @binding(3) var<storage, read_write> h: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 64u + lid;
    if (i >= step.n_tokens * p.inter) {
        return;
    }
    let t = i / p.inter;
    let c = i % p.inter;
    h[i] = silu(gu[t * 2u * p.inter + c]) * gu[t * 2u * p.inter + p.inter + c];
}
