// y[t, row_offset + n] (+)= sum_k W[n, k] * x[t, k] (+ bias[row_offset + n]) for the rows of
// one weight chunk. Decode is the n_tokens = 1 case (a matvec); for prefill each workgroup
// takes up to 8 tokens so a weight row is read once per 8 tokens. One workgroup of 64
// threads per (row, 8-token tile); threads split k, then reduce (subgroups when available).
// Output rows start at step.pos when at_cache_pos is set (k/v written into the KV cache).
// first_row is the chunk's first weight row (bias index).
//#include common
//#include weights_select

//#include matmul_io

var<workgroup> red: array<f32, 512>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
//#if SUBGROUPS
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_invocation_id) sg_lid: u32,
//#endif
) {
    let g = group_index(wid, nwg);
    let n = g % p.n;
    let t0 = (g / p.n) * 8u;
    if (t0 >= step.n_tokens) {
        return;
    }
    let nt = min(8u, step.n_tokens - t0);
    let m = WMat(0u, p.k, p.w_scales, p.w_mins);
    let k8s = p.k / 8u;
    let xw = p.k / 4u;
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var k8 = lid; k8 < k8s; k8 += 64u) {
        let wv = w_load8(m, n, k8);
        for (var i = 0u; i < nt; i++) {
            let xi = (t0 + i) * xw + k8 * 2u;
            acc[i] += dot(wv.a, x[xi]) + dot(wv.b, x[xi + 1u]);
        }
    }
//#if SUBGROUPS
    let n_sub = (64u + sg_size - 1u) / sg_size;
    for (var i = 0u; i < 8u; i++) {
        let s = subgroupAdd(acc[i]);
        if (sg_lid == 0u) {
            red[i * 64u + lid / sg_size] = s;
        }
    }
    workgroupBarrier();
    if (lid < nt) {
        var total = 0.0;
        for (var j = 0u; j < n_sub; j++) {
            total += red[lid * 64u + j];
        }
//#else
    for (var i = 0u; i < 8u; i++) {
        red[i * 64u + lid] = acc[i];
    }
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var i = 0u; i < 8u; i++) {
                red[i * 64u + lid] += red[i * 64u + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (lid < nt) {
        let total = red[lid * 64u];
//#endif
        let col = p.row_offset + n;
        let yi = (t0 + lid + p.at_cache_pos * step.pos) * p.out_stride + col;
        var v = total;
//#if BIAS
        v += bias[p.first_row + n];
//#endif
//#if ACCUMULATE
        v += y[yi];
//#endif
        y[yi] = v;
    }
}
