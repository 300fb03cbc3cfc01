// Q6_K: 256 values per 210-byte block: 128 bytes of low nibbles (ql), 64 bytes of high 2-bit
// pairs (qh), 16 signed 8-bit scales (one per 16 values), f16 d. Value i = 128h + r: low
// nibble r / 64 of ql[64h + r % 64], bits 2(r / 32).. of qh[32h + r % 32];
// value = (d * scale) * (q - 32).
const BLOCK: u32 = 256u;
const TYPE_SIZE: u32 = 210u;

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    let i = col % BLOCK;
    let h = i / 128u;
    let r = i % 128u;
    let lo = (byte_at(b + h * 64u + r % 64u) >> (4u * (r / 64u))) & 15u;
    let hi = (byte_at(b + 128u + h * 32u + r % 32u) >> (2u * (r / 32u))) & 3u;
    let q = f32(lo | (hi << 4u)) - 32.0;
    return (f16_at(b + 208u) * i8_at(b + 192u + i / 16u)) * q;
}

// Weights (row, 8*k8 .. 8*k8+7): the k8's eight low-nibble bytes and eight high-pair bytes,
// each read as two words (bytes8_at), its scale and d once, each value as w_at computes it.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let c = k8 * 8u;
    let b = block_at(m, row, c);
    let i = c % BLOCK;
    let h = i / 128u;
    let r = i % 128u;
    let lo = bytes8_at(b + h * 64u + r % 64u);
    let hi = bytes8_at(b + 128u + h * 32u + r % 32u);
    let scale = f16_at(b + 208u) * i8_at(b + 192u + i / 16u);
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        let l = (byte_of(lo, j) >> (4u * (r / 64u))) & 15u;
        let hh = (byte_of(hi, j) >> (2u * (r / 32u))) & 3u;
        v[j] = scale * (f32(l | (hh << 4u)) - 32.0);
    }
    return w8_of(v);
}
