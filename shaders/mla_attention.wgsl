// Causal multi-head latent attention in the absorbed form, for decode and prefill, reading only
// the latent cache: c_cache [positions, rank] (normalised latents) and kr_cache [positions,
// rope] (the rotated key shared by all heads). One workgroup per (token, head):
//   q_lat = W_UK[h]^T q_nope            (W_UK[h]: rows h*(nope+v) .. +nope of kv_b [.., rank])
//   s_j   = (q_lat . c_j + q_rope . kr_j) * scale, online softmax over keys 0 ..= step.pos + t
//   o_lat = sum_j p_j c_j,  out = W_UV[h] o_lat   (W_UV[h]: the next v rows of kv_b)
// Query t sits at position step.pos + t. rank <= 512, rope <= 128. F16: the caches hold two
// halves per u32 (as kv_store writes them), unpacked in f32 arithmetic.
//#include common
//#include reduce

struct Params {
    n_heads: u32,
    rank: u32,
    nope: u32,
    rope: u32,
    v_dim: u32,
    scale: f32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<f32>;
//#if F16
@group(0) @binding(3) var<storage, read> c_cache: array<u32>;
@group(0) @binding(4) var<storage, read> kr_cache: array<u32>;
//#else
@group(0) @binding(3) var<storage, read> c_cache: array<f32>;
@group(0) @binding(4) var<storage, read> kr_cache: array<f32>;
//#endif
@group(0) @binding(5) var<storage, read> kv_b: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

// Element i of the latent cache (row-major [positions, rank]).
fn c_at(i: u32) -> f32 {
//#if F16
    return unpack2x16float(c_cache[i / 2u])[i % 2u];
//#else
    return c_cache[i];
//#endif
}

// Element i of the rotary-key cache (row-major [positions, rope]).
fn kr_at(i: u32) -> f32 {
//#if F16
    return unpack2x16float(kr_cache[i / 2u])[i % 2u];
//#else
    return kr_cache[i];
//#endif
}

var<workgroup> lat: array<f32, 512>;
var<workgroup> qr: array<f32, 128>;
var<workgroup> probs: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let t = g / p.n_heads;
    let h = g % p.n_heads;
    if (t >= step.n_tokens) {
        return;
    }
    let qk = p.nope + p.rope;
    let q_base = (t * p.n_heads + h) * qk;
    let w_base = h * (p.nope + p.v_dim) * p.rank;
    // The query folded into latent space, and its rotary part.
    for (var r = lid; r < p.rank; r += 64u) {
        var a = 0.0;
        for (var d = 0u; d < p.nope; d++) {
            a += q[q_base + d] * kv_b[w_base + d * p.rank + r];
        }
        lat[r] = a;
    }
    for (var i = lid; i < p.rope; i += 64u) {
        qr[i] = q[q_base + p.nope + i];
    }
    workgroupBarrier();
    let n_keys = step.pos + t + 1u;
    var m = -1.0e30;
    var l = 0.0;
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var tile = 0u; tile < n_keys; tile += 64u) {
        let j = tile + lid;
        var s = -1.0e30;
        if (j < n_keys) {
            var dotv = 0.0;
            for (var r = 0u; r < p.rank; r++) {
                dotv += lat[r] * c_at(j * p.rank + r);
            }
            for (var i = 0u; i < p.rope; i++) {
                dotv += qr[i] * kr_at(j * p.rope + i);
            }
            s = dotv * p.scale;
        }
        let m_new = max(m, reduce_max(lid, s));
        let pj = select(0.0, exp(s - m_new), j < n_keys);
        probs[lid] = pj;
        let corr = exp(m - m_new);
        l = l * corr + reduce_sum(lid, pj);
        let n_here = min(64u, n_keys - tile);
        for (var c = 0u; c < 8u; c++) {
            let r = lid + c * 64u;
            if (r < p.rank) {
                var a = acc[c] * corr;
                for (var jj = 0u; jj < n_here; jj++) {
                    a += probs[jj] * c_at((tile + jj) * p.rank + r);
                }
                acc[c] = a;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    // The attended latent, then W_UV.
    for (var c = 0u; c < 8u; c++) {
        let r = lid + c * 64u;
        if (r < p.rank) {
            lat[r] = acc[c] / l;
        }
    }
    workgroupBarrier();
    let v_base = w_base + p.nope * p.rank;
    for (var j = lid; j < p.v_dim; j += 64u) {
        var a = 0.0;
        for (var r = 0u; r < p.rank; r++) {
            a += kv_b[v_base + j * p.rank + r] * lat[r];
        }
        out[(t * p.n_heads + h) * p.v_dim + j] = a;
    }
}
