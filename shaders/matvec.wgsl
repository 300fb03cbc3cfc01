// Decode matvec, for steps of a few tokens (the launcher: MATVEC_MAX_TOKENS), with matmul's
// parameters and bindings: y[t, row_offset + n] (+)= W[n] · x[t] (+ bias[first_row + n]), one
// token after the other (a workgroup's rows stay in cache between them); LAST_TOKEN: only the
// step's last token, into its row of y (the lm_head when only the next token matters). A workgroup takes ROWS consecutive rows: teams of TEAM lanes take R rows
// each, every lane walking whole scale groups (lane, lane + TEAM, ...) of its team's rows, so
// the x it loads serves R rows and a group's scale and offset are applied once per group. A
// team then sums its lanes (team_sum). Two layouts, picked by the launcher:
// * LANE_ROWS (CPU adapters such as lavapipe, where a workgroup is one thread and its lanes are
//   SIMD lanes): one lane per team, no reduction at all, small workgroups.
// * otherwise (GPUs): teams of 8 or 32 lanes (TEAM32) reading a row's groups side by side, summed with
//   subgroup shuffles (SUBGROUPS without SHARED_REDUCE, which the launcher sets where subgroups
//   may be smaller than a team) or through shared memory; both add in the same order.
//#include common
//#include weights_select

//#include matmul_io

alias TeamValue = f32;
//#include team

//#if LANE_ROWS
const R: u32 = 8u;
//#else
const R: u32 = 2u;
//#endif
// Rows per workgroup (the launcher: MATVEC_R in src/ops/matmul.rs).
const ROWS: u32 = WG_SIZE / TEAM * R;

// The first vec4 of the current token's input row.
var<private> x_row: u32;

fn x_at(i: u32) -> vec4<f32> {
    return floats_of(x[x_row + i]);
}

//#include rows_dot

@compute @workgroup_size(WG_SIZE)
//#if LANE_WIDE
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) sid: u32) {
    x_lane = sid;
//#else
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
//#endif
    let first = group_index(wid, nwg) * ROWS;
    if (first >= p.n) {
        return;
    }
    let row0 = first + lid / TEAM * R;
    let lane = lid % TEAM;
    let m = WMat(0u, p.k, p.w_scales, p.w_mins);
    let k8s = p.k / 8u;
    let rows = team_rows(row0, p.n);
//#if LAST_TOKEN
    let first_token = step.n_tokens - 1u;
//#else
    let first_token = 0u;
//#endif
    for (var t = first_token; t < step.n_tokens; t++) {
        x_row = t * (p.k / 4u);
        let acc = rows_dot(m, rows, lane, k8s);
        for (var r = 0u; r < R; r++) {
            let total = team_sum(lid, acc[r]);
            let n = row0 + r;
            if (lane == 0u && n < p.n) {
                store_row(t, n, total);
            }
        }
    }
}
