// Weight reader for int4 matrices (see src/quant for the layout): packed u32 words, 8 nibbles
// per word (column 8w+j in bits 4j..4j+3), row-major [rows, cols/8]; f16 scales (and mins for
// the affine scheme) per (row, group) in their own segments, two per word. WMat.base is the
// packed segment's word offset in `w`, WMat.scales / WMat.mins the f16 index of the segments.
// Affine: value = n * scale + min; symmetric (INT4_SYM): value = (n - 8) * scale. Rows have
// ceil(cols / GROUP) groups; the last may be shorter (cols is a multiple of 8).
// TILES (groups of 32; rows and columns multiples of 64): each segment in weights_common's
// tiles, so a CPU-layout workgroup reads it forward, each load touching a few cache lines
// rather than 8 rows a row apart.

//#if TILES
// Index in `w` of code word k8 of `row`.
fn code_word(m: WMat, row: u32, k8: u32) -> u32 {
    return m.base + tile_unit(m, row, k8 / 8u) * 8u + k8 % 8u;
}

// f16 index of group `grp` of `row` in the scale or min segment starting at f16 index `seg`.
fn group_half(seg: u32, m: WMat, row: u32, grp: u32) -> u32 {
    return seg + tile_unit(m, row, grp / 2u) * 2u + grp % 2u;
}
//#else
// Index in `w` of code word k8 of `row`.
fn code_word(m: WMat, row: u32, k8: u32) -> u32 {
    return m.base + row * (m.cols >> 3u) + k8;
}

// f16 index of group `grp` of `row` in the scale or min segment starting at f16 index `seg`.
fn group_half(seg: u32, m: WMat, row: u32, grp: u32) -> u32 {
    return seg + row * ((m.cols + GROUP - 1u) / GROUP) + grp;
}
//#endif

// Packed words per u32 word of `w` (slot offsets are given in words).
const UNITS_PER_WORD: u32 = 1u;

//#if G64
const GROUP: u32 = 64u;
//#else
const GROUP: u32 = 32u;
//#endif

//#include weights_common

fn half_at(i: u32) -> f32 {
    let pair = unpack2x16float(w[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

// The codes `n` of group `grp` of `row` as weights.
fn dequant(n: vec4<f32>, m: WMat, row: u32, grp: u32) -> vec4<f32> {
    let s = half_at(group_half(m.scales, m, row, grp));
//#if INT4_SYM
    return (n - 8.0) * s;
//#else
    return n * s + half_at(group_half(m.mins, m, row, grp));
//#endif
}

// Weights (row, 8*k8 .. 8*k8+7): one packed word, one group.
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let word = w[code_word(m, row, k8)];
    let g = (k8 * 8u) / GROUP;
    let lo = vec4<f32>(f32(word & 15u), f32((word >> 4u) & 15u), f32((word >> 8u) & 15u), f32((word >> 12u) & 15u));
    let hi = vec4<f32>(f32((word >> 16u) & 15u), f32((word >> 20u) & 15u), f32((word >> 24u) & 15u), f32(word >> 28u));
    return W8(dequant(lo, m, row, g), dequant(hi, m, row, g));
}

// Weight at (row, col), for gathers.
fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let word = w[code_word(m, row, col >> 3u)];
    let n = f32((word >> (4u * (col & 7u))) & 15u);
    return dequant(vec4<f32>(n), m, row, col / GROUP).x;
}

// Decode interface: one scale group per w_group call, raw nibbles per w_dot8.
const W_GROUP8: u32 = GROUP / 8u;
const W_OFFSET: bool = true;

// (scale, offset) of group `grp` of `row`: value = n * scale + offset.
fn w_group(m: WMat, row: u32, grp: u32) -> vec2<f32> {
    let s = half_at(group_half(m.scales, m, row, grp));
//#if INT4_SYM
    return vec2<f32>(s, -8.0 * s);
//#else
    return vec2<f32>(s, half_at(group_half(m.mins, m, row, grp)));
//#endif
}

// The raw codes of (row, 8*k8 .. 8*k8+7) · (xa, xb): one word, unpacked with vector shifts.
fn w_dot8(m: WMat, row: u32, k8: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    return codes_dot(w[code_word(m, row, k8)], xa, xb);
}

// The eight codes of `code_word` · (xa, xb).
fn codes_dot(code_word: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let word = vec4<u32>(code_word);
    let lo = vec4<f32>((word >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
    let hi = vec4<f32>((word >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u));
    return dot(lo, xa) + dot(hi, xb);
}

//#if WIDE
// WIDE (the launcher: INT4 groups of 32, every row and matrix 16-byte aligned): a whole group's
// four code words in one 16-byte load from `w4`, the same buffer bound as vec4s.
const W_WIDE: bool = true;

// The raw codes of group `grp` of `row` · the group's inputs `xs`, word after word as w_dot8
// adds them, so results are bit-identical to the one-word loads.
fn w_group_dot(m: WMat, row: u32, grp: u32, xs: array<vec4<f32>, 8>) -> f32 {
    let q = words_of(w4[code_word(m, row, grp * 4u) / 4u]);
    var d = 0.0;
    for (var c = 0u; c < 4u; c++) {
        d += codes_dot(q[c], xs[2u * c], xs[2u * c + 1u]);
    }
    return d;
}

//#if LANE_WIDE
// LANE_WIDE (weights_common; the launcher also needs even scale and min offsets): a row's two
// groups a step in two 16-byte code loads, one word of scales and one of mins. The additions
// are w_dot8's and rows_dot's, in their order: bit-identical to the one-word loads.

// The raw codes of a group (its four words `q`) · the group's inputs, held a vec4 per lane.
fn group_dot_lanes(q: vec4<u32>, own: vec4<f32>) -> f32 {
    var d = codes_dot(q.x, subgroupBroadcast(own, 0u), subgroupBroadcast(own, 1u));
    d += codes_dot(q.y, subgroupBroadcast(own, 2u), subgroupBroadcast(own, 3u));
    d += codes_dot(q.z, subgroupBroadcast(own, 4u), subgroupBroadcast(own, 5u));
    d += codes_dot(q.w, subgroupBroadcast(own, 6u), subgroupBroadcast(own, 7u));
    return d;
}

// `acc` plus groups 2 * pair_i and 2 * pair_i + 1 of `row` · their inputs `xin`: per group
// scale * codes · x, then offset * Σ x, as rows_dot adds a group.
fn w_pair_acc(m: WMat, row: u32, pair_i: u32, xin: PairInputs, acc: f32) -> f32 {
    let q = code_word(m, row, pair_i * 8u) / 4u;
    let scale = unpack2x16float(w[group_half(m.scales, m, row, 2u * pair_i) / 2u]);
//#if INT4_SYM
    let offset = -8.0 * scale;
//#else
    let offset = unpack2x16float(w[group_half(m.mins, m, row, 2u * pair_i) / 2u]);
//#endif
    var a = acc + scale.x * group_dot_lanes(words_of(w4[q]), xin.own0);
    a += offset.x * xin.sum0;
    a += scale.y * group_dot_lanes(words_of(w4[q + 1u]), xin.own1);
    a += offset.y * xin.sum1;
    return a;
}
//#endif
//#endif
