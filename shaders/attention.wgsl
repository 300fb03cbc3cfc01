// Causal grouped-query attention over the KV cache, for decode (one query) and prefill (many).
// One workgroup per (token, head); keys are visited in tiles of 64 with an online softmax, so
// any context length works with fixed workgroup memory. Query t sits at position step.pos + t
// and sees keys 0 ..= step.pos + t. head_dim <= 256.
//#include common
//#include reduce

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    scale: f32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read> v_cache: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

var<workgroup> qs: array<f32, 256>;
var<workgroup> probs: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let t = g / p.n_heads;
    let h = g % p.n_heads;
    if (t >= step.n_tokens) {
        return;
    }
    let hd = p.head_dim;
    let kv_h = h / (p.n_heads / p.n_kv_heads);
    let kv_width = p.n_kv_heads * hd;
    let q_base = t * p.n_heads * hd + h * hd;
    for (var d = lid; d < hd; d += 64u) {
        qs[d] = q[q_base + d];
    }
    workgroupBarrier();
    let n_keys = step.pos + t + 1u;
    var m = -1.0e30;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var tile = 0u; tile < n_keys; tile += 64u) {
        let j = tile + lid;
        var s = -1.0e30;
        if (j < n_keys) {
            let kb = j * kv_width + kv_h * hd;
            var dotv = 0.0;
            for (var d = 0u; d < hd; d++) {
                dotv += qs[d] * k_cache[kb + d];
            }
            s = dotv * p.scale;
        }
        let m_new = max(m, reduce_max(lid, s));
        let pj = select(0.0, exp(s - m_new), j < n_keys);
        probs[lid] = pj;
        let corr = exp(m - m_new);
        l = l * corr + reduce_sum(lid, pj);
        let n_here = min(64u, n_keys - tile);
        for (var c = 0u; c < 4u; c++) {
            let d = lid + c * 64u;
            if (d < hd) {
                var a = acc[c] * corr;
                for (var jj = 0u; jj < n_here; jj++) {
                    a += probs[jj] * v_cache[(tile + jj) * kv_width + kv_h * hd + d];
                }
                acc[c] = a;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    for (var c = 0u; c < 4u; c++) {
        let d = lid + c * 64u;
        if (d < hd) {
            out[q_base + d] = acc[c] / l;
        }
    }
}
