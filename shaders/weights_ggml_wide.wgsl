// WIDE for the ggml block types whose blocks all start on 16 bytes (Q4_K, Q5_K; Q6_K padded to
// 224 bytes at load): the decode kernels' 16-byte loads of a scale group (32 values) through `w4`,
// the weights bound a second time as vec4s; and Q8_0 and MXFP4 padded to 36 and 20 bytes, a
// group's scale and codes in word loads. The type's reader defines
//   struct WideGroup                                   what one group's values need, loaded
//   fn wide_group(m: WMat, row: u32, grp: u32) -> WideGroup
//   fn wide_pair(m: WMat, row: u32, pair_i: u32) -> array<WideGroup, 2>
//                                                      groups 2 * pair_i and 2 * pair_i + 1,
//                                                      sharing the loads they share
//   fn wide_values8(k: WideGroup, c: u32) -> W8        the group's k8 `c` (0..3), as w_load8
// and the dot products here add them as the dense decode path does (w_dot8 k8 by k8 from zero,
// a group scaled by 1): bit-identical to it.
const W_WIDE: bool = true;

// Eight values · (xa, xb), as w_dot8 computes it.
fn wide_dot8(v: W8, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    return dot(v.a, xa) + dot(v.b, xb);
}

// Group `grp` of `row` · the group's inputs `xs`, k8 after k8 as w_dot8 adds them.
fn w_group_dot(m: WMat, row: u32, grp: u32, xs: array<vec4<f32>, 8>) -> f32 {
    let k = wide_group(m, row, grp);
    var d = 0.0;
    for (var c = 0u; c < 4u; c++) {
        d += wide_dot8(wide_values8(k, c), xs[2u * c], xs[2u * c + 1u]);
    }
    return d;
}

//#if LANE_WIDE
// LANE_WIDE (weights_common): a row's two groups a step; the additions as w_group_dot's, in
// rows_dot's order.

// Group `k` · its inputs, held a vec4 per lane.
fn wide_dot_lanes(k: WideGroup, own: vec4<f32>) -> f32 {
    var d = 0.0;
    d += wide_dot8(wide_values8(k, 0u), subgroupBroadcast(own, 0u), subgroupBroadcast(own, 1u));
    d += wide_dot8(wide_values8(k, 1u), subgroupBroadcast(own, 2u), subgroupBroadcast(own, 3u));
    d += wide_dot8(wide_values8(k, 2u), subgroupBroadcast(own, 4u), subgroupBroadcast(own, 5u));
    d += wide_dot8(wide_values8(k, 3u), subgroupBroadcast(own, 6u), subgroupBroadcast(own, 7u));
    return d;
}

// `acc` plus groups 2 * pair_i and 2 * pair_i + 1 of `row` · their inputs `xin`.
fn w_pair_acc(m: WMat, row: u32, pair_i: u32, xin: PairInputs, acc: f32) -> f32 {
    let p = wide_pair(m, row, pair_i);
    let a = acc + wide_dot_lanes(p[0], xin.own0);
    return a + wide_dot_lanes(p[1], xin.own1);
}
//#endif
