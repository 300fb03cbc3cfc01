// Rotary position embedding (rotate-half / NeoX convention), in place on rows of
// n_heads * head_dim values for token t at position step.pos + t. cos/sin come from a table
// [max_positions, head_dim / 2] computed on the host. With at_cache_pos the rows start at
// step.pos (keys written straight into the KV cache).
//#include common

struct Params {
    n_heads: u32,
    head_dim: u32,
    at_cache_pos: u32,
    pad: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> cos_table: array<f32>;
@group(0) @binding(3) var<storage, read> sin_table: array<f32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let half_dim = p.head_dim / 2u;
    let i = group_index(wid, nwg) * 64u + lid;
    if (i >= step.n_tokens * p.n_heads * half_dim) {
        return;
    }
    let t = i / (p.n_heads * half_dim);
    let h = (i / half_dim) % p.n_heads;
    let j = i % half_dim;
    let pos = step.pos + t;
    let c = cos_table[pos * half_dim + j];
    let s = sin_table[pos * half_dim + j];
    let row = t + p.at_cache_pos * step.pos;
    let base = row * p.n_heads * p.head_dim + h * p.head_dim;
    let x1 = x[base + j];
    let x2 = x[base + j + half_dim];
    x[base + j] = x1 * c - x2 * s;
    x[base + j + half_dim] = x2 * c + x1 * s;
}
