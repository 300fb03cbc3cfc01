// Q8_0: 32 values per 34-byte block: f16 d, then 32 signed bytes; value = q * d.
const BLOCK: u32 = 32u;
const TYPE_SIZE: u32 = 34u;

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    return i8_at(b + 2u + col % BLOCK) * f16_at(b);
}
