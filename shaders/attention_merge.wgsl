// Second pass of split (flash-decoding) attention for one token: merges the partials that
// attention's SPLIT variant left per (split, head) — max m_s, sum l_s, accumulator a_s — into
// out = Σ a_s·e^(m_s−M) / Σ l_s·e^(m_s−M), M = max m_s. One workgroup per query head; the
// splits are ceil(step.kv_len / split_len). SINKS: the head's sink logit joins M and the
// denominator (l += e^(sink−M)) and adds no value.
//#include common

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
    let n_splits = (step.kv_len + p.split_len - 1u) / p.split_len;
    let stride = p.head_dim + 2u;
    var big_m = -1.0e30;
    for (var s = 0u; s < n_splits; s++) {
        big_m = max(big_m, partial[(s * p.n_heads + h) * stride]);
    }
//#if SINKS
    big_m = max(big_m, sinks[h]);
    var l = exp(sinks[h] - big_m);
//#else
    var l = 0.0;
//#endif
    for (var s = 0u; s < n_splits; s++) {
        let base = (s * p.n_heads + h) * stride;
        l += partial[base + 1u] * exp(partial[base] - big_m);
    }
    for (var d = lid; d < p.head_dim; d += 64u) {
        var a = 0.0;
        for (var s = 0u; s < n_splits; s++) {
            let base = (s * p.n_heads + h) * stride;
            a += partial[base + 2u + d] * exp(partial[base] - big_m);
        }
        out[h * p.head_dim + d] = a / l;
    }
}
