// Residual update of an MoE layer: x[t] += sum_j y[t * top_k + j] (+ sigmoid(shared_gate[t]) *
// shared[t] with SHARED, the Qwen2-MoE shared expert).
//#include common

struct Params {
    hidden: u32,
    top_k: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;
//#if SHARED
@group(0) @binding(4) var<storage, read> shared_out: array<f32>;
@group(0) @binding(5) var<storage, read> shared_gate: array<f32>;
//#endif

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 64u + lid;
    if (i >= step.n_tokens * p.hidden) {
        return;
    }
    let t = i / p.hidden;
    let n = i % p.hidden;
    var s = 0.0;
    for (var j = 0u; j < p.top_k; j++) {
        s += y[(t * p.top_k + j) * p.hidden + n];
    }
//#if SHARED
    s += shared_out[i] / (1.0 + exp(-shared_gate[t]));
//#endif
    x[i] += s;
}
