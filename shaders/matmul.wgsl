// Prefill GEMM: y[t, row_offset + n] (+)= sum_k W[n, k] * x[t, k] (+ bias[first_row + n]) for the
// rows of one weight chunk and every token of the step (decode's single token runs matvec.wgsl).
// Tiled: a workgroup of 64 lanes computes TN rows × TT tokens, walking k in slices of KT8 * 8
// columns. Each slice of its rows' weights (dequantized once per tile, by any weight reader's
// w_load8) and of its tokens' inputs is staged in workgroup memory; lane (lr, lt) then
// accumulates rows lr, lr + 8, .. and tokens lt, lt + 8, .. from it: 8 loads feed 16 dot products.
// Rows and tokens past the end are computed on the last one and not written. Every output adds
// its k slices in the same order whatever its place in a tile, so a token's result does not
// depend on which tokens share its step. first_row is the chunk's first weight row (bias index).
//#include common
//#include weights_select

//#include matmul_io

// Rows and tokens per tile (the launcher: MATMUL_TILE in src/ops/matmul.rs).
const TN: u32 = 32u;
const TT: u32 = 32u;
// 8-column units per k slice, and the vec4s a row (or token) has in a slice.
const KT8: u32 = 4u;
const SLICE: u32 = KT8 * 2u;

var<workgroup> ws: array<vec4<f32>, TN * SLICE>;
var<workgroup> xs: array<vec4<f32>, TT * SLICE>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let row_tiles = (p.n + TN - 1u) / TN;
    let n0 = (g % row_tiles) * TN;
    let t0 = (g / row_tiles) * TT;
    if (t0 >= step.n_tokens) {
        return;
    }
    let m = WMat(0u, p.k, p.w_scales, p.w_mins);
    let k8s = p.k / 8u;
    let xw = p.k / 4u;
    let lr = lid % 8u;
    let lt = lid / 8u;
    // acc[i][j]: row n0 + lr + 8i, token t0 + lt + 8j.
    var acc: array<vec4<f32>, 4>;
    for (var kb = 0u; kb < k8s; kb += KT8) {
        for (var u = lid; u < TN * KT8; u += 64u) {
            let k8 = kb + u % KT8;
            var v = W8(vec4<f32>(0.0), vec4<f32>(0.0));
            if (k8 < k8s) {
                v = w_load8(m, min(n0 + u / KT8, p.n - 1u), k8);
            }
            ws[u * 2u] = v.a;
            ws[u * 2u + 1u] = v.b;
        }
        for (var u = lid; u < TT * SLICE; u += 64u) {
            let t = min(t0 + u / SLICE, step.n_tokens - 1u);
            let q = kb * 2u + u % SLICE;
            var v = vec4<f32>(0.0);
            if (q < xw) {
                v = floats_of(x[t * xw + q]);
            }
            xs[u] = v;
        }
        workgroupBarrier();
        for (var q = 0u; q < SLICE; q++) {
            let x0 = xs[lt * SLICE + q];
            let x1 = xs[(lt + 8u) * SLICE + q];
            let x2 = xs[(lt + 16u) * SLICE + q];
            let x3 = xs[(lt + 24u) * SLICE + q];
            for (var i = 0u; i < 4u; i++) {
                let wv = ws[(lr + 8u * i) * SLICE + q];
                acc[i] += vec4<f32>(dot(wv, x0), dot(wv, x1), dot(wv, x2), dot(wv, x3));
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let n = n0 + lr + 8u * i;
        for (var j = 0u; j < 4u; j++) {
            let t = t0 + lt + 8u * j;
            if (n < p.n && t < step.n_tokens) {
                store_row(t, n, acc[i][j]);
            }
        }
    }
}
