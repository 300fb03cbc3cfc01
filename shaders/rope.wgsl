// Rotary position embedding, in place on rows of row_stride values for token t at position
// step.pos + t: n_heads heads start head_stride values apart, and within each head the
// rotary_dim values from `offset` rotate (the rest pass through). Pair j is (j, j + rotary_dim/2)
// (rotate-half / NeoX) or (2j, 2j + 1) when `interleaved` (DeepSeek). cos/sin come from a table
// [max_positions, rotary_dim / 2] computed on the host (scaled frequencies and YaRN's factor
// included). With at_cache_pos the rows start at step.pos (keys written straight into a cache).
// A grouped-attention layer's queries and keys rotate in its cache store instead (kv_store's
// ROPE).
//#include common

struct Params {
    rotary_dim: u32,
    interleaved: u32,
    pad0: u32,
    pad1: u32,
    a: Layout,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> cos_table: array<f32>;
@group(0) @binding(3) var<storage, read> sin_table: array<f32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;

//#include rope_pairs

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 64u + lid;
    if (i < step.n_tokens * p.a.n_heads * (p.rotary_dim / 2u)) {
        let q = pair_at(p.a, i);
        let r = rotated(q.c, q.s, x[q.a], x[q.b]);
        x[q.a] = r.x;
        x[q.b] = r.y;
    }
}
