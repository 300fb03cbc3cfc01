// The interface every weight reader (weights_f32, weights_f16, weights_int4) implements:
//   fn w_load8(m: WMat, row: u32, k8: u32) -> W8   weights (row, 8*k8 .. 8*k8+7)
//   fn w_at(m: WMat, row: u32, col: u32) -> f32     one weight
//   const UNITS_PER_WORD: u32                       data units per u32 word of `w`
// and, for the decode kernels, which take a row one scale group at a time:
//   const W_GROUP8: u32                             k8 units per scale group (dense: 4)
//   const W_OFFSET: bool                            whether groups have an additive offset
//   fn w_group(m: WMat, row: u32, grp: u32) -> vec2<f32>   (scale, offset) of a group
//   fn w_dot8(m: WMat, row: u32, k8: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32
//                                                   raw (unscaled) weights (row, 8*k8 ..) · x
// so that a group's contribution is scale * Σ w_dot8 + offset * Σ x (dense: scale 1, offset 0).
// A matrix inside the bound array `w`: `base` is its data offset (elements for f32/f16,
// packed words for int4), `cols` its row length, `scales` / `mins` the f16 indices of the
// int4 scale and min segments (unused otherwise).
struct WMat {
    base: u32,
    cols: u32,
    scales: u32,
    mins: u32,
}

//#if TILES
// TILES (the CPU layout; `ops::weight_tiles` reorders the blob at upload): a matrix's (row,
// 64-column pair) units — int4: 32 code bytes, a word of scales, a word of mins, each in its
// segment; f16: 128 bytes — in tiles of 64 rows × 64 columns, a row block's tiles one after the
// other, rows 4l + r of a tile at unit 16r + l (the expert kernels' lanes, 4 rows each, side by
// side for each r; the matvec's, 8 rows each, two units apart). The unit index of (row, pair).
fn tile_unit(m: WMat, row: u32, pair: u32) -> u32 {
    let tile = (row / 64u) * (m.cols / 64u) + pair;
    return tile * 64u + (row % 4u) * 16u + (row % 64u) / 4u;
}
//#endif

// Sixteen bytes of weights as the 16-byte-load readers bind them (`w4`).
//#include words16

// Eight consecutive weights of a row.
struct W8 {
    a: vec4<f32>,
    b: vec4<f32>,
}

// Eight values as a W8.
fn w8_of(v: array<f32, 8>) -> W8 {
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

// The sum of a scale group's 8 input vec4s, pair after pair as the decode kernels add them
// k8 by k8.
fn x_group_sum(xs: array<vec4<f32>, 8>) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        s += xs[2u * c] + xs[2u * c + 1u];
    }
    return s;
}

// Without WIDE (see weights_int4 and weights_ggml_wide, the readers with 16-byte group loads)
// the kernels' wide branch is never taken.
//#if WIDE
//#else
const W_WIDE: bool = false;

fn w_group_dot(m: WMat, row: u32, grp: u32, xs: array<vec4<f32>, 8>) -> f32 {
    return 0.0;
}
//#endif

//#if LANE_WIDE
// LANE_WIDE (the CPU layout with subgroups of at least its 8-lane workgroups; int4 in groups of
// 32 and f16, rows of a multiple of 64): rows_dot and expert_gate_up take a row two scale groups
// a step with the reader's w_pair_acc, and the workgroup loads a group's 32 inputs once, one
// vec4 per lane, that every lane takes by subgroupBroadcast (lavapipe pays per load and lane).
// The including kernel defines `fn x_at(i: u32) -> vec4<f32>`, its input as vec4s.

// This invocation's lane in its subgroup (set by the including kernel's main).
var<private> x_lane: u32;

// The sum of a group's inputs, held a vec4 per lane, pair after pair as rows_dot adds them.
fn group_sum_lanes(own: vec4<f32>) -> f32 {
    var s = subgroupBroadcast(own, 0u) + subgroupBroadcast(own, 1u);
    s += subgroupBroadcast(own, 2u) + subgroupBroadcast(own, 3u);
    s += subgroupBroadcast(own, 4u) + subgroupBroadcast(own, 5u);
    s += subgroupBroadcast(own, 6u) + subgroupBroadcast(own, 7u);
    return s.x + s.y + s.z + s.w;
}

// Two scale groups' inputs as the lanes hold them: this lane's vec4 of each, and their sums.
struct PairInputs {
    own0: vec4<f32>,
    own1: vec4<f32>,
    sum0: f32,
    sum1: f32,
}

// Groups 2 * pair_i and 2 * pair_i + 1 of the input (the including kernel's `x_at`), one load
// per lane.
fn pair_inputs(pair_i: u32) -> PairInputs {
    let own0 = x_at(pair_i * 16u + x_lane);
    let own1 = x_at(pair_i * 16u + 8u + x_lane);
    return PairInputs(own0, own1, group_sum_lanes(own0), group_sum_lanes(own1));
}
//#endif
