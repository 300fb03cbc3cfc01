// Causal grouped-query attention over one chunk of the KV cache (a run of KV heads, laid out as
// kv_store writes them: head-major, F16 = two halves per u32), for the query heads that read it.
// Query t sits at position step.pos + t and sees keys 0 ..= step.pos + t, or with a sliding
// window (window > 0) only its last `window` keys step.pos + t + 1 - window ..= step.pos + t
// (transformers' sliding_window_overlay: kv > q - window). Keys are visited in
// tiles of 64 with an online softmax, so any length works with fixed workgroup memory and no
// score matrix is ever stored (prefill is tiled the same way). head_dim <= 256, even.
//
// A workgroup runs QT queries ("slots") against one KV head; they share each key and value
// load and each reduction. Without SPLIT: one workgroup per (QT consecutive tokens, query head),
// writing the normalised output. With SPLIT (decode, one token): one workgroup per (QT query
// heads of one KV head's group, split of split_len keys) -- GQA: the group's heads read each
// key and value once -- writing each head's partial (max, sum, unnormalised accumulator) for
// attention_merge.
//
// SINKS (gpt-oss): each query head has a learned logit that joins the softmax denominator and
// no value (transformers' eager_attention_forward concatenates it to the scores, softmaxes and
// drops it). The single pass applies it here, the split pass leaves it to attention_merge.
//#include common
//#include reduce4

