// Q8_0: 32 values per 34-byte block: f16 d, then 32 signed bytes; value = q * d. With
// GGML_Q8_0_PADDED (`WeightFormat::Padded`) each block is 36 bytes, two zero bytes after d, so
// that every block, its d and its codes start on a word.
const BLOCK: u32 = 32u;
//#if GGML_Q8_0_PADDED
const TYPE_SIZE: u32 = 36u;
const QS: u32 = 4u;
//#else
const TYPE_SIZE: u32 = 34u;
const QS: u32 = 2u;
//#endif

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    return i8_at(b + QS + col % BLOCK) * f16_at(b);
}

// Weights (row, 8*k8 .. 8*k8+7): the k8's eight bytes as two words (bytes8_at) and d once,
// each value as w_at computes it.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let c = k8 * 8u;
    let b = block_at(m, row, c);
    let codes = bytes8_at(b + QS + c % BLOCK);
    let d = f16_at(b);
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        v[j] = i8_of(byte_of(codes, j)) * d;
    }
    return w8_of(v);
}

//#if WIDE
// WIDE (weights_ggml_wide; padded blocks only): a group of 32 values, one block, in nine word
// loads: d, then its codes four to a word.
struct WideGroup {
    d: f32,
    codes: array<u32, 8>,
}

fn wide_group(m: WMat, row: u32, grp: u32) -> WideGroup {
    let i = block_at(m, row, grp * 32u) / 4u;
    let codes = array<u32, 8>(w[i + 1u], w[i + 2u], w[i + 3u], w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u], w[i + 8u]);
    return WideGroup(unpack2x16float(w[i]).x, codes);
}

// Two blocks share nothing but their row.
fn wide_pair(m: WMat, row: u32, pair_i: u32) -> array<WideGroup, 2> {
    return array<WideGroup, 2>(wide_group(m, row, 2u * pair_i), wide_group(m, row, 2u * pair_i + 1u));
}

// The four signed bytes of `word`, lowest first.
fn i8x4_of(word: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

fn wide_values8(k: WideGroup, c: u32) -> W8 {
    return W8(i8x4_of(k.codes[2u * c]) * k.d, i8x4_of(k.codes[2u * c + 1u]) * k.d);
}
//#endif
