// Q4_K (144-byte blocks) and, with GGML_Q5_K, Q5_K (176 bytes): 256 values in 8 sub-blocks of
// 32. f16 d and dmin, 12 bytes packing a 6-bit scale and min per sub-block, (Q5_K: 32 bytes of
// fifth bits, bit s of byte i for value 32s + i), then 128 bytes of nibbles: sub-blocks 2c and
// 2c+1 share bytes 32c..32c+31 (low, high nibble). value = (d * scale) * q - dmin * min.
const BLOCK: u32 = 256u;
//#if GGML_Q5_K
const TYPE_SIZE: u32 = 176u;
const QS: u32 = 48u;
//#else
const TYPE_SIZE: u32 = 144u;
const QS: u32 = 16u;
//#endif

// (scale, min) of sub-block j of the block at byte b.
fn k_scale_min(b: u32, j: u32) -> vec2<f32> {
    let s = b + 4u;
    if j < 4u {
        return vec2<f32>(f32(byte_at(s + j) & 63u), f32(byte_at(s + j + 4u) & 63u));
    }
    let hi = byte_at(s + j + 4u);
    let sc = (hi & 15u) | ((byte_at(s + j - 4u) >> 6u) << 4u);
    let mn = (hi >> 4u) | ((byte_at(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(mn));
}

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    let i = col % BLOCK;
    let sub = i / 32u;
    var q = (byte_at(b + QS + (sub / 2u) * 32u + i % 32u) >> (4u * (sub % 2u))) & 15u;
//#if GGML_Q5_K
    q = q | (((byte_at(b + 16u + i % 32u) >> sub) & 1u) << 4u);
//#endif
    let sm = k_scale_min(b, sub);
    return (f16_at(b) * sm.x) * f32(q) - f16_at(b + 2u) * sm.y;
}

// Byte k (0..11) of the block's packed scales and mins, held in three words.
fn scale_byte(sw: vec3<u32>, k: u32) -> u32 {
    return (sw[k / 4u] >> (8u * (k % 4u))) & 255u;
}

// k_scale_min from the packed bytes held in words.
fn k_scale_min_words(sw: vec3<u32>, j: u32) -> vec2<f32> {
    if j < 4u {
        return vec2<f32>(f32(scale_byte(sw, j) & 63u), f32(scale_byte(sw, j + 4u) & 63u));
    }
    let hi = scale_byte(sw, j + 4u);
    let sc = (hi & 15u) | ((scale_byte(sw, j - 4u) >> 6u) << 4u);
    let mn = (hi >> 4u) | ((scale_byte(sw, j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(mn));
}

// Weights (row, 8*k8 .. 8*k8+7), one sub-block's: the block's first 16 bytes (d, dmin and the
// packed scales) and the k8's eight code bytes (and Q5_K's fifth bits) read as words
// (bytes8_at), each value as w_at computes it.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let c = k8 * 8u;
    let b = block_at(m, row, c);
    let i = c % BLOCK;
    let sub = i / 32u;
    let head = bytes8_at(b);
    let tail = bytes8_at(b + 8u);
    let d = unpack2x16float(head.x);
    let sm = k_scale_min_words(vec3<u32>(head.y, tail.x, tail.y), sub);
    let scale = d.x * sm.x;
    let offset = d.y * sm.y;
    let codes = bytes8_at(b + QS + (sub / 2u) * 32u + i % 32u);
//#if GGML_Q5_K
    let fifth = bytes8_at(b + 16u + i % 32u);
//#endif
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        var q = (byte_of(codes, j) >> (4u * (sub % 2u))) & 15u;
//#if GGML_Q5_K
        q = q | (((byte_of(fifth, j) >> sub) & 1u) << 4u);
//#endif
        v[j] = scale * f32(q) - offset;
    }
    return w8_of(v);
}

//#if WIDE
// WIDE (weights_ggml_wide; the launcher: Q4_K and Q5_K matrices starting on 16 bytes, so every
// block does): a sub-block pair's 32 code bytes are two 16-byte loads from `w4` (Q5_K: its 32
// fifth-bit bytes two more), and the block's head (d, dmin and the packed scales) four words
// from `w`.

// A block's head, the 32 code bytes of the sub-block pair holding sub-block `sub` (low nibbles:
// the even sub-block, high: the odd one), Q5_K's fifth bits, and `sub`.
struct WideGroup {
    head: vec4<u32>,
    q0: vec4<u32>,
    q1: vec4<u32>,
//#if GGML_Q5_K
    h0: vec4<u32>,
    h1: vec4<u32>,
//#endif
    sub: u32,
}

fn wide_group(m: WMat, row: u32, grp: u32) -> WideGroup {
    let blk = block_at(m, row, grp * 32u);
    let sub = grp % 8u;
    let q = (blk + QS + (sub / 2u) * 32u) / 16u;
    let h = blk / 4u;
    let head = vec4<u32>(w[h], w[h + 1u], w[h + 2u], w[h + 3u]);
//#if GGML_Q5_K
    let f = (blk + 16u) / 16u;
    return WideGroup(head, words_of(w4[q]), words_of(w4[q + 1u]), words_of(w4[f]), words_of(w4[f + 1u]), sub);
//#else
    return WideGroup(head, words_of(w4[q]), words_of(w4[q + 1u]), sub);
//#endif
}

// A pair's two sub-blocks share all their loads.
fn wide_pair(m: WMat, row: u32, pair_i: u32) -> array<WideGroup, 2> {
    let k = wide_group(m, row, 2u * pair_i);
    var odd = k;
    odd.sub = k.sub + 1u;
    return array<WideGroup, 2>(k, odd);
}

fn wide_values8(k: WideGroup, c: u32) -> W8 {
    let d = unpack2x16float(k.head.x);
    let sm = k_scale_min_words(k.head.yzw, k.sub);
    let scale = d.x * sm.x;
    let offset = vec4<f32>(d.y * sm.y);
    let qv = select(k.q1, k.q0, c < 2u);
    let i = (2u * c) % 4u;
    let bytes = vec4<u32>(0u, 8u, 16u, 24u);
    let shifts = bytes + vec4<u32>(4u * (k.sub % 2u));
    var qa = (vec4<u32>(qv[i]) >> shifts) & vec4<u32>(15u);
    var qb = (vec4<u32>(qv[i + 1u]) >> shifts) & vec4<u32>(15u);
//#if GGML_Q5_K
    let hv = select(k.h1, k.h0, c < 2u);
    let fifth = bytes + vec4<u32>(k.sub);
    qa = qa | (((vec4<u32>(hv[i]) >> fifth) & vec4<u32>(1u)) << vec4<u32>(4u));
    qb = qb | (((vec4<u32>(hv[i + 1u]) >> fifth) & vec4<u32>(1u)) << vec4<u32>(4u));
//#endif
    return W8(scale * vec4<f32>(qa) - offset, scale * vec4<f32>(qb) - offset);
}
//#endif
