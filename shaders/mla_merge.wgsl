// Second pass of split MLA decode over the latent cache: merges the partials mla_attention's
// SPLIT variant left per (split, head) -- max m_s, sum l_s, latent accumulator a_s [rank] --
// into o_lat = sum a_s e^(m_s-M) / sum l_s e^(m_s-M) (M = max m_s), then applies W_UV:
// out[h] = W_UV[h] o_lat (W_UV[h]: rows h*(nope+v) + nope .. +v of kv_b [.., rank]). One
// workgroup per head; the splits are ceil(step.kv_len / split_len). rank <= 512.
//#include common
//#include split_merge

struct Params {
    n_heads: u32,
    rank: u32,
    nope: u32,
    v_dim: u32,
    split_len: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> partial: array<f32>;
@group(0) @binding(3) var<storage, read> kv_b: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

var<workgroup> lat: array<f32, 512>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = group_index(wid, nwg);
    if (h >= p.n_heads) {
        return;
    }
    let sp = Splits(h, p.n_heads, p.rank + 2u, (step.kv_len + p.split_len - 1u) / p.split_len);
    let big_m = merged_max(sp, -1.0e30);
    let l = merged_sum(sp, big_m, 0.0);
    for (var r = lid; r < p.rank; r += 64u) {
        lat[r] = merged_acc(sp, big_m, r) / l;
    }
    workgroupBarrier();
    let v_base = (h * (p.nope + p.v_dim) + p.nope) * p.rank;
    for (var j = lid; j < p.v_dim; j += 64u) {
        var a = 0.0;
        for (var r = 0u; r < p.rank; r++) {
            a += kv_b[v_base + j * p.rank + r] * lat[r];
        }
        out[h * p.v_dim + j] = a;
    }
}
