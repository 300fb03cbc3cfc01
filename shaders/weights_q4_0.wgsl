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
