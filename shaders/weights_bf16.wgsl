// BF16: one value per 2 bytes, the high half of an f32.
const BLOCK: u32 = 1u;
const TYPE_SIZE: u32 = 2u;

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    return bitcast<f32>(u16_at(block_at(m, row, col)) << 16u);
}

// The two values held in a word, low half first.
fn bf16_pair(word: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

// Weights (row, 8*k8 .. 8*k8+7): their 16 bytes as four words (bytes8_at), exactly w_at's values.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let b = block_at(m, row, k8 * 8u);
    let lo = bytes8_at(b);
    let hi = bytes8_at(b + 8u);
    return W8(vec4<f32>(bf16_pair(lo.x), bf16_pair(lo.y)), vec4<f32>(bf16_pair(hi.x), bf16_pair(hi.y)));
}
