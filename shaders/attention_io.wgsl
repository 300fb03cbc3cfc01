// Shared by the grouped-attention kernels (attention, attention_keys): parameters, bindings,
// the cache's 8-dim chunks, the query slots a workgroup takes, and the output of one slot.
//
// A slot set is hs = min(group, QT) query heads of one KV head; a workgroup (or, on GPUs, a team)
// takes one. Without SPLIT: QT / hs consecutive tokens of them, normalised output. With SPLIT
// (decode, one token): one set per split of split_len keys, writing each head's partial (max,
// sum, unnormalised accumulator) for attention_merge.
//
// SINKS (gpt-oss): each query head has a learned logit that joins the softmax denominator and
// no value (transformers' eager_attention_forward concatenates it to the scores, softmaxes and
// drops it). The single pass applies it here, the split pass leaves it to attention_merge.

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
    // Q8: 8-dim chunks per block and scales per word of the cache's rows.
    q8_chunks_per_block: u32,
    q8_scales_per_word: u32,
}

//#include words16

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
//#if Q8
//#if Q4
// Q4 (q4_0): the cache in 4-byte loads: each row's 4-bit codes (a chunk's eight in one load),
// then each row's f16 scales (Q8Rows; two to a load).
@group(0) @binding(3) var<storage, read> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read> v_cache: array<u32>;
//#else
// The cache in 8-byte loads: each row's int8 codes (a chunk's eight in one load), then each
// row's f16 scales (Q8Rows; four to a load).
@group(0) @binding(3) var<storage, read> k_cache: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> v_cache: array<vec2<u32>>;
//#endif
//#else
// The cache in 16-byte loads (words16): eight f16 values or four f32 ones.
@group(0) @binding(3) var<storage, read> k_cache: array<Words16>;
@group(0) @binding(4) var<storage, read> v_cache: array<Words16>;
//#endif
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
//#if SINKS
@group(0) @binding(6) var<storage, read> sinks: array<f32>;
//#endif

// Query slots of a team: 4, or (the split pass of a model with fewer than 4 query heads per KV
// head, whose one token cannot fill the others) QT2 / QT1.
//#if QT2
const QT: u32 = 2u;
//#else
//#if QT1
const QT: u32 = 1u;
//#else
const QT: u32 = 4u;
//#endif
//#endif

// Eight consecutive dims.
struct Chunk {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// One value per query slot.
alias Slots = array<f32, QT>;

// The row of position j in the cache of KV head 0 of the chunk: RING (a sliding-window layer
// keeping its window and a step) wraps positions around the `context` rows.
fn cache_row(j: u32) -> u32 {
//#if RING
    return j % p.context;
//#else
    return j;
//#endif
}

// Chunk c of cache row r (of every KV head of the chunk, head-major), before its scale
// (`k_scale`: 1 but for q8_0 codes, whose block scale multiplies their dot products and
// weights, not each value).
fn k_chunk(r: u32, c: u32) -> Chunk {
    let i = r * (p.head_dim / 8u) + c;
//#if F16
    return f16_chunk(words_of(k_cache[i]));
//#else
//#if Q8
    return q8_chunk(k_cache[i]);
//#else
    return f32_chunk(words_of(k_cache[2u * i]), words_of(k_cache[2u * i + 1u]));
//#endif
//#endif
}

fn v_chunk(r: u32, c: u32) -> Chunk {
    let i = r * (p.head_dim / 8u) + c;
//#if F16
    return f16_chunk(words_of(v_cache[i]));
//#else
//#if Q8
    return q8_chunk(v_cache[i]);
//#else
    return f32_chunk(words_of(v_cache[2u * i]), words_of(v_cache[2u * i + 1u]));
//#endif
//#endif
}

// The scale of chunk c of cache row r's keys (1 but for q8_0).
fn k_scale(r: u32, c: u32) -> f32 {
//#if Q8
    let s = q8_scale(r, c);
    return unpack2x16float(scale_word(k_cache[s.x], s.y))[s.z];
//#else
    return 1.0;
//#endif
}

fn v_scale(r: u32, c: u32) -> f32 {
//#if Q8
    let s = q8_scale(r, c);
    return unpack2x16float(scale_word(v_cache[s.x], s.y))[s.z];
//#else
    return 1.0;
//#endif
}

//#if Q8
// Where the scale of chunk c of row r is: its 8-byte load (after every row's codes), word and
// half. A row's scales fill whole words (Q8Rows); Q8_B32 (blocks of 32, two scales a word: head
// dims that are multiples of 64) by shifts, so a row's chunks of one block share one load.
fn q8_scale(r: u32, c: u32) -> vec3<u32> {
//#if Q8_B32
    let word = r * (p.head_dim / 64u) + (c >> 3u);
    let half = (c >> 2u) & 1u;
//#else
    let block = (r * (p.head_dim / 8u) + c) / p.q8_chunks_per_block;
    let word = block / p.q8_scales_per_word;
    let half = block % p.q8_scales_per_word;
//#endif
    // Loads of every row's codes: a chunk each.
    let codes = p.chunk_heads * p.context * p.head_dim / 8u;
//#if Q4
    return vec3<u32>(codes + word, 0u, half);
//#else
    return vec3<u32>(codes + word / 2u, word % 2u, half);
//#endif
}

//#if Q4
// Word `i` (0) of a 4-byte load.
fn scale_word(load: u32, i: u32) -> u32 {
    return load;
}

// Eight 4-bit codes (each plus 8; dim d in bits 4 * d).
fn q8_chunk(codes: u32) -> Chunk {
    let lo = vec4<u32>(codes, codes >> 4u, codes >> 8u, codes >> 12u) & vec4<u32>(0xfu);
    let hi = vec4<u32>(codes >> 16u, codes >> 20u, codes >> 24u, codes >> 28u) & vec4<u32>(0xfu);
    return Chunk(vec4<f32>(lo) - 8.0, vec4<f32>(hi) - 8.0);
}
//#else
// Word `i` of an 8-byte load.
fn scale_word(load: vec2<u32>, i: u32) -> u32 {
    return load[i];
}

// Eight int8 codes.
fn q8_chunk(codes: vec2<u32>) -> Chunk {
    return Chunk(i8x4(codes.x), i8x4(codes.y));
}
//#endif

// Four int8 codes of a word (byte 0 first) as f32.
fn i8x4(w: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xI8(w));
}
//#endif

