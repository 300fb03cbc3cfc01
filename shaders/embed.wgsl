// Embedding lookup: x[t, :] = table[tokens[t], :] for the tokens whose id falls in this chunk
// of the table (rows first_row .. first_row + rows).
//#include common
//#include weights_select

struct Params {
    hidden: u32,
    first_row: u32,
    rows: u32,
    pad: u32,
    w_scales: u32,
    w_mins: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> tokens: array<u32>;
@group(0) @binding(3) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * 64u + lid;
    if (i >= step.n_tokens * p.hidden) {
        return;
    }
    let t = i / p.hidden;
    let c = i % p.hidden;
    let id = tokens[t];
    if (id < p.first_row || id >= p.first_row + p.rows) {
        return;
    }
    x[i] = w_at(WMat(0u, p.hidden, p.w_scales, p.w_mins), id - p.first_row, c);
}
