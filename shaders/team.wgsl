// Teams of lanes sharing work on rows, and their reduction; included by the decode matvec
// and the expert kernels. The including kernel declares `alias TeamValue = ...;` (f32 or a
// vector) before this include, and its own R (rows per team) and ROWS after it.
// * LANE_ROWS (CPU adapters such as lavapipe, where a workgroup is one thread and its lanes are
//   SIMD lanes): one lane per team, no reduction at all, small workgroups.
// * otherwise (GPUs): teams of 8 lanes, or of 32 (TEAM32: a whole subgroup, where subgroups
//   have at least 32 lanes), summed with subgroup shuffles (SUBGROUPS without SHARED_REDUCE,
//   which the launcher sets where subgroups may be smaller than a team) or through shared
//   memory; both add in the same order, so results are bit-identical.
//#if LANE_ROWS
const TEAM: u32 = 1u;
const WG_SIZE: u32 = 8u;
//#else
//#if TEAM32
const TEAM: u32 = 32u;
//#else
const TEAM: u32 = 8u;
//#endif
const WG_SIZE: u32 = 64u;
//#endif

var<workgroup> red: array<TeamValue, WG_SIZE>;

// The sum over this invocation's team, valid in its lane 0. Every invocation must call it.
fn team_sum(lid: u32, v: TeamValue) -> TeamValue {
    if (TEAM == 1u) {
        return v;
    }
//#if SUBGROUPS
//#if SHARED_REDUCE
    return team_sum_shared(lid, v);
//#else
    var s = v;
    for (var o = TEAM / 2u; o > 0u; o >>= 1u) {
        s += subgroupShuffleXor(s, o);
    }
    return s;
//#endif
//#else
    return team_sum_shared(lid, v);
//#endif
}

// team_sum through shared memory, adding in the shuffle butterfly's order.
fn team_sum_shared(lid: u32, v: TeamValue) -> TeamValue {
    red[lid] = v;
    workgroupBarrier();
    var t: array<TeamValue, TEAM>;
    for (var i = 0u; i < TEAM; i++) {
        t[i] = red[lid - lid % TEAM + i];
    }
    for (var o = TEAM / 2u; o > 0u; o >>= 1u) {
        for (var i = 0u; i < o; i++) {
            t[i] += t[i + o];
        }
    }
    workgroupBarrier();
    return t[0];
}

// The R rows from `row0`, clamped to the last of `n` rows (rows past the end are computed on the
// last row and not written).
fn team_rows(row0: u32, n: u32) -> array<u32, R> {
    var rows: array<u32, R>;
    for (var r = 0u; r < R; r++) {
        rows[r] = min(row0 + r, n - 1u);
    }
    return rows;
}
