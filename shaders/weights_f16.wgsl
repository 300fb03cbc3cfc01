// Weight reader for f16 matrices packed two per u32 word in `w` (low half first), row-major
// [rows, cols] (or in weights_common's tiles: TILES, `elem_at`). WMat.base is the element offset
// (even); cols must be a multiple of 8.
// VEC4_WEIGHTS (decode kernels; the launcher: matrices starting on 16 bytes): the weights are
// bound as vec4s (`w4`), eight weights per load.
// Weights per u32 word of `w` (slot offsets are given in words).
const UNITS_PER_WORD: u32 = 2u;

//#include weights_common

// The four words (eight weights) from word `i`, a multiple of 4 with VEC4_WEIGHTS.
fn w_words4(i: u32) -> vec4<u32> {
//#if VEC4_WEIGHTS
    return words_of(w4[i >> 2u]);
//#else
    return vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]);
//#endif
}

// Word `i`.
fn w_word(i: u32) -> u32 {
//#if VEC4_WEIGHTS
    return words_of(w4[i >> 2u])[i & 3u];
//#else
    return w[i];
//#endif
}

// Element index of (row, col).
fn elem_at(m: WMat, row: u32, col: u32) -> u32 {
//#if TILES
    return m.base + tile_unit(m, row, col / 64u) * 64u + col % 64u;
//#else
    return m.base + row * m.cols + col;
//#endif
}

// Weights (row, 8*k8 .. 8*k8+7).
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    let q = w_words4(elem_at(m, row, k8 * 8u) >> 1u);
    let a = vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y));
    let b = vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w));
    return W8(a, b);
}

// Weight at (row, col), for gathers such as the embedding lookup.
fn w_at(m: WMat, row: u32, col: u32) -> f32 {
    let e = elem_at(m, row, col);
    let pair = unpack2x16float(w_word(e >> 1u));
    return select(pair.x, pair.y, (e & 1u) == 1u);
}

// Dense weights have no scale groups; decode kernels take them 32 at a time.
const W_GROUP8: u32 = 4u;
const W_OFFSET: bool = false;

fn w_group(m: WMat, row: u32, grp: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

// Weights (row, 8*k8 .. 8*k8+7) · (xa, xb).
fn w_dot8(m: WMat, row: u32, k8: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let v = w_load8(m, row, k8);
    return dot(v.a, xa) + dot(v.b, xb);
}

//#if LANE_WIDE
// LANE_WIDE (weights_common): group `grp` of `row` · the group's inputs held a vec4 per lane,
// k8 after k8 as rows_dot adds them.
fn group_dot_lanes(m: WMat, row: u32, grp: u32, own: vec4<f32>) -> f32 {
    let k0 = grp * W_GROUP8;
    var d = w_dot8(m, row, k0, subgroupBroadcast(own, 0u), subgroupBroadcast(own, 1u));
    d += w_dot8(m, row, k0 + 1u, subgroupBroadcast(own, 2u), subgroupBroadcast(own, 3u));
    d += w_dot8(m, row, k0 + 2u, subgroupBroadcast(own, 4u), subgroupBroadcast(own, 5u));
    d += w_dot8(m, row, k0 + 3u, subgroupBroadcast(own, 6u), subgroupBroadcast(own, 7u));
    return d;
}

// `acc` plus groups 2 * pair_i and 2 * pair_i + 1 of `row` · their inputs `xin` (dense groups
// have no offset, so their sums go unused).
fn w_pair_acc(m: WMat, row: u32, pair_i: u32, xin: PairInputs, acc: f32) -> f32 {
    let a = acc + group_dot_lanes(m, row, 2u * pair_i, xin.own0);
    return a + group_dot_lanes(m, row, 2u * pair_i + 1u, xin.own1);
}
//#endif
