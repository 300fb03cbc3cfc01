// Writes the step's keys and values (f32 rows [n_tokens, kv_width], after RoPE and norms) into
// one chunk of a sequence's KV cache at positions step.pos.. . A chunk holds a run of KV heads,
// head-major: element (head h of the chunk, position j, dim d) at (h * context + j) * head_dim + d.
// F16: two halves per u32 (pack2x16float, so no SHADER_F16 feature is needed). One invocation
// per (token, head, pair of dims).
//#include common

struct Params {
    kv_width: u32,
    head_dim: u32,
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

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let pairs = p.head_dim / 2u;
    let i = group_index(wid, nwg) * 64u + lid;
    if (i >= step.n_tokens * p.chunk_heads * pairs) {
        return;
    }
    let pair = i % pairs;
    let h = (i / pairs) % p.chunk_heads;
    let t = i / (pairs * p.chunk_heads);
    let src = t * p.kv_width + (p.kv_head0 + h) * p.head_dim + 2u * pair;
    let dst = (h * p.context + step.pos + t) * pairs + pair;
//#if F16
    k_cache[dst] = pack2x16float(vec2<f32>(k[src], k[src + 1u]));
    v_cache[dst] = pack2x16float(vec2<f32>(v[src], v[src + 1u]));
//#else
    k_cache[2u * dst] = k[src];
    k_cache[2u * dst + 1u] = k[src + 1u];
    v_cache[2u * dst] = v[src];
    v_cache[2u * dst + 1u] = v[src + 1u];
//#endif
}
