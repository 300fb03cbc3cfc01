// BF16: one value per 2 bytes, the high half of an f32.
const BLOCK: u32 = 1u;
const TYPE_SIZE: u32 = 2u;

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    return bitcast<f32>(u16_at(block_at(m, row, col)) << 16u);
}
