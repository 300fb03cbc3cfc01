// Writes the step's keys and values (f32 rows [n_tokens, n_kv_heads * k_dim] and
// [n_tokens, n_kv_heads * v_dim], after norms) into one chunk of a sequence's cache at
// positions step.pos.. . A chunk holds a run of KV heads, head-major: element (head h of the
// chunk, position j, dim d) at (h * context + j) * dim + d. Keys and values have the same width
// for grouped attention; MLA stores its latent as the "keys" and its rotary key as the "values"
// (one head each, of different widths). F16: two halves per u32 (pack2x16float, so no
// SHADER_F16 feature is needed). One invocation per (token, head, pair of dims of the wider).
// ROPE (grouped attention): the layer's RoPE in the same dispatch, value for value as the rope
// kernel computes it: keys are rotated as they are stored (each dim from its pair's two values)
// and the query heads of the chunk's KV heads rotated in place in `q`, by further invocations
// per (token, query head, pair).
// RING (a sliding-window layer keeping its window and a step): position j goes to row
// j % context.
// Q8 (q8_0, KvDtype::Q8_0, layout quant::kv_dtype::Q8Rows): every row's int8 codes, then every
// row's f16 scales, a row's scales filling whole words; one invocation per (token, head, scale
// word of the wider row): the word's blocks (two, or a row's only one) of keys and of values,
// each block's scale max |x| / 127 and codes round(x / scale), halves away from zero. Q4 (with
// Q8: q4_0, KvDtype::Q4_0, the same layout with 4-bit codes): scale max |x| / 7, each code plus 8
// in a nibble, eight to a word (dim d's in bits 4 * (d % 8)).
//#include common

