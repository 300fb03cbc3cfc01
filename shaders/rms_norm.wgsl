// RMSNorm over rows of length n, in place: x[r, :] = x[r, :] * rsqrt(mean(x^2) + eps) * weight.
// Rows are rows_per_token * step.n_tokens starting at row `row_offset` (plus step.pos *
// rows_per_token when `at_cache_pos` is set, to normalise freshly written KV-cache rows).
// With OUT the result goes to `out` instead (same indexing, without the cache offset).
// ADD_PAIRS (one row per token; the launcher sets OUT too): first the previous MoE layer's
// combine, in place, x[t] += sum_j y[t * top_k + j], as moe_combine adds it (so results are
// bit-identical to moe_combine then this norm, one dispatch fewer).
// ONE_SUBGROUP (always with SUBGROUPS; for CPU adapters, whose subgroups have at least 8 lanes):
// a row per 8-lane workgroup, summed with subgroupAdd, no workgroup memory. On lavapipe a kernel
// that uses workgroup memory pays ~0.3-0.5 ms per dispatch whatever its size (this one 0.09 ms).
// PAIR (in place, neither OUT nor ADD_PAIRS): two tensors' rows in one dispatch, the first's
// (x, weight, n, rows_per_token) and then the second's (x2, weight2, n2, rows2): a layer's per-head
// (or whole-projection) q and k norms, each row as the norm alone computes it.
// WIDE_ROW (GPUs, rows of at least 1024 values: whole hidden states): 256 lanes per row instead
// of 64, a quarter of the dependent loads per lane (a 4096-value row: 16 instead of 64), as
// llama.cpp's Vulkan rms_norm spreads a row over 512 lanes.
//#include common

struct Params {
    n: u32,
    rows_per_token: u32,
    eps: f32,
    at_cache_pos: u32,
    top_k: u32,
    // PAIR: the second tensor's row length and rows per token.
    n2: u32,
    rows2: u32,
    pad: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
//#if OUT
//#if ADD_PAIRS
@group(0) @binding(3) var<storage, read_write> x: array<f32>;
//#else
@group(0) @binding(3) var<storage, read> x: array<f32>;
//#endif
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
//#else
@group(0) @binding(3) var<storage, read_write> x: array<f32>;
//#endif
//#if ADD_PAIRS
@group(0) @binding(5) var<storage, read> y: array<f32>;
//#endif
//#if PAIR
@group(0) @binding(4) var<storage, read> weight2: array<f32>;
@group(0) @binding(5) var<storage, read_write> x2: array<f32>;
//#endif

// This workgroup's row is one of the second tensor's (PAIR).
var<private> second: bool;

fn x_at(i: u32) -> f32 {
//#if PAIR
    if (second) {
        return x2[i];
    }
//#endif
    return x[i];
}

fn weight_at(i: u32) -> f32 {
//#if PAIR
    if (second) {
        return weight2[i];
    }
//#endif
    return weight[i];
}

//#if OUT
//#else
// Writes the normalised value (in place).
fn set_x(i: u32, v: f32) {
//#if PAIR
    if (second) {
        x2[i] = v;
        return;
    }
//#endif
    x[i] = v;
}
//#endif

//#if WIDE_ROW
const LANES: u32 = 256u;
//#else
//#if ONE_SUBGROUP
const LANES: u32 = 8u;
//#else
const LANES: u32 = 64u;
//#endif
//#endif

var<workgroup> partial: array<f32, LANES>;

// The sum of `s` over the workgroup, as a tree in workgroup memory.
fn shared_sum(lid: u32, s: f32) -> f32 {
    partial[lid] = s;
    workgroupBarrier();
    for (var stride = LANES / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    return partial[0];
}

// The sum of `s` over the workgroup.
fn row_sum(lid: u32, s: f32) -> f32 {
//#if ONE_SUBGROUP
    return subgroupAdd(s);
//#else
    return shared_sum(lid, s);
//#endif
}

@compute @workgroup_size(LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    var r = group_index(wid, nwg);
    var n = p.n;
    var rows = step.n_tokens * p.rows_per_token;
//#if PAIR
    if (r >= rows) {
        second = true;
        r -= rows;
        n = p.n2;
        rows = step.n_tokens * p.rows2;
    }
//#endif
    if (r >= rows) {
        return;
    }
    let base = (r + p.at_cache_pos * step.pos * p.rows_per_token) * n;
    var s = 0.0;
    for (var i = lid; i < n; i += LANES) {
//#if ADD_PAIRS
        var add = 0.0;
        for (var j = 0u; j < p.top_k; j++) {
            add += y[(r * p.top_k + j) * n + i];
        }
        x[base + i] += add;
//#endif
        let v = x_at(base + i);
        s += v * v;
    }
    let inv = inverseSqrt(row_sum(lid, s) / f32(n) + p.eps);
    for (var i = lid; i < n; i += LANES) {
//#if OUT
        out[r * n + i] = x_at(base + i) * inv * weight_at(i);
//#else
        set_x(base + i, x_at(base + i) * inv * weight_at(i));
//#endif
    }
}
