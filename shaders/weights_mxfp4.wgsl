// MXFP4: 32 values per 17-byte block: an E8M0 exponent byte e, then 16 bytes of E2M1 codes
// (low nibbles values 0..15, high nibbles 16..31). Codes are read as twice their value
// (0, 1, 2, 3, 4, 6, 8, 12, sign in bit 3) and the exponent as half its scale, as ggml does.
const BLOCK: u32 = 32u;
const TYPE_SIZE: u32 = 17u;

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    let i = col % BLOCK;
    let code = (byte_at(b + 1u + i % 16u) >> (4u * (i / 16u))) & 15u;
    let mag = code & 7u;
    let twice = select((2u + (mag & 1u)) << ((mag >> 1u) - 1u), mag, mag < 4u);
    let v = select(f32(twice), -f32(twice), code >= 8u);
    let e = byte_at(b);
    let d = bitcast<f32>(select((e - 1u) << 23u, 2097152u << e, e < 2u));
    return d * v;
}
