// Rotary position embedding, in place on rows of row_stride values for token t at position
// step.pos + t: n_heads heads start head_stride values apart, and within each head the
// rotary_dim values from `offset` rotate (the rest pass through). Pair j is (j, j + rotary_dim/2)
// (rotate-half / NeoX) or (2j, 2j + 1) when `interleaved` (DeepSeek). cos/sin come from a table
// [max_positions, rotary_dim / 2] computed on the host (scaled frequencies and YaRN's factor
// included). With at_cache_pos the rows start at step.pos (keys written straight into a cache).
//#include common

struct Params {
    n_heads: u32,
    head_stride: u32,
    row_stride: u32,
    offset: u32,
    rotary_dim: u32,
    interleaved: u32,
    at_cache_pos: u32,
    pad: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> cos_table: array<f32>;
@group(0) @binding(3) var<storage, read> sin_table: array<f32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let half_dim = p.rotary_dim / 2u;
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
    let base = row * p.row_stride + h * p.head_stride + p.offset;
    var a = base + j;
    var b = base + j + half_dim;
    if (p.interleaved == 1u) {
        a = base + 2u * j;
        b = a + 1u;
    }
    let x1 = x[a];
    let x2 = x[b];
    x[a] = x1 * c - x2 * s;
    x[b] = x2 * c + x1 * s;
}
