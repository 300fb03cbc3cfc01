//! CPU dequantization of ggml blocks: the reference the GPU readers (`shaders/weights_*.wgsl`)
//! are tested against, itself equal bit for bit to the `gguf` Python package's
//! `gguf.quants.dequantize` (`tests/gguf_dequant.rs`). Every product is taken in the order the
//! reference takes it, in f32, so the results are identical, not merely close.

use half::{bf16, f16};

use crate::quant::GgmlType;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block's 12 scale bytes.
pub fn k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// MXFP4 code → twice its E2M1 value.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An E8M0 exponent byte as a float, halved (MXFP4 codes are doubled).
pub fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 { 0x0020_0000 << e } else { (e as u32 - 1) << 23 })
}

/// Value `i` of one block of type `t`.
fn block_value(t: GgmlType, b: &[u8], i: usize) -> f32 {
    match t {
        GgmlType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => f16_at(b, 0),
        GgmlType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        GgmlType::Q4_0 => {
            let q = (b[2 + i % 16] >> (4 * (i / 16))) & 15;
            f16_at(b, 0) * (q as f32 - 8.0)
        }
        GgmlType::Q8_0 => b[2 + i] as i8 as f32 * f16_at(b, 0),
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            // d (and m), the 32 fifth bits as a little-endian u32, then the nibbles.
            let (qh, qs) = if t == GgmlType::Q5_0 { (2, 6) } else { (4, 8) };
            let high = (u32::from_le_bytes([b[qh], b[qh + 1], b[qh + 2], b[qh + 3]]) >> i) & 1;
            let q = ((b[qs + i % 16] >> (4 * (i / 16))) & 15) as u32 | (high << 4);
            match t {
                GgmlType::Q5_0 => f16_at(b, 0) * (q as f32 - 16.0),
                _ => f16_at(b, 0) * q as f32 + f16_at(b, 2),
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let sub = i / 32;
            let (sc, m) = k_scale_min(&b[4..16], sub);
            let mut q = (b[if t == GgmlType::Q4K { 16 } else { 48 } + (sub / 2) * 32 + i % 32] >> (4 * (sub % 2))) & 15;
            if t == GgmlType::Q5K {
                q |= ((b[16 + i % 32] >> sub) & 1) << 4;
            }
            (f16_at(b, 0) * sc as f32) * q as f32 - f16_at(b, 2) * m as f32
        }
        GgmlType::Q6K => {
            let (half, r) = (i / 128, i % 128);
            let lo = (b[half * 64 + r % 64] >> (4 * (r / 64))) & 15;
            let hi = (b[128 + half * 32 + r % 32] >> (2 * (r / 32))) & 3;
            let q = (lo | (hi << 4)) as i32 - 32;
            (f16_at(b, 208) * b[192 + i / 16] as i8 as f32) * q as f32
        }
        GgmlType::Mxfp4 => {
            let code = (b[1 + i % 16] >> (4 * (i / 16))) & 15;
            e8m0_half(b[0]) * MXFP4_VALUES[code as usize] as f32
        }
    }
}

/// Dequantizes whole blocks of type `t` (`bytes.len()` a multiple of the type size) to f32.
pub fn dequantize(t: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let (bs, ts) = (t.block_size(), t.type_size());
    let mut out = Vec::with_capacity(bytes.len() / ts * bs);
    for block in bytes.chunks_exact(ts) {
        out.extend((0..bs).map(|i| block_value(t, block, i)));
    }
    out
}
