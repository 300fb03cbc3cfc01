// Q5_1: 32 values per 24-byte block: f16 d, f16 m, the 32 fifth bits (little-endian u32 at
// byte 4), then 16 bytes whose low nibbles are values 0..15 and high nibbles 16..31;
// value = d * (q | fifth bit << 4) + m.
const BLOCK: u32 = 32u;
const TYPE_SIZE: u32 = 24u;

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    let i = col % BLOCK;
    let high = (byte_at(b + 4u + i / 8u) >> (i % 8u)) & 1u;
    let q = ((byte_at(b + 8u + i % 16u) >> (4u * (i / 16u))) & 15u) | (high << 4u);
    return f16_at(b) * f32(q) + f16_at(b + 2u);
}
