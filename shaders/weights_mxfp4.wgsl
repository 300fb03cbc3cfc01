// MXFP4: 32 values per 17-byte block: an E8M0 exponent byte e, then 16 bytes of E2M1 codes
// (low nibbles values 0..15, high nibbles 16..31). Codes are read as twice their value
// (0, 1, 2, 3, 4, 6, 8, 12, sign in bit 3) and the exponent as half its scale, as ggml does.
// With GGML_MXFP4_PADDED (`WeightFormat::Padded`) each block is 20 bytes, three zero bytes
// after e, so that every block and its codes start on a word.
const BLOCK: u32 = 32u;
//#if GGML_MXFP4_PADDED
const TYPE_SIZE: u32 = 20u;
const QS: u32 = 4u;
//#else
const TYPE_SIZE: u32 = 17u;
const QS: u32 = 1u;
//#endif

// Twice the E2M1 values of four codes (sign in bit 3).
fn e2m1_twice(codes: vec4<u32>) -> vec4<f32> {
    let mag = codes & vec4<u32>(7u);
    let big = (vec4<u32>(2u) + (mag & vec4<u32>(1u))) << (max(mag >> vec4<u32>(1u), vec4<u32>(1u)) - vec4<u32>(1u));
    let twice = vec4<f32>(select(big, mag, mag < vec4<u32>(4u)));
    return select(twice, -twice, codes >= vec4<u32>(8u));
}

// Half the scale of the E8M0 exponent `e`.
fn e8m0_half(e: u32) -> f32 {
    return bitcast<f32>(select((e - 1u) << 23u, 2097152u << e, e < 2u));
}

// The codes in the nibbles at bit `shift` of a word's four bytes, lowest byte first.
fn e2m1_codes(word: u32, shift: u32) -> vec4<u32> {
    return (vec4<u32>(word) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(15u);
}

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    let i = col % BLOCK;
    let code = (byte_at(b + QS + i % 16u) >> (4u * (i / 16u))) & 15u;
    return e8m0_half(byte_at(b)) * e2m1_twice(vec4<u32>(code)).x;
}

// Weights (row, 8*k8 .. 8*k8+7): the eight code bytes holding them as two words (bytes8_at)
// and the exponent once, each value as w_at computes it.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let c = k8 * 8u;
    let b = block_at(m, row, c);
    let i = c % BLOCK;
    let codes = bytes8_at(b + QS + i % 16u);
    let shift = 4u * (i / 16u);
    let d = e8m0_half(byte_at(b));
    return W8(d * e2m1_twice(e2m1_codes(codes.x, shift)), d * e2m1_twice(e2m1_codes(codes.y, shift)));
}

//#if WIDE
// WIDE (weights_ggml_wide; padded blocks only): a group of 32 values, one block, in five word
// loads: e, then its 16 code bytes.
struct WideGroup {
    d: f32,
    codes: vec4<u32>,
}

fn wide_group(m: WMat, row: u32, grp: u32) -> WideGroup {
    let i = block_at(m, row, grp * 32u) / 4u;
    return WideGroup(e8m0_half(w[i] & 255u), vec4<u32>(w[i + 1u], w[i + 2u], w[i + 3u], w[i + 4u]));
}

// Two blocks share nothing but their row.
fn wide_pair(m: WMat, row: u32, pair_i: u32) -> array<WideGroup, 2> {
    return array<WideGroup, 2>(wide_group(m, row, 2u * pair_i), wide_group(m, row, 2u * pair_i + 1u));
}

// k8 `c`: values 8c .. 8c+7, low nibbles of code bytes 8(c % 2).. for c < 2, high ones after.
fn wide_values8(k: WideGroup, c: u32) -> W8 {
    let w0 = select(k.codes.z, k.codes.x, c % 2u == 0u);
    let w1 = select(k.codes.w, k.codes.y, c % 2u == 0u);
    let shift = 4u * (c / 2u);
    return W8(k.d * e2m1_twice(e2m1_codes(w0, shift)), k.d * e2m1_twice(e2m1_codes(w1, shift)));
}
//#endif
