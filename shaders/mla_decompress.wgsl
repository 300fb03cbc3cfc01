// The decompressed MLA cache's store: for each of the step's tokens t and heads h, the key row
// [W_UK[h] c_t | kr_t] and the value row W_UV[h] c_t, from the normalised latent c [tokens,
// rank] and the rotated rotary key kr [tokens, rope] (kv_b [heads * (nope + v), rank] f32:
// W_UK[h] its rows h*(nope+v) .. +nope, W_UV[h] the next v), written at position step.pos + t of
// k_cache [heads, context, nope + rope] and v_cache [heads, context, v] (transformers'
// DeepseekV2Attention keys and values, which mla_attention's DECOMPRESSED variant reads). F16:
// two halves per u32. One workgroup per (token, head); nope and v even, rank <= 512.
//#include common

struct Params {
    n_heads: u32,
    rank: u32,
    nope: u32,
    rope: u32,
    v_dim: u32,
    context: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> c: array<f32>;
@group(0) @binding(3) var<storage, read> kr: array<f32>;
@group(0) @binding(4) var<storage, read> kv_b: array<f32>;
//#if F16
@group(0) @binding(5) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<u32>;
//#else
@group(0) @binding(5) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<f32>;
//#endif

var<workgroup> lat: array<f32, 512>;

// Row `row` of kv_b times the token's latent.
fn up(row: u32) -> f32 {
    var a = 0.0;
    for (var r = 0u; r < p.rank; r++) {
        a += kv_b[row * p.rank + r] * lat[r];
    }
    return a;
}

// Element d of token t's key for the head whose kv_b rows start at row0.
fn key(t: u32, row0: u32, d: u32) -> f32 {
    if (d < p.nope) {
        return up(row0 + d);
    }
    return kr[t * p.rope + d - p.nope];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let t = g / p.n_heads;
    let h = g % p.n_heads;
    if (t >= step.n_tokens) {
        return;
    }
    for (var r = lid; r < p.rank; r += 64u) {
        lat[r] = c[t * p.rank + r];
    }
    workgroupBarrier();
    let row0 = h * (p.nope + p.v_dim);
    let k_dim = p.nope + p.rope;
    let k_row = (h * p.context + step.pos + t) * k_dim;
    for (var i = lid; i < k_dim / 2u; i += 64u) {
        let pair = vec2<f32>(key(t, row0, 2u * i), key(t, row0, 2u * i + 1u));
//#if F16
        k_cache[k_row / 2u + i] = pack2x16float(pair);
//#else
        k_cache[k_row + 2u * i] = pair.x;
        k_cache[k_row + 2u * i + 1u] = pair.y;
//#endif
    }
    let v_row = (h * p.context + step.pos + t) * p.v_dim;
    for (var i = lid; i < p.v_dim / 2u; i += 64u) {
        let pair = vec2<f32>(up(row0 + p.nope + 2u * i), up(row0 + p.nope + 2u * i + 1u));
//#if F16
        v_cache[v_row / 2u + i] = pack2x16float(pair);
//#else
        v_cache[v_row + 2u * i] = pair.x;
        v_cache[v_row + 2u * i + 1u] = pair.y;
//#endif
    }
}
