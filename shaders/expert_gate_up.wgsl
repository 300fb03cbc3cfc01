// Routed experts, first half: for every (token, routed expert) pair j and row r,
// h[j, r] = silu(gate_e[r] . x[t]) * (up_e[r] . x[t]), with expert e = ids[j] found in the slot
// arena through the slot table. One dispatch per arena chunk: pairs whose slot lies in another
// chunk are skipped here and done by that chunk's dispatch. One workgroup per (pair, block of
// ROWS rows), laid out as matvec: teams of TEAM lanes take R rows each, lanes walk whole scale
// groups, and the x they load serves both projections of all R rows; teams sum their lanes with
// subgroup shuffles or through shared memory (LANE_ROWS: one lane per team, no reduction).
// CLAMPED (gpt-oss): gate and up get the expert's biases, then
// h = (clamp(up, ±limit) + 1) * g * sigmoid(alpha * g) with g = min(gate, limit).
//#include common
//#include weights_select

//#include expert_params

@group(0) @binding(2) var<storage, read> x: array<Floats4>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_table: array<u32>;
//#if VEC4_WEIGHTS
@group(0) @binding(5) var<storage, read> w4: array<Words16>;
//#else
@group(0) @binding(5) var<storage, read> w: array<u32>;
//#endif
@group(0) @binding(6) var<storage, read_write> h: array<f32>;
//#if CLAMPED
@group(0) @binding(7) var<storage, read> expert_bias: array<f32>;
//#if WIDE
@group(0) @binding(8) var<storage, read> w4: array<Words16>;
//#endif
//#else
//#if WIDE
@group(0) @binding(7) var<storage, read> w4: array<Words16>;
//#endif
//#endif

alias TeamValue = vec2<f32>;
//#include team

const R: u32 = 4u;
// Rows per workgroup (the launcher: GATE_UP_R in src/ops/experts.rs).
const ROWS: u32 = WG_SIZE / TEAM * R;

// The first vec4 of this workgroup's token's input row.
var<private> x_row: u32;

fn x_at(i: u32) -> vec4<f32> {
    return floats_of(x[x_row + i]);
}

@compute @workgroup_size(WG_SIZE)
//#if LANE_WIDE
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) sid: u32) {
    x_lane = sid;
//#else
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
//#endif
    let g = group_index(wid, nwg);
    let blocks = (p.inter + ROWS - 1u) / ROWS;
    let j = g / blocks;
    if (j >= step.n_tokens * p.top_k) {
        return;
    }
    let slot = slot_table[p.table_base + ids[j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.slots) {
        return;
    }
    let gate = proj(slot - p.first_slot, p.gate, p.hidden);
    let up = proj(slot - p.first_slot, p.up, p.hidden);
    let row0 = (g % blocks) * ROWS + lid / TEAM * R;
    let lane = lid % TEAM;
    x_row = (j / p.top_k) * (p.hidden / 4u);
    let k8s = p.hidden / 8u;
    let rows = team_rows(row0, p.inter);
    var acc: array<vec2<f32>, R>;
//#if LANE_WIDE
    // As rows_dot's LANE_WIDE loop: two groups a step, the input shared by lanes.
    for (var pair_i = 0u; pair_i < k8s / 8u; pair_i++) {
        let xin = pair_inputs(pair_i);
        for (var r = 0u; r < R; r++) {
            let gate_acc = w_pair_acc(gate, rows[r], pair_i, xin, acc[r].x);
            acc[r] = vec2<f32>(gate_acc, w_pair_acc(up, rows[r], pair_i, xin, acc[r].y));
        }
    }
//#else
    for (var grp = lane; grp * W_GROUP8 < k8s; grp += TEAM) {
        let k0 = grp * W_GROUP8;
        let k1 = min(k0 + W_GROUP8, k8s);
        var dg: array<f32, R>;
        var du: array<f32, R>;
        var sx = vec4<f32>(0.0);
        if (W_WIDE && k1 - k0 == 4u) {
            // As rows_dot's wide branch: x once, each row's gate and up words in one load each.
            var xs: array<vec4<f32>, 8>;
            for (var i = 0u; i < 8u; i++) {
                xs[i] = x_at(k0 * 2u + i);
            }
            for (var r = 0u; r < R; r++) {
                dg[r] = w_group_dot(gate, rows[r], grp, xs);
                du[r] = w_group_dot(up, rows[r], grp, xs);
            }
            if (W_OFFSET) {
                sx = x_group_sum(xs);
            }
        } else {
            for (var k8 = k0; k8 < k1; k8++) {
                let xa = x_at(k8 * 2u);
                let xc = x_at(k8 * 2u + 1u);
                for (var r = 0u; r < R; r++) {
                    dg[r] += w_dot8(gate, rows[r], k8, xa, xc);
                    du[r] += w_dot8(up, rows[r], k8, xa, xc);
                }
                if (W_OFFSET) {
                    sx += xa + xc;
                }
            }
        }
        let xsum = sx.x + sx.y + sx.z + sx.w;
        for (var r = 0u; r < R; r++) {
            let sg = w_group(gate, rows[r], grp);
            let su = w_group(up, rows[r], grp);
            acc[r] += vec2<f32>(sg.x * dg[r], su.x * du[r]);
            if (W_OFFSET) {
                acc[r] += vec2<f32>(sg.y, su.y) * xsum;
            }
        }
    }
//#endif
    for (var r = 0u; r < R; r++) {
        let s = team_sum(lid, acc[r]);
        let n = row0 + r;
        if (lane == 0u && n < p.inter) {
//#if CLAMPED
            let bb = bias_base(ids[j]);
            let g = min(s.x + expert_bias[bb + n], p.act.y);
            let u = clamp(s.y + expert_bias[bb + p.inter + n], -p.act.y, p.act.y);
            h[j * p.inter + n] = (u + 1.0) * (g / (1.0 + exp(-p.act.x * g)));
//#else
            h[j * p.inter + n] = silu(s.x) * s.y;
//#endif
        }
    }
}
