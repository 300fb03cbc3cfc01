// Routed experts in prefill (steps of more than MATVEC_MAX_TOKENS tokens), llama.cpp's mul_mat_id
// pattern: a workgroup takes one expert e, TN rows of its projection and a tile of up to TT of the
// (token, expert) pairs routed to e, gathered from `ids`, and runs matmul.wgsl's tiled GEMM over
// them, so a weight is dequantized once per tile of pairs instead of once per pair.
// * GATE_UP: h[j, n] = silu(gate_e[n] . x[t]) * (up_e[n] . x[t]) for pair j of token t = j / top_k;
//   the tile's gate rows and up rows are staged side by side.
// * otherwise: y[j, n] = route_w[j] * (down_e[n] . h[j]).
// Experts whose slot lies outside this dispatch's arena chunk (or in none) are skipped, as in
// expert_gate_up / expert_down. Every workgroup finds its expert's pairs by scanning `ids` (each
// lane a contiguous segment, ranks from the lanes' counts: pairs in ascending order); a pair's rank
// picks its tile, tiles taken grid-stride over the dispatch's ceil(n_tokens / TT) token tiles, so
// any number of pairs is served. Each output adds its k slices in matmul's order whatever its tile.
//#include common
//#include weights_select

//#include expert_params

//#if GATE_UP
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> slot_table: array<u32>;
@group(0) @binding(5) var<storage, read> w: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
// Projections staged per tile (gate and up), output rows and input width.
const NPROJ: u32 = 2u;
fn out_rows() -> u32 {
    return p.inter;
}
fn in_cols() -> u32 {
    return p.hidden;
}
//#else
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> route_w: array<f32>;
@group(0) @binding(5) var<storage, read> slot_table: array<u32>;
@group(0) @binding(6) var<storage, read> w: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
const NPROJ: u32 = 1u;
fn out_rows() -> u32 {
    return p.hidden;
}
fn in_cols() -> u32 {
    return p.inter;
}
//#endif

// Rows and pairs per tile (the launcher: EXPERT_TILE in src/ops/experts.rs), k slices as matmul.
const TN: u32 = 32u;
const TT: u32 = 32u;
const KT8: u32 = 4u;
const SLICE: u32 = KT8 * 2u;

var<workgroup> ws: array<vec4<f32>, TN * NPROJ * SLICE>;
var<workgroup> xs: array<vec4<f32>, TT * SLICE>;
// The tile's pairs, the lanes' match counts (then their first ranks) and the expert's pair count.
var<workgroup> tile_pairs: array<u32, TT>;
var<workgroup> counts: array<u32, 64>;
var<workgroup> total: u32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let e = g % p.n_experts;
    let row_tiles = (out_rows() + TN - 1u) / TN;
    let rt = (g / p.n_experts) % row_tiles;
    let tt = g / p.n_experts / row_tiles;
    let tiles = (step.n_tokens + TT - 1u) / TT;
    if (tt >= tiles) {
        return;
    }
    let slot = slot_table[p.table_base + e];
    if (slot < p.first_slot || slot >= p.first_slot + p.slots) {
        return;
    }
    // This lane's segment of the step's pairs, and how many of them route to e. Loops that hold
    // or precede a barrier run the same count on every lane (FXC rejects a barrier after a loop
    // whose exit depends on the lane, error X4026): lanes past their segment's end or rank skip
    // the body.
    let n_pairs = step.n_tokens * p.top_k;
    let seg = (n_pairs + 63u) / 64u;
    let seg0 = lid * seg;
    var mine = 0u;
    for (var i = 0u; i < seg; i++) {
        let j = seg0 + i;
        if (j < n_pairs) {
            mine += select(0u, 1u, ids[j] == e);
        }
    }
    counts[lid] = mine;
    workgroupBarrier();
    var first_rank = 0u;
    for (var l = 0u; l < 64u; l++) {
        if (l < lid) {
            first_rank += counts[l];
        }
    }
    if (lid == 63u) {
        total = first_rank + mine;
    }
    let found = workgroupUniformLoad(&total);

    let local = slot - p.first_slot;
