// Second pass of split (flash-decoding) attention for one token: merges the partials that
// attention's SPLIT variant left per (split, head) — max m_s, sum l_s, accumulator a_s — into
// out = Σ a_s·e^(m_s−M) / Σ l_s·e^(m_s−M), M = max m_s. One workgroup per query head; the
// splits are ceil(step.kv_len / split_len). SINKS: the head's sink logit joins M and the
// denominator (l += e^(sink−M)) and adds no value.
//#include common
//#include split_merge

struct Params {
    n_heads: u32,
    head_dim: u32,
    split_len: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> partial: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
//#if SINKS
@group(0) @binding(4) var<storage, read> sinks: array<f32>;
//#endif

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = group_index(wid, nwg);
    if (h >= p.n_heads) {
        return;
    }
    let sp = Splits(h, p.n_heads, p.head_dim + 2u, (step.kv_len + p.split_len - 1u) / p.split_len);
//#if SINKS
    let big_m = max(merged_max(sp, -1.0e30), sinks[h]);
    let l = merged_sum(sp, big_m, exp(sinks[h] - big_m));
//#else
    let big_m = merged_max(sp, -1.0e30);
    let l = merged_sum(sp, big_m, 0.0);
//#endif
    for (var d = lid; d < p.head_dim; d += 64u) {
        out[h * p.head_dim + d] = merged_acc(sp, big_m, d) / l;
    }
}
