// y[t, i] *= act(g[t * gate_stride + gate_offset + i / span]) for i < width, act = sigmoid, or
// silu with SILU (gated attention's output gate; the gate of the linear attention's output
// norm; span = a head's width: Ling's MLA gate, one value per head).
//#include common

struct Params {
    width: u32,
    gate_stride: u32,
    gate_offset: u32,
    span: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 64u + lid;
    if (i >= step.n_tokens * p.width) {
        return;
    }
    let t = i / p.width;
    let gv = g[t * p.gate_stride + p.gate_offset + (i % p.width) / p.span];
//#if SILU
    y[i] = y[i] * silu(gv);
//#else
    y[i] = y[i] / (1.0 + exp(-gv));
//#endif
}
