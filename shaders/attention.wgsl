// Causal grouped-query attention over one chunk of the KV cache (a run of KV heads, laid out as
// kv_store writes them: head-major, F16 = two halves per u32), for the query heads that read it.
// Query t sits at position step.pos + t and sees keys 0 ..= step.pos + t. Keys are visited in
// tiles of 64 with an online softmax, so any length works with fixed workgroup memory and no
// score matrix is ever stored (prefill is tiled the same way). head_dim <= 256, even.
//
// Without SPLIT: one workgroup per (token, query head), writing the normalised output.
// With SPLIT (decode, one token): one workgroup per (query head, split of split_len keys),
// writing the split's partial (max, sum, unnormalised accumulator) for attention_merge.
//#include common
//#include reduce

struct Params {
    n_heads: u32,
    group: u32,
    head_dim: u32,
    scale: f32,
    kv_head0: u32,
    chunk_heads: u32,
    context: u32,
    split_len: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<f32>;
//#if F16
@group(0) @binding(3) var<storage, read> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read> v_cache: array<u32>;
//#else
@group(0) @binding(3) var<storage, read> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read> v_cache: array<f32>;
//#endif
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

// Dims 2i and 2i+1 of the chunk's element pair i.
fn k_pair(i: u32) -> vec2<f32> {
//#if F16
    return unpack2x16float(k_cache[i]);
//#else
    return vec2<f32>(k_cache[2u * i], k_cache[2u * i + 1u]);
//#endif
}

fn v_pair(i: u32) -> vec2<f32> {
//#if F16
    return unpack2x16float(v_cache[i]);
//#else
    return vec2<f32>(v_cache[2u * i], v_cache[2u * i + 1u]);
//#endif
}

var<workgroup> qs: array<vec2<f32>, 128>;
var<workgroup> probs: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let chunk_q = p.chunk_heads * p.group;
    let hl = g % chunk_q;
//#if SPLIT
    let t = 0u;
    let split = g / chunk_q;
//#else
    let t = g / chunk_q;
//#endif
    if (t >= step.n_tokens) {
        return;
    }
    let h = p.kv_head0 * p.group + hl;
    let pairs = p.head_dim / 2u;
    let q_base = (t * p.n_heads + h) * p.head_dim;
    for (var d = lid; d < pairs; d += 64u) {
        qs[d] = vec2<f32>(q[q_base + 2u * d], q[q_base + 2u * d + 1u]);
    }
    workgroupBarrier();
    let head_base = (hl / p.group) * p.context * pairs;
    let n_keys = step.pos + t + 1u;
//#if SPLIT
    let first = split * p.split_len;
    let end = min(n_keys, first + p.split_len);
//#else
    let first = 0u;
    let end = n_keys;
//#endif
    var m = -1.0e30;
    var l = 0.0;
    var acc = array<vec2<f32>, 2>(vec2<f32>(0.0), vec2<f32>(0.0));
    for (var tile = first; tile < end; tile += 64u) {
        let j = tile + lid;
        var s = -1.0e30;
        if (j < end) {
            let kb = head_base + j * pairs;
            var dotv = 0.0;
            for (var d = 0u; d < pairs; d++) {
                dotv += dot(qs[d], k_pair(kb + d));
            }
            s = dotv * p.scale;
        }
        let m_new = max(m, reduce_max(lid, s));
        let pj = select(0.0, exp(s - m_new), j < end);
        probs[lid] = pj;
        let corr = exp(m - m_new);
        // Each lane keeps the sum of its own keys' weights (corr is the same in every lane);
        // one reduction at the end gives the total.
        l = l * corr + pj;
        workgroupBarrier();
        let n_here = min(64u, end - tile);
        for (var c = 0u; c < 2u; c++) {
            let d = lid + c * 64u;
            if (d < pairs) {
                var a = acc[c] * corr;
                for (var jj = 0u; jj < n_here; jj++) {
                    a += probs[jj] * v_pair(head_base + (tile + jj) * pairs + d);
                }
                acc[c] = a;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    l = reduce_sum(lid, l);
//#if SPLIT
    // Partial of (split, head): [max, sum, accumulator[head_dim]].
    let base = (split * p.n_heads + h) * (p.head_dim + 2u);
    if (lid == 0u) {
        out[base] = m;
        out[base + 1u] = l;
    }
    for (var c = 0u; c < 2u; c++) {
        let d = lid + c * 64u;
        if (d < pairs) {
            out[base + 2u + 2u * d] = acc[c].x;
            out[base + 3u + 2u * d] = acc[c].y;
        }
    }
//#else
    for (var c = 0u; c < 2u; c++) {
        let d = lid + c * 64u;
        if (d < pairs) {
            out[q_base + 2u * d] = acc[c].x / l;
            out[q_base + 2u * d + 1u] = acc[c].y / l;
        }
    }
//#endif
}