struct Params {
    n_heads: u32,
    group: u32,
    head_dim: u32,
    scale: f32,
    kv_head0: u32,
    chunk_heads: u32,
    context: u32,
    split_len: u32,
    window: u32,
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
//#if SINKS
@group(0) @binding(6) var<storage, read> sinks: array<f32>;
//#endif

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

const QT: u32 = 4u;

var<workgroup> qs: array<vec2<f32>, 512>;
var<workgroup> probs: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
//#if SPLIT
    // Slot qi: query head h + qi of token 0, all of KV head kv_local.
    let sets = (p.group + QT - 1u) / QT;
    let chunk_sets = p.chunk_heads * sets;
    let split = g / chunk_sets;
    let head_set = g % chunk_sets;
    let kv_local = head_set / sets;
    let hl = kv_local * p.group + (head_set % sets) * QT;
    let t0 = 0u;
    let nq = min(QT, p.group - (head_set % sets) * QT);
    let slot_token = vec4<u32>(0u);
    let slot_head = vec4<u32>(0u, 1u, 2u, 3u);
//#else
    // Slot qi: token t0 + qi of query head h.
    let chunk_q = p.chunk_heads * p.group;
    let hl = g % chunk_q;
    let kv_local = hl / p.group;
    let t0 = (g / chunk_q) * QT;
    if (t0 >= step.n_tokens) {
        return;
    }
    let nq = min(QT, step.n_tokens - t0);
    let slot_token = vec4<u32>(0u, 1u, 2u, 3u);
    let slot_head = vec4<u32>(0u);
//#endif
    let h = p.kv_head0 * p.group + hl;
    let pairs = p.head_dim / 2u;
    for (var i = lid; i < nq * pairs; i += 64u) {
        let qi = i / pairs;
        let d = i % pairs;
        let qb = ((t0 + slot_token[qi]) * p.n_heads + h + slot_head[qi]) * p.head_dim + 2u * d;
        qs[qi * 128u + d] = vec2<f32>(q[qb], q[qb + 1u]);
    }
    workgroupBarrier();
    let head_base = kv_local * p.context * pairs;
    // Keys query qi sees are starts[qi] .. ends[qi]; queries past nq see none.
    let first_key_end = step.pos + t0 + 1u;
    var ends = vec4<u32>(first_key_end) + slot_token;
    ends = select(vec4<u32>(0u), ends, vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(nq));
    var starts = vec4<u32>(0u);
    if (p.window > 0u) {
        starts = max(ends, vec4<u32>(p.window)) - vec4<u32>(p.window);
    }
//#if SPLIT
    let split_first = split * p.split_len;
    ends = min(ends, vec4<u32>(split_first + p.split_len));
    // A split wholly before the window runs no tile: it leaves max -1e30, sum 0.
    let first = max(split_first, starts.x);
//#else
    // Slot 0 has the earliest start.
    let first = starts.x;
//#endif
    let end = max(max(ends.x, ends.y), max(ends.z, ends.w));
    var m = vec4<f32>(-1.0e30);
    var l = vec4<f32>(0.0);
    var acc: array<array<vec2<f32>, 2>, 4>;
    for (var tile = first; tile < end; tile += 64u) {
        let j = tile + lid;
        var s = vec4<f32>(0.0);
        if (j < end) {
            let kb = head_base + j * pairs;
            for (var d = 0u; d < pairs; d++) {
                let kp = k_pair(kb + d);
                s += vec4<f32>(dot(qs[d], kp), dot(qs[128u + d], kp), dot(qs[256u + d], kp), dot(qs[384u + d], kp));
            }
        }
        let valid = (vec4<u32>(j) < ends) & (vec4<u32>(j) >= starts);
        s = select(vec4<f32>(-1.0e30), s * p.scale, valid);
        let m_new = max(m, reduce_max4(lid, s));
        let pj = select(vec4<f32>(0.0), exp(s - m_new), valid);
        probs[lid] = pj;
        let corr = exp(m - m_new);
        // Each lane keeps the sum of its own keys' weights (corr is the same in every lane);
        // one reduction at the end gives the totals.
        l = l * corr + pj;
        workgroupBarrier();
        let n_here = min(64u, end - tile);
        for (var c = 0u; c < 2u; c++) {
            let d = lid + c * 64u;
            if (d < pairs) {
                var a0 = acc[0][c] * corr.x;
                var a1 = acc[1][c] * corr.y;
                var a2 = acc[2][c] * corr.z;
                var a3 = acc[3][c] * corr.w;
                for (var jj = 0u; jj < n_here; jj++) {
                    let vp = v_pair(head_base + (tile + jj) * pairs + d);
                    let pr = probs[jj];
                    a0 += pr.x * vp;
                    a1 += pr.y * vp;
                    a2 += pr.z * vp;
                    a3 += pr.w * vp;
                }
                acc[0][c] = a0;
                acc[1][c] = a1;
                acc[2][c] = a2;
                acc[3][c] = a3;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    l = reduce_sum4(lid, l);
//#if SPLIT
    // Partial of (split, head): [max, sum, accumulator[head_dim]].
    for (var qi = 0u; qi < nq; qi++) {
        let base = (split * p.n_heads + h + qi) * (p.head_dim + 2u);
        if (lid == 0u) {
            out[base] = m[qi];
            out[base + 1u] = l[qi];
        }
        for (var c = 0u; c < 2u; c++) {
            let d = lid + c * 64u;
            if (d < pairs) {
                out[base + 2u + 2u * d] = acc[qi][c].x;
                out[base + 3u + 2u * d] = acc[qi][c].y;
            }
        }
    }
//#else
//#if SINKS
    // Rescaled to the larger of the keys' max and the sink, as a softmax over both.
    let sink = vec4<f32>(sinks[h]);
    let m_all = max(m, sink);
    let keep = exp(m - m_all);
    l = l * keep + exp(sink - m_all);
//#else
    let keep = vec4<f32>(1.0);
//#endif
    for (var qi = 0u; qi < nq; qi++) {
        let ob = ((t0 + qi) * p.n_heads + h) * p.head_dim;
        let w = keep[qi] / l[qi];
        for (var c = 0u; c < 2u; c++) {
            let d = lid + c * 64u;
            if (d < pairs) {
                out[ob + 2u * d] = acc[qi][c].x * w;
                out[ob + 2u * d + 1u] = acc[qi][c].y * w;
            }
        }
    }
//#endif
}
