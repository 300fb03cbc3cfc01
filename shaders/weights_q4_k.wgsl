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

// Weights (row, 8*k8 .. 8*k8+7), one sub-block's: the block's d and dmin in one word, its
// scales in three, the k8's eight code bytes in two (and Q5_K's fifth bits in two more), each
// value as w_at computes it. Matrices not starting on a word are read value by value.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    if ((m.base & 3u) != 0u) {
        return w_load8_by_value(m, row, k8);
    }
    let c = k8 * 8u;
    let b = block_at(m, row, c) >> 2u;
    let i = c % BLOCK;
    let sub = i / 32u;
    let d = unpack2x16float(w[b]);
    let sm = k_scale_min_words(vec3<u32>(w[b + 1u], w[b + 2u], w[b + 3u]), sub);
    let scale = d.x * sm.x;
    let offset = d.y * sm.y;
    let qw = b + QS / 4u + (sub / 2u) * 8u + (i % 32u) / 4u;
    let codes = vec2<u32>(w[qw], w[qw + 1u]);
//#if GGML_Q5_K
    let fifth = vec2<u32>(w[b + 4u + (i % 32u) / 4u], w[b + 5u + (i % 32u) / 4u]);
//#endif
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        let shift = 8u * (j % 4u);
        var q = ((codes[j / 4u] >> shift) >> (4u * (sub % 2u))) & 15u;
//#if GGML_Q5_K
        q = q | ((((fifth[j / 4u] >> shift) >> sub) & 1u) << 4u);
//#endif
        v[j] = scale * f32(q) - offset;
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}
