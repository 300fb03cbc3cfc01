// Q6_K: 256 values per 210-byte block: 128 bytes of low nibbles (ql), 64 bytes of high 2-bit
// pairs (qh), 16 signed 8-bit scales (one per 16 values), f16 d. Value i = 128h + r: low
// nibble r / 64 of ql[64h + r % 64], bits 2(r / 32).. of qh[32h + r % 32];
// value = (d * scale) * (q - 32). With GGML_Q6_K_PADDED (a GGUF model's dense Q6_K matrices,
// `WeightFormat::Q6KPadded`) each block is followed by 14 zero bytes, so that every block, and
// each of its code, scale and d fields, starts on 16 bytes.
const BLOCK: u32 = 256u;
//#if GGML_Q6_K_PADDED
const TYPE_SIZE: u32 = 224u;
//#else
const TYPE_SIZE: u32 = 210u;
//#endif

fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let b = block_at(m, row, col);
    let i = col % BLOCK;
    let h = i / 128u;
    let r = i % 128u;
    let lo = (byte_at(b + h * 64u + r % 64u) >> (4u * (r / 64u))) & 15u;
    let hi = (byte_at(b + 128u + h * 32u + r % 32u) >> (2u * (r / 32u))) & 3u;
    let q = f32(lo | (hi << 4u)) - 32.0;
    return (f16_at(b + 208u) * i8_at(b + 192u + i / 16u)) * q;
}

// Weights (row, 8*k8 .. 8*k8+7): the k8's eight low-nibble bytes and eight high-pair bytes,
// each read as two words (bytes8_at), its scale and d once, each value as w_at computes it.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let c = k8 * 8u;
    let b = block_at(m, row, c);
    let i = c % BLOCK;
    let h = i / 128u;
    let r = i % 128u;
    let lo = bytes8_at(b + h * 64u + r % 64u);
    let hi = bytes8_at(b + 128u + h * 32u + r % 32u);
    let scale = f16_at(b + 208u) * i8_at(b + 192u + i / 16u);
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        let l = (byte_of(lo, j) >> (4u * (r / 64u))) & 15u;
        let hh = (byte_of(hi, j) >> (2u * (r / 32u))) & 3u;
        v[j] = scale * (f32(l | (hh << 4u)) - 32.0);
    }
    return w8_of(v);
}

//#if WIDE
// WIDE (weights_ggml_wide; padded blocks only): a group of 32 values in four 16-byte loads from
// `w4` (its 32 low-nibble bytes and 32 high-pair bytes) and two words (its two scales, d).

// Group `g` (0..7) of a block: values 32g + j take low nibble 4 * ((g % 4) / 2) of lo byte j and
// bits 2 * (g % 4) of hi byte j; `scale` is (d * scale) of its two halves of 16, as w_load8
// computes it.
struct WideGroup {
    lo0: vec4<u32>,
    lo1: vec4<u32>,
    hi0: vec4<u32>,
    hi1: vec4<u32>,
    scale: vec2<f32>,
    g: u32,
}

// d * the scales in bytes 2 * half and 2 * half + 1 of the scale word `sw`.
fn k6_scales(d: f32, sw: u32, half: u32) -> vec2<f32> {
    let s = 16u * half;
    return vec2<f32>(d * i8_of((sw >> s) & 255u), d * i8_of((sw >> (s + 8u)) & 255u));
}

// The block at byte `blk`'s d.
fn k6_d(blk: u32) -> f32 {
    return unpack2x16float(w[(blk + 208u) / 4u]).x;
}

// Where group `g` of the block at byte `blk` has its fields: the `w4` index of its 32 low-nibble
// bytes and of its 32 high-pair bytes, the `w` index of the scale word holding its two scales.
fn k6_lo(blk: u32, g: u32) -> u32 {
    return (blk + (g / 4u) * 64u + (g % 2u) * 32u) / 16u;
}

fn k6_hi(blk: u32, g: u32) -> u32 {
    return (blk + 128u + (g / 4u) * 32u) / 16u;
}

fn k6_scale_word(blk: u32, g: u32) -> u32 {
    return w[(blk + 192u) / 4u + g / 2u];
}

fn wide_group(m: WMat, row: u32, grp: u32) -> WideGroup {
    let blk = block_at(m, row, grp * 32u);
    let g = grp % 8u;
    let lo = k6_lo(blk, g);
    let hi = k6_hi(blk, g);
    let scale = k6_scales(k6_d(blk), k6_scale_word(blk, g), g % 2u);
    return WideGroup(words_of(w4[lo]), words_of(w4[lo + 1u]), words_of(w4[hi]), words_of(w4[hi + 1u]), scale, g);
}

// Groups g and g + 1 (g even) share their high-pair bytes, scale word and d; g + 1's low-nibble
// bytes follow g's.
fn wide_pair(m: WMat, row: u32, pair_i: u32) -> array<WideGroup, 2> {
    let blk = block_at(m, row, pair_i * 64u);
    let g = (2u * pair_i) % 8u;
    let lo = k6_lo(blk, g);
    let hi = k6_hi(blk, g);
    let hi0 = words_of(w4[hi]);
    let hi1 = words_of(w4[hi + 1u]);
    let d = k6_d(blk);
    let sw = k6_scale_word(blk, g);
    return array<WideGroup, 2>(
        WideGroup(words_of(w4[lo]), words_of(w4[lo + 1u]), hi0, hi1, k6_scales(d, sw, 0u), g),
        WideGroup(words_of(w4[lo + 2u]), words_of(w4[lo + 3u]), hi0, hi1, k6_scales(d, sw, 1u), g + 1u),
    );
}

// The 6-bit codes of the four values whose low nibbles are in word `lo` and high pairs in word
// `hi`, of group `g`.
fn k6_codes(lo: u32, hi: u32, g: u32) -> vec4<u32> {
    let bytes = vec4<u32>(0u, 8u, 16u, 24u);
    let low = (vec4<u32>(lo) >> (bytes + vec4<u32>(4u * ((g % 4u) / 2u)))) & vec4<u32>(15u);
    let high = (vec4<u32>(hi) >> (bytes + vec4<u32>(2u * (g % 4u)))) & vec4<u32>(3u);
    return low | (high << vec4<u32>(4u));
}

fn wide_values8(k: WideGroup, c: u32) -> W8 {
    let lv = select(k.lo1, k.lo0, c < 2u);
    let hv = select(k.hi1, k.hi0, c < 2u);
    let i = (2u * c) % 4u;
    let s = k.scale[c / 2u];
    let qa = vec4<f32>(k6_codes(lv[i], hv[i], k.g));
    let qb = vec4<f32>(k6_codes(lv[i + 1u], hv[i + 1u], k.g));
    return W8(s * (qa - vec4<f32>(32.0)), s * (qb - vec4<f32>(32.0)));
}
//#endif
