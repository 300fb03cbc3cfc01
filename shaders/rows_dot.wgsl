// R weight rows · one input vector, for the lane-team kernels (matvec, expert_down). Lane `lane`
// of a team walks whole scale groups (lane, lane + TEAM, ...), so each input value it loads
// serves R rows and a group's scale and offset are applied once per group. The including kernel
// defines `R` and `fn x_at(i: u32) -> vec4<f32>` (the input as vec4s, `k / 4` of them).

// Partial dot products of `rows` of `m` (k8s = cols / 8) with the input, over this lane's groups.
fn rows_dot(m: WMat, rows: array<u32, R>, lane: u32, k8s: u32) -> array<f32, R> {
    var acc: array<f32, R>;
//#if LANE_WIDE
    // The CPU layout's wide loads (weights_common): two groups a step, the input shared by lanes.
    for (var pair_i = 0u; pair_i < k8s / 8u; pair_i++) {
        let xin = pair_inputs(pair_i);
        for (var r = 0u; r < R; r++) {
            acc[r] = w_pair_acc(m, rows[r], pair_i, xin, acc[r]);
        }
    }
//#else
    for (var grp = lane; grp * W_GROUP8 < k8s; grp += TEAM) {
        let k0 = grp * W_GROUP8;
        let k1 = min(k0 + W_GROUP8, k8s);
        var d: array<f32, R>;
        var sx = vec4<f32>(0.0);
        if (W_WIDE && k1 - k0 == 4u) {
            // The group's 8 input vec4s, then each row's four code words in one load (the same
            // additions in the same order as below).
            var xs: array<vec4<f32>, 8>;
            for (var i = 0u; i < 8u; i++) {
                xs[i] = x_at(k0 * 2u + i);
            }
            for (var r = 0u; r < R; r++) {
                d[r] = w_group_dot(m, rows[r], grp, xs);
            }
            if (W_OFFSET) {
                sx = x_group_sum(xs);
            }
        } else {
            for (var k8 = k0; k8 < k1; k8++) {
                let xa = x_at(k8 * 2u);
                let xb = x_at(k8 * 2u + 1u);
                for (var r = 0u; r < R; r++) {
                    d[r] += w_dot8(m, rows[r], k8, xa, xb);
                }
                if (W_OFFSET) {
                    sx += xa + xb;
                }
            }
        }
        let xsum = sx.x + sx.y + sx.z + sx.w;
        for (var r = 0u; r < R; r++) {
            let sc = w_group(m, rows[r], grp);
            acc[r] += sc.x * d[r];
            if (W_OFFSET) {
                acc[r] += sc.y * xsum;
            }
        }
    }
//#endif
    return acc;
}
