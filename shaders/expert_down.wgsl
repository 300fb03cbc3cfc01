// Routed experts, second half: y[j, n] = route_w[j] * (down_e[n] . h[j]) for every
// (token, routed expert) pair j, with the same slot lookup and per-chunk skipping as
// expert_gate_up. One workgroup per (pair, output row).
//#include common
//#include reduce
//#if INT4
//#include weights_int4
//#else
//#if F16
//#include weights_f16
//#else
//#include weights_f32
//#endif
//#endif

//#include expert_params

@group(0) @binding(2) var<storage, read> h: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> route_w: array<f32>;
@group(0) @binding(5) var<storage, read> slot_table: array<u32>;
@group(0) @binding(6) var<storage, read> w: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let n = g % p.hidden;
    let j = g / p.hidden;
    if (j >= step.n_tokens * p.top_k) {
        return;
    }
    let slot = slot_table[p.table_base + ids[j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.slots) {
        return;
    }
    let down = proj(slot - p.first_slot, p.down, p.inter);
    let hb = j * (p.inter / 4u);
    var s = 0.0;
    for (var k8 = lid; k8 < p.inter / 8u; k8 += 64u) {
        let dw = w_load8(down, n, k8);
        s += dot(dw.a, h[hb + k8 * 2u]) + dot(dw.b, h[hb + k8 * 2u + 1u]);
    }
    let total = reduce_sum(lid, s);
    if (lid == 0u) {
        y[j * p.hidden + n] = route_w[j] * total;
    }
}
