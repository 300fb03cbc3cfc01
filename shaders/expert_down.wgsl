// Routed experts, second half: y[j, n] = route_w[j] * (down_e[n] . h[j]) for every
// (token, routed expert) pair j, with the same slot lookup and per-chunk skipping as
// expert_gate_up, and its layout: one workgroup per (pair, block of ROWS output rows), teams
// of TEAM lanes taking R rows each (LANE_ROWS: one lane per team, no reduction).
// CLAMPED (gpt-oss): the expert's down bias is added before the routing weight scales it.
//#include common
//#include weights_select

//#include expert_params

@group(0) @binding(2) var<storage, read> h: array<Floats4>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> route_w: array<f32>;
@group(0) @binding(5) var<storage, read> slot_table: array<u32>;
//#if VEC4_WEIGHTS
@group(0) @binding(6) var<storage, read> w4: array<Words16>;
//#else
@group(0) @binding(6) var<storage, read> w: array<u32>;
//#endif
@group(0) @binding(7) var<storage, read_write> y: array<f32>;
//#if CLAMPED
@group(0) @binding(8) var<storage, read> expert_bias: array<f32>;
//#if WIDE
@group(0) @binding(9) var<storage, read> w4: array<Words16>;
//#endif
//#else
//#if WIDE
@group(0) @binding(8) var<storage, read> w4: array<Words16>;
//#endif
//#endif

alias TeamValue = f32;
//#include team

// 4 rows per lane in the CPU layout: with LANE_WIDE, 8 made this kernel 6x slower on lavapipe
// (its time went into allocating and clearing memory on every dispatch), unlike matvec's 8.
//#if LANE_ROWS
const R: u32 = 4u;
//#else
const R: u32 = 2u;
//#endif
// Rows per workgroup (the launcher: DOWN_R in src/ops/experts.rs).
const ROWS: u32 = WG_SIZE / TEAM * R;

// The (token, expert) pair this workgroup serves: its row of `h` is the input.
var<private> pair: u32;

fn x_at(i: u32) -> vec4<f32> {
    return floats_of(h[pair * (p.inter / 4u) + i]);
}

//#include rows_dot

@compute @workgroup_size(WG_SIZE)
//#if LANE_WIDE
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) sid: u32) {
    x_lane = sid;
//#else
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
//#endif
    let g = group_index(wid, nwg);
    let blocks = (p.hidden + ROWS - 1u) / ROWS;
    let j = g / blocks;
    if (j >= step.n_tokens * p.top_k) {
        return;
    }
    let slot = slot_table[p.table_base + ids[j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.slots) {
        return;
    }
    let down = proj(slot - p.first_slot, p.down, p.inter);
    let row0 = (g % blocks) * ROWS + lid / TEAM * R;
    let lane = lid % TEAM;
    pair = j;
    let k8s = p.inter / 8u;
    let rows = team_rows(row0, p.hidden);
    let acc = rows_dot(down, rows, lane, k8s);
    let rw = route_w[j];
    for (var r = 0u; r < R; r++) {
        let total = team_sum(lid, acc[r]);
        let n = row0 + r;
        if (lane == 0u && n < p.hidden) {
//#if CLAMPED
            y[j * p.hidden + n] = rw * (total + expert_bias[bias_base(ids[j]) + 2u * p.inter + n]);
//#else
            y[j * p.hidden + n] = rw * total;
//#endif
        }
    }
}