// Eight f16 values packed in four words.
fn f16_chunk(w: vec4<u32>) -> Chunk {
    return Chunk(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));
}

// Eight f32 values, four in each of `lo` and `hi`.
fn f32_chunk(lo: vec4<u32>, hi: vec4<u32>) -> Chunk {
    return Chunk(bitcast<vec4<f32>>(lo), bitcast<vec4<f32>>(hi));
}

// Chunk c of query row `row`, times `w`.
fn q_chunk(row: u32, c: u32, w: f32) -> Chunk {
    let qi = (row * (p.head_dim / 8u) + c) * 2u;
    return Chunk(q[qi] * w, q[qi + 1u] * w);
}

// Whether token block `block` (of QT / hs tokens) starts past the step's last token (a workgroup
// of a grid folded over the per-dimension limit); never in the split pass, whose one token every
// split serves.
fn past_last_token(block: u32, hs: u32) -> bool {
//#if SPLIT
    return false;
//#else
    return block * (QT / hs) >= step.n_tokens;
//#endif
}

// The query slots of slot set `set_index` (of `n_sets`) in token block or split
// `block`. Slot s: token t0 + s / hs, query head heads[s]; it sees keys starts[s] .. ends[s]; the
// workgroup walks keys first .. end (the same for every team of a workgroup).
struct SlotSet {
    valid: array<bool, QT>,
    heads: array<u32, QT>,
    rows: array<u32, QT>,
    starts: array<u32, QT>,
    ends: array<u32, QT>,
    kv_local: u32,
    first: u32,
    end: u32,
}

fn slots_of(block: u32, set_index: u32, n_sets: u32, sets: u32, hs: u32) -> SlotSet {
    var o: SlotSet;
    o.kv_local = min(set_index / sets, p.chunk_heads - 1u);
    let head0 = o.kv_local * p.group + (set_index % sets) * hs;
    // Query heads of this set (none for a team past the last set).
    let nh = select(0u, min(hs, p.group - (set_index % sets) * hs), set_index < n_sets);
//#if SPLIT
    let t0 = 0u;
    let nt = 1u;
    let split_first = block * p.split_len;
//#else
    let t0 = block * (QT / hs);
    let nt = min(QT / hs, step.n_tokens - t0);
//#endif
    for (var s = 0u; s < QT; s++) {
        o.valid[s] = s % hs < nh && s / hs < nt;
        o.heads[s] = p.kv_head0 * p.group + head0 + s % hs;
        o.rows[s] = select(0u, (t0 + s / hs) * p.n_heads + o.heads[s], o.valid[s]);
        let causal_end = step.pos + t0 + s / hs + 1u;
        o.starts[s] = 0u;
        if (p.window > 0u) {
            o.starts[s] = max(causal_end, p.window) - p.window;
        }
        o.ends[s] = select(0u, causal_end, o.valid[s]);
//#if SPLIT
        o.ends[s] = min(o.ends[s], split_first + p.split_len);
//#endif
    }
    o.first = 0u;
    if (p.window > 0u) {
        o.first = max(step.pos + t0 + 1u, p.window) - p.window;
    }
    o.end = step.pos + t0 + nt;
//#if SPLIT
    o.first = max(o.first, split_first);
    o.end = min(o.end, split_first + p.split_len);
//#endif
    return o;
}

// Where a slot's result goes and the factor it is written with.
struct SlotOut {
    base: u32,
    w: f32,
}

// The output of slot `s` of `slots` in split `block` with softmax max `m` and sum `l`: SPLIT writes
// the partial's (max, sum) header from lane 0 and leaves the accumulator unnormalised.
fn slot_out(slots: SlotSet, s: u32, block: u32, lane: u32, m: f32, l: f32) -> SlotOut {
//#if SPLIT
    let base = (block * p.n_heads + slots.heads[s]) * (p.head_dim + 2u);
    if (lane == 0u) {
        out[base] = m;
        out[base + 1u] = l;
    }
    return SlotOut(base + 2u, 1.0);
//#else
//#if SINKS
    // Rescaled to the larger of the keys' max and the sink, as a softmax over both.
    let sink = sinks[slots.heads[s]];
    let m_all = max(m, sink);
    return SlotOut(slots.rows[s] * p.head_dim, exp(m - m_all) / (l * exp(m - m_all) + exp(sink - m_all)));
//#else
    return SlotOut(slots.rows[s] * p.head_dim, 1.0 / l);
//#endif
//#endif
}

// Writes dims 8c .. 8c + 8 of a slot's result.
fn store_chunk(o: SlotOut, c: u32, a: Chunk) {
    let d = o.base + 8u * c;
    out[d] = a.lo.x * o.w;
    out[d + 1u] = a.lo.y * o.w;
    out[d + 2u] = a.lo.z * o.w;
    out[d + 3u] = a.lo.w * o.w;
    out[d + 4u] = a.hi.x * o.w;
    out[d + 5u] = a.hi.y * o.w;
    out[d + 6u] = a.hi.z * o.w;
    out[d + 7u] = a.hi.w * o.w;
}
