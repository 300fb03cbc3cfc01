// Q4_0: 32 values per 18-byte block: f16 d, then 16 bytes whose low nibbles are values 0..15
// and high nibbles values 16..31; value = (q - 8) * d.
const BLOCK: u32 = 32u;
const TYPE_SIZE: u32 = 18u;

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    let i = col % BLOCK;
    let q = (byte_at(b + 2u + i % 16u) >> (4u * (i / 16u))) & 15u;
    return f16_at(b) * (f32(q) - 8.0);
}

// Weights (row, 8*k8 .. 8*k8+7): the k8's eight code bytes as two words (bytes8_at) and d once,
// each value as w_at computes it.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let c = k8 * 8u;
    let b = block_at(m, row, c);
    let i = c % BLOCK;
    let codes = bytes8_at(b + 2u + i % 16u);
    let d = f16_at(b);
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        let q = (byte_of(codes, j) >> (4u * (i / 16u))) & 15u;
        v[j] = d * (f32(q) - 8.0);
    }
    return w8_of(v);
}
