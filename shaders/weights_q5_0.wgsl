// Q5_0: 32 values per 22-byte block: f16 d, the 32 fifth bits (little-endian u32 at byte 2),
// then 16 bytes whose low nibbles are values 0..15 and high nibbles 16..31;
// value = d * ((q | fifth bit << 4) - 16). With GGML_Q5_1, Q5_1: 24-byte blocks, f16 d and m,
// the fifth bits at byte 4, the codes at 8; value = d * (q | fifth bit << 4) + m.
const BLOCK: u32 = 32u;
//#if GGML_Q5_1
const TYPE_SIZE: u32 = 24u;
const QH: u32 = 4u;
//#else
const TYPE_SIZE: u32 = 22u;
const QH: u32 = 2u;
//#endif
const QS: u32 = QH + 4u;

// The value of 5-bit code `q` in the block at byte `b`.
fn q5_value(b: u32, q: u32) -> f32 {
//#if GGML_Q5_1
    return f16_at(b) * f32(q) + f16_at(b + 2u);
//#else
    return f16_at(b) * (f32(q) - 16.0);
//#endif
}

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    let i = col % BLOCK;
    let high = (byte_at(b + QH + i / 8u) >> (i % 8u)) & 1u;
    let q = ((byte_at(b + QS + i % 16u) >> (4u * (i / 16u))) & 15u) | (high << 4u);
    return q5_value(b, q);
}

// Weights (row, 8*k8 .. 8*k8+7): the k8's eight code bytes as two words (bytes8_at) and its
// byte of fifth bits once, each value as w_at computes it.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let c = k8 * 8u;
    let b = block_at(m, row, c);
    let i = c % BLOCK;
    let codes = bytes8_at(b + QS + i % 16u);
    let high = byte_at(b + QH + i / 8u);
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        let q = ((byte_of(codes, j) >> (4u * (i / 16u))) & 15u) | (((high >> j) & 1u) << 4u);
        v[j] = q5_value(b, q);
    }
    return w8_of(v);
}
