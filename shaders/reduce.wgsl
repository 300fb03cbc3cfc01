// Workgroup-wide reductions (sum, max, argmax) for kernels of @workgroup_size(WG). Every
// invocation must call them (uniform control flow) and every invocation receives the result.
// WG is 64 lanes reduced as a tree in workgroup memory, or with ONE_SUBGROUP (always with
// SUBGROUPS; the launcher: CPU adapters whose subgroups hold a whole 8-lane workgroup) 8 lanes
// reduced by subgroup operations, no workgroup memory: lavapipe charges a kernel that uses
// workgroup memory and barriers several times its work per dispatch. The tree adds in another
// order than subgroupAdd, so sums may differ in their last bits between the two.
//#if ONE_SUBGROUP
const WG: u32 = 8u;
//#else
const WG: u32 = 64u;
//#endif

var<workgroup> red: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;

// A value and where it came from.
struct Best {
    v: f32,
    i: u32,
}

fn reduce_max(lid: u32, v: f32) -> f32 {
//#if ONE_SUBGROUP
    return subgroupMax(v);
//#else
    return tree_max(lid, v);
//#endif
}

fn reduce_sum(lid: u32, v: f32) -> f32 {
//#if ONE_SUBGROUP
    return subgroupAdd(v);
//#else
    return tree_sum(lid, v);
//#endif
}

// The largest `v` over the workgroup with its index `i` (the lowest index among equals). Callers
// deal with NaN themselves: where it wins depends on the layout (ONE_SUBGROUP ranks it last).
fn reduce_argmax(lid: u32, v: f32, i: u32) -> Best {
//#if ONE_SUBGROUP
    let own = select(v, -3.4e38, v != v);
    let m = subgroupMax(own);
    return Best(m, subgroupMin(select(0xffffffffu, i, own == m)));
//#else
    return tree_argmax(lid, v, i);
//#endif
}

fn tree_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn tree_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn tree_argmax(lid: u32, v: f32, i: u32) -> Best {
    red[lid] = v;
    red_i[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = red[lid + s];
            let oi = red_i[lid + s];
            if (ov > red[lid] || (ov == red[lid] && oi < red_i[lid])) {
                red[lid] = ov;
                red_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    let r = Best(red[0], red_i[0]);
    workgroupBarrier();
    return r;
}
