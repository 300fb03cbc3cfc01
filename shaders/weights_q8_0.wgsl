// Q8_0: 32 values per 34-byte block: f16 d, then 32 signed bytes; value = q * d.
const BLOCK: u32 = 32u;
const TYPE_SIZE: u32 = 34u;

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    return i8_at(b + 2u + col % BLOCK) * f16_at(b);
}

// Weights (row, 8*k8 .. 8*k8+7): the k8's eight bytes as two words (bytes8_at) and d once,
// each value as w_at computes it.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let c = k8 * 8u;
    let b = block_at(m, row, c);
    let codes = bytes8_at(b + 2u + c % BLOCK);
    let d = f16_at(b);
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        v[j] = i8_of(byte_of(codes, j)) * d;
    }
    return w8_of(v);
}
