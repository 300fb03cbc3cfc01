// Workgroup-wide max and sum of a vec4 per invocation (four query slots reduced at once), for
// kernels with @workgroup_size(64); as `reduce`, every invocation must call them and receives
// the result.
var<workgroup> red4: array<vec4<f32>, 64>;

fn reduce_max4(lid: u32, v: vec4<f32>) -> vec4<f32> {
    red4[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red4[lid] = max(red4[lid], red4[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red4[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum4(lid: u32, v: vec4<f32>) -> vec4<f32> {
    red4[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red4[lid] += red4[lid + s];
        }
        workgroupBarrier();
    }
    let r = red4[0];
    workgroupBarrier();
    return r;
}
