// Readers for ggml block types, as stored in GGUF files: row-major [rows, cols], each row
// cols / BLOCK blocks of TYPE_SIZE bytes back to back (no alignment beyond the byte), rows back
// to back. Units are bytes: WMat.base is the byte offset of the matrix in `w`. Each type's file
// (GGML_Q4_0 ... one define; GGML_*_PADDED: padded blocks) gives BLOCK, TYPE_SIZE, `w_at`, the
// dequantization of one value exactly as src/model/gguf/dequant.rs (and ggml) computes it, and
// `w_load8`, eight of them as `w_at` computes each; the rest of the interface is built on them
// here, with dense decode groups (scale 1, no offset).

// Bytes per u32 word of `w` (slot offsets are given in words).
const UNITS_PER_WORD: u32 = 4u;

//#include weights_common

//#if GGML_Q4_0
//#include weights_q4_0
//#endif
//#if GGML_Q8_0
//#include weights_q8_0
//#endif
//#if GGML_Q8_0_PADDED
//#include weights_q8_0
//#endif
//#if GGML_Q4_K
//#include weights_q4_k
//#endif
//#if GGML_Q5_K
//#include weights_q4_k
//#endif
//#if GGML_Q6_K
//#include weights_q6_k
//#endif
//#if GGML_Q6_K_PADDED
//#include weights_q6_k
//#endif
//#if GGML_MXFP4
//#include weights_mxfp4
//#endif
//#if GGML_MXFP4_PADDED
//#include weights_mxfp4
//#endif
//#if GGML_BF16
//#include weights_bf16
//#endif
//#if GGML_Q5_0
//#include weights_q5_0
//#endif
//#if GGML_Q5_1
//#include weights_q5_0
//#endif
//#if WIDE
//#include weights_ggml_wide
//#endif

fn byte_at(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 3u) << 3u)) & 255u;
}

// A byte as a signed 8-bit value.
fn i8_of(byte: u32) -> f32 {
    return f32(bitcast<i32>(byte << 24u) >> 24u);
}

fn i8_at(b: u32) -> f32 {
    return i8_of(byte_at(b));
}

// The 16-bit word at even byte offset `b`.
fn u16_at(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 2u) << 3u)) & 65535u;
}

fn f16_at(b: u32) -> f32 {
    return unpack2x16float(u16_at(b)).x;
}

// The eight bytes from byte offset `b` (any alignment) as two words, low byte first.
fn bytes8_at(b: u32) -> vec2<u32> {
    let a = b >> 2u;
    let s = 8u * (b & 3u);
    let w0 = w[a];
    let w1 = w[a + 1u];
    if (s == 0u) {
        return vec2<u32>(w0, w1);
    }
    let w2 = w[a + 2u];
    return vec2<u32>((w0 >> s) | (w1 << (32u - s)), (w1 >> s) | (w2 << (32u - s)));
}

// Byte j (0..7) of eight held in two words (bytes8_at).
fn byte_of(bytes: vec2<u32>, j: u32) -> u32 {
    return (bytes[j / 4u] >> (8u * (j % 4u))) & 255u;
}

// Byte offset of the block holding (row, col).
fn block_at(m: WMat, row: u32, col: u32) -> u32 {
    return m.base + (row * (m.cols / BLOCK) + col / BLOCK) * TYPE_SIZE;
}

// Decode interface: block types are read as dense weights, 32 at a time.
const W_GROUP8: u32 = 4u;
const W_OFFSET: bool = false;

fn w_group(m: WMat, row: u32, grp: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

fn w_dot8(m: WMat, row: u32, k8: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let v = w_load8(m, row, k8);
    return dot(v.a, xa) + dot(v.b, xb);
}
