// Q4_K (144-byte blocks) and, with GGML_Q5_K, Q5_K (176 bytes): 256 values in 8 sub-blocks of
// 32. f16 d and dmin, 12 bytes packing a 6-bit scale and min per sub-block, (Q5_K: 32 bytes of
// fifth bits, bit s of byte i for value 32s + i), then 128 bytes of nibbles: sub-blocks 2c and
// 2c+1 share bytes 32c..32c+31 (low, high nibble). value = (d * scale) * q - dmin * min.
const BLOCK: u32 = 256u;
//#if GGML_Q5_K
const TYPE_SIZE: u32 = 176u;
const QS: u32 = 48u;
//#else
const TYPE_SIZE: u32 = 144u;
const QS: u32 = 16u;
//#endif

// (scale, min) of sub-block j of the block at byte b.
fn k_scale_min(b: u32, j: u32) -> vec2<f32> {
    let s = b + 4u;
    if j < 4u {
        return vec2<f32>(f32(byte_at(s + j) & 63u), f32(byte_at(s + j + 4u) & 63u));
    }
    let hi = byte_at(s + j + 4u);
    let sc = (hi & 15u) | ((byte_at(s + j - 4u) >> 6u) << 4u);
    let mn = (hi >> 4u) | ((byte_at(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(mn));
}

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    let i = col % BLOCK;
    let sub = i / 32u;
    var q = (byte_at(b + QS + (sub / 2u) * 32u + i % 32u) >> (4u * (sub % 2u))) & 15u;
//#if GGML_Q5_K
    q = q | (((byte_at(b + 16u + i % 32u) >> sub) & 1u) << 4u);
//#endif
    let sm = k_scale_min(b, sub);
    return (f16_at(b) * sm.x) * f32(q) - f16_at(b + 2u) * sm.y;
}
