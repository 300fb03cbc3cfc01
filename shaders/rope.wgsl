// Rotary position embedding, in place on rows of row_stride values for token t at position
// step.pos + t: n_heads heads start head_stride values apart, and within each head the
// rotary_dim values from `offset` rotate (the rest pass through). Pair j is (j, j + rotary_dim/2)
// (rotate-half / NeoX) or (2j, 2j + 1) when `interleaved` (DeepSeek). cos/sin come from a table
// [max_positions, rotary_dim / 2] computed on the host (scaled frequencies and YaRN's factor
// included). With at_cache_pos the rows start at step.pos (keys written straight into a cache).
// PAIR: a second buffer `x_b` with its own layout `b` in the same dispatch (a layer's queries
// and keys), its pairs numbered after the first buffer's.
//#include common

// Where one buffer's rotated values sit (the launcher: RopeLayout).
struct Layout {
    n_heads: u32,
    head_stride: u32,
    row_stride: u32,
    offset: u32,
    at_cache_pos: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

struct Params {
    rotary_dim: u32,
    interleaved: u32,
    pad0: u32,
    pad1: u32,
    a: Layout,
    b: Layout,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> cos_table: array<f32>;
@group(0) @binding(3) var<storage, read> sin_table: array<f32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;
//#if PAIR
@group(0) @binding(5) var<storage, read_write> x_b: array<f32>;
//#endif

// Pair i of layout l: the indices of its two values and its cos, sin.
struct Pair {
    a: u32,
    b: u32,
    c: f32,
    s: f32,
}

fn pair_at(l: Layout, i: u32) -> Pair {
    let half_dim = p.rotary_dim / 2u;
    let t = i / (l.n_heads * half_dim);
    let h = (i / half_dim) % l.n_heads;
    let j = i % half_dim;
    let pos = step.pos + t;
    let row = t + l.at_cache_pos * step.pos;
    let base = row * l.row_stride + h * l.head_stride + l.offset;
    var a = base + j;
    var b = base + j + half_dim;
    if (p.interleaved == 1u) {
        a = base + 2u * j;
        b = a + 1u;
    }
    return Pair(a, b, cos_table[pos * half_dim + j], sin_table[pos * half_dim + j]);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let half_dim = p.rotary_dim / 2u;
    let i = group_index(wid, nwg) * 64u + lid;
    let n_a = step.n_tokens * p.a.n_heads * half_dim;
    if (i < n_a) {
        let q = pair_at(p.a, i);
        let x1 = x[q.a];
        let x2 = x[q.b];
        x[q.a] = x1 * q.c - x2 * q.s;
        x[q.b] = x2 * q.c + x1 * q.s;
        return;
    }
//#if PAIR
    if (i - n_a < step.n_tokens * p.b.n_heads * half_dim) {
        let q = pair_at(p.b, i - n_a);
        let x1 = x_b[q.a];
        let x2 = x_b[q.b];
        x_b[q.a] = x1 * q.c - x2 * q.s;
        x_b[q.b] = x2 * q.c + x1 * q.s;
    }
//#endif
}