//#if GATE_UP
    let ma = proj(local, p.gate, p.hidden);
    let mb = proj(local, p.up, p.hidden);
//#else
    let ma = proj(local, p.down, p.inter);
    let mb = ma;
//#endif
    let rows = out_rows();
    let n0 = rt * TN;
    let k8s = in_cols() / 8u;
    let xw = in_cols() / 4u;
    let lr = lid % 8u;
    let lt = lid / 8u;
    for (var base = tt * TT; base < found; base += tiles * TT) {
        // Gather the pairs ranked base .. base + TT.
        var rank = first_rank;
        for (var i = 0u; i < seg; i++) {
            let j = seg0 + i;
            if (j < n_pairs && ids[j] == e) {
                if (rank >= base && rank < base + TT) {
                    tile_pairs[rank - base] = j;
                }
                rank++;
            }
        }
        workgroupBarrier();
        let in_tile = min(found - base, TT);
        // acc_a[i][j] (and acc_b, the up projection): row n0 + lr + 8i, tile pair 4lt + j. An
        // expert has few pairs per step, so lanes whose four pairs are all past the tile's
        // (whole SIMD groups on CPU adapters) skip the arithmetic.
        let busy = lt * 4u < in_tile;
        // Pair slots the busy lanes read (the last ones past the tile repeat its last pair).
        let staged = min(TT, (in_tile + 3u) / 4u * 4u);
        var acc_a: array<vec4<f32>, 4>;
        var acc_b: array<vec4<f32>, 4>;
        for (var kb = 0u; kb < k8s; kb += KT8) {
            for (var u = lid; u < TN * NPROJ * KT8; u += 64u) {
                let r = u / KT8;
                let k8 = kb + u % KT8;
                var m = ma;
                if (r >= TN) {
                    m = mb;
                }
                var v = W8(vec4<f32>(0.0), vec4<f32>(0.0));
                if (k8 < k8s) {
                    v = w_load8(m, min(n0 + r % TN, rows - 1u), k8);
                }
                ws[u * 2u] = v.a;
                ws[u * 2u + 1u] = v.b;
            }
            for (var u = lid; u < staged * SLICE; u += 64u) {
                let pair = tile_pairs[min(u / SLICE, in_tile - 1u)];
//#if GATE_UP
                let in_row = pair / p.top_k;
//#else
                let in_row = pair;
//#endif
                let q = kb * 2u + u % SLICE;
                var v = vec4<f32>(0.0);
                if (q < xw) {
                    v = x[in_row * xw + q];
                }
                xs[u] = v;
            }
            workgroupBarrier();
            if (busy) {
                for (var q = 0u; q < SLICE; q++) {
                    let x0 = xs[(lt * 4u) * SLICE + q];
                    let x1 = xs[(lt * 4u + 1u) * SLICE + q];
                    let x2 = xs[(lt * 4u + 2u) * SLICE + q];
                    let x3 = xs[(lt * 4u + 3u) * SLICE + q];
                    for (var i = 0u; i < 4u; i++) {
                        let wa = ws[(lr + 8u * i) * SLICE + q];
                        acc_a[i] += vec4<f32>(dot(wa, x0), dot(wa, x1), dot(wa, x2), dot(wa, x3));
                        if (NPROJ == 2u) {
                            let wb = ws[(TN + lr + 8u * i) * SLICE + q];
                            acc_b[i] += vec4<f32>(dot(wb, x0), dot(wb, x1), dot(wb, x2), dot(wb, x3));
                        }
                    }
                }
            }
            workgroupBarrier();
        }
        for (var i = 0u; i < 4u; i++) {
            let n = n0 + lr + 8u * i;
            for (var jj = 0u; jj < 4u; jj++) {
                let s = lt * 4u + jj;
                if (n < rows && s < in_tile) {
                    let pair = tile_pairs[s];
//#if GATE_UP
                    out[pair * p.inter + n] = silu(acc_a[i][jj]) * acc_b[i][jj];
//#else
                    out[pair * p.hidden + n] = route_w[pair] * acc_a[i][jj];
//#endif
                }
            }
        }
        workgroupBarrier();
    }
}
