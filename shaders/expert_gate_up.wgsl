// Routed experts, first half: for every (token, routed expert) pair j and row r,
// h[j, r] = silu(gate_e[r] . x[t]) * (up_e[r] . x[t]), with expert e = ids[j] found in the slot
// arena through the slot table. One dispatch per arena chunk: pairs whose slot lies in another
// chunk are skipped here and done by that chunk's dispatch. One workgroup per (pair, row).
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

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_table: array<u32>;
@group(0) @binding(5) var<storage, read> w: array<u32>;
@group(0) @binding(6) var<storage, read_write> h: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let r = g % p.inter;
    let j = g / p.inter;
    if (j >= step.n_tokens * p.top_k) {
        return;
    }
    let slot = slot_table[p.table_base + ids[j]];
    if (slot < p.first_slot || slot >= p.first_slot + p.slots) {
        return;
    }
    let gate = proj(slot - p.first_slot, p.gate, p.hidden);
    let up = proj(slot - p.first_slot, p.up, p.hidden);
    let xb = (j / p.top_k) * (p.hidden / 4u);
    var sg = 0.0;
    var su = 0.0;
    for (var k8 = lid; k8 < p.hidden / 8u; k8 += 64u) {
        let xa = x[xb + k8 * 2u];
        let xc = x[xb + k8 * 2u + 1u];
        let gw = w_load8(gate, r, k8);
        let uw = w_load8(up, r, k8);
        sg += dot(gw.a, xa) + dot(gw.b, xc);
        su += dot(uw.a, xa) + dot(uw.b, xc);
    }
    let gsum = reduce_sum(lid, sg);
    let usum = reduce_sum(lid, su);
    if (lid == 0u) {
        h[j * p.inter + r] = silu(gsum) * usum;
    }
}
