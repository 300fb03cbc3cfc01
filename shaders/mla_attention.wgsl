// Causal multi-head latent attention, decode and prefill, over a session's MLA cache in one of
// two forms:
//   latent (default): c_cache [positions, rank] (normalised latents) and kr_cache [positions,
//     rope] (the rotated key all heads share); the absorbed form:
//       q_lat = W_UK[h]^T q_nope   (W_UK[h]: rows h*(nope+v) .. +nope of kv_b [.., rank])
//       s_j   = (q_lat . c_j + q_rope . kr_j) * scale
//       o_lat = softmax-weighted sum of c_j,  out = W_UV[h] o_lat  (W_UV[h]: the next v rows)
//   DECOMPRESSED: per-head keys k_cache [heads, context, nope + rope] ([W_UK c | kr], written by
//     mla_decompress) and values v_cache [heads, context, v]; plain attention, out = sum p_j v_j.
// One workgroup takes QT = 4 heads ("slots") of one query token: with the latent cache they
// share every latent load. Query t sits at position step.pos + t and sees keys 0 ..= step.pos + t,
// visited in tiles of 64 with an online softmax (no score matrix). Without SPLIT: workgroups per
// (token, head set), writing out [tokens, heads, v]. With SPLIT (decode, one token): per (head
// set, split of split_len keys), writing each head's partial (max, sum, unnormalised accumulator
// over the value width: rank for the latent cache, v decompressed) for mla_merge (latent) or
// attention_merge (decompressed). Key width (rank + rope, or nope + rope) <= 640, value width
// <= 512. F16: the caches hold two halves per u32, unpacked in f32 arithmetic. Q8 (latent cache
// only): each cache holds its rows' int8 codes, then their f16 scales (quant::kv_dtype::Q8Rows);
// with Q4 (q4_0) 4-bit codes, each plus 8, eight to a word.
// The latent and rotary-key caches hold `context` rows each (the decompressed ones `context`
// per head).
//#include common
//#include reduce4

