// Q5_0: 32 values per 22-byte block: f16 d, the 32 fifth bits (little-endian u32 at byte 2),
// then 16 bytes whose low nibbles are values 0..15 and high nibbles 16..31;
// value = d * ((q | fifth bit << 4) - 16).
const BLOCK: u32 = 32u;
const TYPE_SIZE: u32 = 22u;

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    let i = col % BLOCK;
    let high = (byte_at(b + 2u + i / 8u) >> (i % 8u)) & 1u;
    let q = ((byte_at(b + 6u + i % 16u) >> (4u * (i / 16u))) & 15u) | (high << 4u);
    return f16_at(b) * (f32(q) - 16.0);
}
