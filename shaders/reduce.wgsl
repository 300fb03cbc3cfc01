// Workgroup-wide reductions (sum, max, argmax) for kernels with @workgroup_size(64). Every invocation must call
// them (uniform control flow) and every invocation receives the result.
var<workgroup> red: array<f32, 64>;

fn reduce_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

var<workgroup> red_i: array<u32, 64>;

// A value and where it came from.
struct Best {
    v: f32,
    i: u32,
}

// The largest `v` over the workgroup with its index `i` (the lowest index among equals).
fn reduce_argmax(lid: u32, v: f32, i: u32) -> Best {
    red[lid] = v;
    red_i[lid] = i;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
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