struct Params {
    n_heads: u32,
    rank: u32,
    nope: u32,
    rope: u32,
    v_dim: u32,
    scale: f32,
    split_len: u32,
    context: u32,
    // Q8: values per block and scales per word of latent rows, then of rotary-key rows.
    q8_block_a: u32,
    q8_spw_a: u32,
    q8_block_b: u32,
    q8_spw_b: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<f32>;
//#if F16
@group(0) @binding(3) var<storage, read> cache_a: array<u32>;
@group(0) @binding(4) var<storage, read> cache_b: array<u32>;
//#else
//#if Q8
@group(0) @binding(3) var<storage, read> cache_a: array<u32>;
@group(0) @binding(4) var<storage, read> cache_b: array<u32>;
//#else
@group(0) @binding(3) var<storage, read> cache_a: array<f32>;
@group(0) @binding(4) var<storage, read> cache_b: array<f32>;
//#endif
//#endif
//#if DECOMPRESSED
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
//#else
@group(0) @binding(5) var<storage, read> kv_b: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
//#endif

// Element i of cache_a (latents, or decompressed keys) and cache_b (rotary keys, or values).
fn a_at(i: u32) -> f32 {
//#if F16
    return unpack2x16float(cache_a[i / 2u])[i % 2u];
//#else
//#if Q8
    let s = q8_scale(i, p.context * p.rank, p.q8_block_a, p.q8_spw_a);
    return q8_code(cache_a[i / CODES_PER_WORD], i) * unpack2x16float(cache_a[s.x])[s.y];
//#else
    return cache_a[i];
//#endif
//#endif
}

fn b_at(i: u32) -> f32 {
//#if F16
    return unpack2x16float(cache_b[i / 2u])[i % 2u];
//#else
//#if Q8
    let s = q8_scale(i, p.context * p.rope, p.q8_block_b, p.q8_spw_b);
    return q8_code(cache_b[i / CODES_PER_WORD], i) * unpack2x16float(cache_b[s.x])[s.y];
//#else
    return cache_b[i];
//#endif
//#endif
}

//#if Q8
//#if Q4
const CODES_PER_WORD: u32 = 8u;

// Code i of a cache as f32, from its word.
fn q8_code(w: u32, i: u32) -> f32 {
    return f32((w >> (4u * (i % 8u))) & 0xfu) - 8.0;
}
//#else
const CODES_PER_WORD: u32 = 4u;

// Code i of a cache as f32, from its word.
fn q8_code(w: u32, i: u32) -> f32 {
    return f32(bitcast<i32>(w << (24u - 8u * (i % 4u))) >> 24u);
}
//#endif

// Where element i's scale is in a cache of `values` codes: its word and half.
fn q8_scale(i: u32, values: u32, block: u32, spw: u32) -> vec2<u32> {
    let b = i / block;
    return vec2<u32>(values / CODES_PER_WORD + b / spw, b % spw);
}
//#endif

const QT: u32 = 4u;

// Element d of every slot's query in key space (for the latent cache: q_lat, then q_rope); after
// the keys, the latent output o_lat of every slot.
var<workgroup> qk4: array<vec4<f32>, 640>;
var<workgroup> probs: array<vec4<f32>, 64>;

// Element d of slot head h's query in key space, for token t.
fn query(t: u32, h: u32, d: u32) -> f32 {
    let qb = (t * p.n_heads + h) * (p.nope + p.rope);
//#if DECOMPRESSED
    return q[qb + d];
//#else
    if (d >= p.rank) {
        return q[qb + p.nope + d - p.rank];
    }
    let w_base = h * (p.nope + p.v_dim) * p.rank;
    var a = 0.0;
    for (var e = 0u; e < p.nope; e++) {
        a += q[qb + e] * kv_b[w_base + e * p.rank + d];
    }
    return a;
//#endif
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let sets = (p.n_heads + QT - 1u) / QT;
//#if SPLIT
    let split = g / sets;
    let t = 0u;
//#else
    let t = g / sets;
    if (t >= step.n_tokens) {
        return;
    }
//#endif
    let h0 = (g % sets) * QT;
    let nq = min(QT, p.n_heads - h0);
    // Slots past the last head repeat it; their results are not written.
    let hs = min(vec4<u32>(h0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n_heads - 1u));
//#if DECOMPRESSED
    let k_dim = p.nope + p.rope;
    let v_width = p.v_dim;
//#else
    let k_dim = p.rank + p.rope;
    let v_width = p.rank;
//#endif
    for (var d = lid; d < k_dim; d += 64u) {
        qk4[d] = vec4<f32>(query(t, hs.x, d), query(t, hs.y, d), query(t, hs.z, d), query(t, hs.w, d));
    }
    workgroupBarrier();
    let n_keys = step.pos + t + 1u;
//#if SPLIT
    let first = split * p.split_len;
    let end = min(n_keys, first + p.split_len);
//#else
    let first = 0u;
    let end = n_keys;
//#endif
    var m = vec4<f32>(-1.0e30);
    var l = vec4<f32>(0.0);
    var acc: array<vec4<f32>, 8>;
    for (var tile = first; tile < end; tile += 64u) {
        let j = tile + lid;
        var s = vec4<f32>(-1.0e30);
        if (j < end) {
            var dotv = vec4<f32>(0.0);
//#if DECOMPRESSED
            let kb = (hs * p.context + vec4<u32>(j)) * k_dim;
            for (var d = 0u; d < k_dim; d++) {
                dotv += qk4[d] * vec4<f32>(a_at(kb.x + d), a_at(kb.y + d), a_at(kb.z + d), a_at(kb.w + d));
            }
//#else
            // Four dims an iteration (then the rest): lavapipe stops an invocation's loops
            // after 65535 iterations in all, and this loop runs once per key tile.
            let lb = j * p.rank;
            var r = 0u;
            for (; r + 3u < p.rank; r += 4u) {
                dotv += qk4[r] * a_at(lb + r) + qk4[r + 1u] * a_at(lb + r + 1u) + qk4[r + 2u] * a_at(lb + r + 2u)
                    + qk4[r + 3u] * a_at(lb + r + 3u);
            }
            for (; r < p.rank; r++) {
                dotv += qk4[r] * a_at(lb + r);
            }
            let rb = j * p.rope;
            var i = 0u;
            for (; i + 3u < p.rope; i += 4u) {
                dotv += qk4[p.rank + i] * b_at(rb + i) + qk4[p.rank + i + 1u] * b_at(rb + i + 1u)
                    + qk4[p.rank + i + 2u] * b_at(rb + i + 2u) + qk4[p.rank + i + 3u] * b_at(rb + i + 3u);
            }
            for (; i < p.rope; i++) {
                dotv += qk4[p.rank + i] * b_at(rb + i);
            }
//#endif
            s = dotv * p.scale;
        }
        let m_new = max(m, reduce_max4(lid, s));
        let pj = select(vec4<f32>(0.0), exp(s - m_new), vec4<bool>(j < end));
        probs[lid] = pj;
        let corr = exp(m - m_new);
        // Each lane keeps the sum of its own keys' weights; one reduction at the end.
        l = l * corr + pj;
        workgroupBarrier();
        let n_here = min(64u, end - tile);
        for (var c = 0u; c < 8u; c++) {
            let r = lid + c * 64u;
            if (r < v_width) {
                var a = acc[c] * corr;
//#if DECOMPRESSED
                for (var jj = 0u; jj < n_here; jj++) {
                    let vb = (hs * p.context + vec4<u32>(tile + jj)) * p.v_dim + vec4<u32>(r);
                    a += probs[jj] * vec4<f32>(b_at(vb.x), b_at(vb.y), b_at(vb.z), b_at(vb.w));
                }
//#else
                // Four keys an iteration (then the rest), as above.
                var jj = 0u;
                for (; jj + 3u < n_here; jj += 4u) {
                    let at = (tile + jj) * p.rank + r;
                    a += probs[jj] * a_at(at) + probs[jj + 1u] * a_at(at + p.rank) + probs[jj + 2u] * a_at(at + 2u * p.rank)
                        + probs[jj + 3u] * a_at(at + 3u * p.rank);
                }
                for (; jj < n_here; jj++) {
                    a += probs[jj] * a_at((tile + jj) * p.rank + r);
                }
//#endif
                acc[c] = a;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    l = reduce_sum4(lid, l);
//#if SPLIT
    // Partial of (split, head): [max, sum, accumulator[v_width]].
    for (var qi = 0u; qi < nq; qi++) {
        let base = (split * p.n_heads + h0 + qi) * (v_width + 2u);
        if (lid == 0u) {
            out[base] = m[qi];
            out[base + 1u] = l[qi];
        }
        for (var c = 0u; c < 8u; c++) {
            let r = lid + c * 64u;
            if (r < v_width) {
                out[base + 2u + r] = acc[c][qi];
            }
        }
    }
//#else
//#if DECOMPRESSED
    for (var qi = 0u; qi < nq; qi++) {
        let ob = (t * p.n_heads + h0 + qi) * p.v_dim;
        for (var c = 0u; c < 8u; c++) {
            let r = lid + c * 64u;
            if (r < p.v_dim) {
                out[ob + r] = acc[c][qi] / l[qi];
            }
        }
    }
//#else
    // The attended latents, then W_UV.
    for (var c = 0u; c < 8u; c++) {
        let r = lid + c * 64u;
        if (r < p.rank) {
            qk4[r] = acc[c] / l;
        }
    }
    workgroupBarrier();
    for (var qi = 0u; qi < nq; qi++) {
        let v_base = ((h0 + qi) * (p.nope + p.v_dim) + p.nope) * p.rank;
        for (var j = lid; j < p.v_dim; j += 64u) {
            var a = 0.0;
            for (var r = 0u; r < p.rank; r++) {
                a += kv_b[v_base + j * p.rank + r] * qk4[r][qi];
            }
            out[(t * p.n_heads + h0 + qi) * p.v_dim + j] = a;
        }
    }
//#endif
//#endif
}