struct Params {
    n_kv_heads: u32,
    k_dim: u32,
    v_dim: u32,
    kv_head0: u32,
    chunk_heads: u32,
    context: u32,
    // Q8: values per block and scales per word of key and of value rows.
    k_block: u32,
    k_spw: u32,
    v_block: u32,
    v_spw: u32,
//#if ROPE
    // ROPE: the rotary width (from each head's first value) and pair layout, and the layout of
    // the chunk's query heads in `q` (the first one's offset folded into `offset`).
    rotary_dim: u32,
    interleaved: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
    pad3: u32,
    q_layout: Layout,
//#endif
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
//#if F16
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;
//#else
//#if Q8
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;
//#else
@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>;
//#endif
//#endif
//#if ROPE
@group(0) @binding(6) var<storage, read> cos_table: array<f32>;
@group(0) @binding(7) var<storage, read> sin_table: array<f32>;
@group(0) @binding(8) var<storage, read_write> q: array<f32>;

//#include rope_pairs
//#endif

// Dim `d` of the key head starting at `base` of token t, as cached: under ROPE rotated with
// its pair's other value.
fn key_at(base: u32, d: u32, t: u32) -> f32 {
//#if ROPE
    if (d < p.rotary_dim) {
        let half_dim = p.rotary_dim / 2u;
        var j = d % half_dim;
        var first = d < half_dim;
        var other = select(d - half_dim, d + half_dim, first);
        if (p.interleaved == 1u) {
            j = d / 2u;
            first = d % 2u == 0u;
            other = select(d - 1u, d + 1u, first);
        }
        let cs = angle(step.pos + t, j);
        if (first) {
            return rotated(cs.x, cs.y, k[base + d], k[base + other]).x;
        }
        return rotated(cs.x, cs.y, k[base + other], k[base + d]).y;
    }
//#endif
    return k[base + d];
}

// The cache row of token t of the step (of head 0 of the chunk).
fn cache_row(t: u32) -> u32 {
//#if RING
    return (step.pos + t) % p.context;
//#else
    return step.pos + t;
//#endif
}

//#if Q8
//#if Q4
const CODE_TOP: f32 = 7.0;
const CODES_PER_WORD: u32 = 8u;
//#else
const CODE_TOP: f32 = 127.0;
const CODES_PER_WORD: u32 = 4u;
//#endif

// Dim d of the key (`is_key`, as cached) or value head starting at `base` of token t.
fn input_at(is_key: bool, base: u32, d: u32, t: u32) -> f32 {
    if (is_key) {
        return key_at(base, d, t);
    }
    return v[base + d];
}

// A block's scale: max |x| / CODE_TOP over its `len` values from dim `d0` (keys or values).
fn block_scale(is_key: bool, base: u32, d0: u32, len: u32, t: u32) -> f32 {
    var amax = 0.0;
    for (var d = d0; d < d0 + len; d++) {
        amax = max(amax, abs(input_at(is_key, base, d, t)));
    }
    return amax / CODE_TOP;
}

// The codes of dims d .. d + CODES_PER_WORD at `inv` = 1 / scale: one byte each (two's
// complement), or (Q4) a nibble each, the code plus 8.
fn code_word(is_key: bool, base: u32, d: u32, t: u32, inv: f32) -> u32 {
    var w = 0u;
    for (var i = 0u; i < CODES_PER_WORD; i++) {
        let x = input_at(is_key, base, d + i, t) * inv;
        let c = i32(min(floor(abs(x) + 0.5), CODE_TOP)) * select(1, -1, x < 0.0);
//#if Q4
        w |= (u32(c + 8) & 0xfu) << (4u * i);
//#else
        w |= (bitcast<u32>(c) & 0xffu) << (8u * i);
//#endif
    }
    return w;
}

// Quantizes scale word `u` of the key (`is_key`) or value row of head h of token t: the
// codes of its blocks (two, or the row's only one) and their scales.
fn store_q8(is_key: bool, t: u32, h: u32, u: u32) {
    let dim = select(p.v_dim, p.k_dim, is_key);
    let block = select(p.v_block, p.k_block, is_key);
    let spw = select(p.v_spw, p.k_spw, is_key);
    let base = (t * p.n_kv_heads + p.kv_head0 + h) * dim;
    let row = h * p.context + cache_row(t);
    var scales = 0u;
    for (var b = 0u; b < spw; b++) {
        let d0 = (u * spw + b) * block;
        let scale = block_scale(is_key, base, d0, block, t);
        let inv = select(0.0, 1.0 / scale, scale > 0.0);
        for (var d = d0; d < d0 + block; d += CODES_PER_WORD) {
            let w = code_word(is_key, base, d, t, inv);
            if (is_key) {
                k_cache[(row * dim + d) / CODES_PER_WORD] = w;
            } else {
                v_cache[(row * dim + d) / CODES_PER_WORD] = w;
            }
        }
        scales |= (pack2x16float(vec2<f32>(scale, 0.0)) & 0xffffu) << (16u * b);
    }
    // After every row's codes, each row's scale words.
    let at = p.chunk_heads * p.context * dim / CODES_PER_WORD + row * (dim / block / spw) + u;
    if (is_key) {
        k_cache[at] = scales;
    } else {
        v_cache[at] = scales;
    }
}
//#else
// Stores pair `pair` of key head `h` (of the chunk) of token `t`; `store_v` the same for values.
fn store_k(t: u32, h: u32, pair: u32) {
    let pairs = p.k_dim / 2u;
    let base = (t * p.n_kv_heads + p.kv_head0 + h) * p.k_dim;
    let dst = (h * p.context + cache_row(t)) * pairs + pair;
    let k0 = key_at(base, 2u * pair, t);
    let k1 = key_at(base, 2u * pair + 1u, t);
//#if F16
    k_cache[dst] = pack2x16float(vec2<f32>(k0, k1));
//#else
    k_cache[2u * dst] = k0;
    k_cache[2u * dst + 1u] = k1;
//#endif
}

fn store_v(t: u32, h: u32, pair: u32) {
    let pairs = p.v_dim / 2u;
    let src = (t * p.n_kv_heads + p.kv_head0 + h) * p.v_dim + 2u * pair;
    let dst = (h * p.context + cache_row(t)) * pairs + pair;
//#if F16
    v_cache[dst] = pack2x16float(vec2<f32>(v[src], v[src + 1u]));
//#else
    v_cache[2u * dst] = v[src];
    v_cache[2u * dst + 1u] = v[src + 1u];
//#endif
}
//#endif

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
//#if Q8
    // Scale words of the wider row: the units of a (token, head).
    let pairs = max(p.k_dim / p.k_block / p.k_spw, p.v_dim / p.v_block / p.v_spw);
//#else
    let pairs = max(p.k_dim, p.v_dim) / 2u;
//#endif
    let i = group_index(wid, nwg) * 64u + lid;
    let stores = step.n_tokens * p.chunk_heads * pairs;
    if (i >= stores) {
//#if ROPE
        if (i - stores < step.n_tokens * p.q_layout.n_heads * (p.rotary_dim / 2u)) {
            let qp = pair_at(p.q_layout, i - stores);
            let r = rotated(qp.c, qp.s, q[qp.a], q[qp.b]);
            q[qp.a] = r.x;
            q[qp.b] = r.y;
        }
//#endif
        return;
    }
    let pair = i % pairs;
    let h = (i / pairs) % p.chunk_heads;
    let t = i / (pairs * p.chunk_heads);
//#if Q8
    if (pair < p.k_dim / p.k_block / p.k_spw) {
        store_q8(true, t, h, pair);
    }
    if (pair < p.v_dim / p.v_block / p.v_spw) {
        store_q8(false, t, h, pair);
    }
//#else
    if (pair < p.k_dim / 2u) {
        store_k(t, h, pair);
    }
    if (pair < p.v_dim / 2u) {
        store_v(t, h, pair);
    }
//#endif
}
