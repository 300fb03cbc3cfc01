// Writes the step's keys and values (f32 rows [n_tokens, n_kv_heads * k_dim] and
// [n_tokens, n_kv_heads * v_dim], after RoPE and norms) into one chunk of a sequence's cache at
// positions step.pos.. . A chunk holds a run of KV heads, head-major: element (head h of the
// chunk, position j, dim d) at (h * context + j) * dim + d. Keys and values have the same width
// for grouped attention; MLA stores its latent as the "keys" and its rotary key as the "values"
// (one head each, of different widths). F16: two halves per u32 (pack2x16float, so no
// SHADER_F16 feature is needed). One invocation per (token, head, pair of dims of the wider).
//#include common

struct Params {
    n_kv_heads: u32,
    k_dim: u32,
    v_dim: u32,
    kv_head0: u32,
    chunk_heads: u32,
    context: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
//#if F16
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;
//#else
@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>;
//#endif

// Stores pair `pair` of key head `h` (of the chunk) of token `t`; `store_v` the same for values.
fn store_k(t: u32, h: u32, pair: u32) {
    let pairs = p.k_dim / 2u;
    let src = (t * p.n_kv_heads + p.kv_head0 + h) * p.k_dim + 2u * pair;
    let dst = (h * p.context + step.pos + t) * pairs + pair;
//#if F16
    k_cache[dst] = pack2x16float(vec2<f32>(k[src], k[src + 1u]));
//#else
    k_cache[2u * dst] = k[src];
    k_cache[2u * dst + 1u] = k[src + 1u];
//#endif
}

fn store_v(t: u32, h: u32, pair: u32) {
    let pairs = p.v_dim / 2u;
    let src = (t * p.n_kv_heads + p.kv_head0 + h) * p.v_dim + 2u * pair;
    let dst = (h * p.context + step.pos + t) * pairs + pair;
//#if F16
    v_cache[dst] = pack2x16float(vec2<f32>(v[src], v[src + 1u]));
//#else
    v_cache[2u * dst] = v[src];
    v_cache[2u * dst + 1u] = v[src + 1u];
//#endif
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let pairs = max(p.k_dim, p.v_dim) / 2u;
    let i = group_index(wid, nwg) * 64u + lid;
    if (i >= step.n_tokens * p.chunk_heads * pairs) {
        return;
    }
    let pair = i % pairs;
    let h = (i / pairs) % p.chunk_heads;
    let t = i / (pairs * p.chunk_heads);
    if (pair < p.k_dim / 2u) {
        store_k(t, h, pair);
    }
    if (pair < p.v_dim / 2u) {
        store_v(t, h, pair);
    }
}
