// Prerouter heads (Edge0), run once per step on the step's last token t. The head owned by MoE
// layer N (ordinal owners[h]) predicts layer N+1's experts at t+1 from the history the router
// top-k's CAPTURE variant keeps:
//   x = [hist_h[N], (hist_h[last MoE layer] with deep), (next_embedding with token)] (dense part)
//   multi-hot blocks: layer N+1's ids at t (next), at t−1 (prev), layer N's ids at t (own)
// Default variant, one lane per (head, fc1 row f):
//   act[h, f] = gelu_erf(fc1[h, f] · [x, multi-hot] + b1[h, f])
// Variant SCORES, one lane per (head, expert e):
//   logits[h, e] = fc2[h, e] · act[h] + b2[h, e] + skip[h, e] · hist_h[N]
// (the top-k of the logits is the router top-k kernel's). Plain per-lane loops, no barriers:
// lavapipe runs workgroup reductions or barriers per output several times slower, and the heads
// are small. Variant TOKEN (with the token feature) binds the input embedding of token t+1,
// the row the step's embedding wrote, so these heads run at the start of step t+1, after it.
// Weights of a group of heads (starting at global head first_head) are row-major
// [out, in]. The step uniform's n_tokens holds the number of heads.
//#include common

struct Params {
    hidden: u32,
    dense: u32,
    inner: u32,
    experts: u32,
    top_k: u32,
    first_head: u32,
    group_heads: u32,
    // bit 0 next, bit 1 prev, bit 2 own, bit 3 deep, bit 4 token.
    features: u32,
    moe_layers: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}


@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> owners: array<u32>;
@group(0) @binding(3) var<storage, read> hist_h: array<f32>;
// This lane's (head within the group, head, output index) for `per_head` outputs per head.
fn lane_item(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, per_head: u32) -> vec3<u32> {
    let g = group_index(wid, nwg) * 64u + lid;
    return vec3<u32>(g / per_head, p.first_head + g / per_head, g % per_head);
}

//#if SCORES
@group(0) @binding(4) var<storage, read> fc2: array<f32>;
@group(0) @binding(5) var<storage, read> b2: array<f32>;
@group(0) @binding(6) var<storage, read> skip: array<f32>;
@group(0) @binding(7) var<storage, read> act: array<f32>;
@group(0) @binding(8) var<storage, read_write> logits: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let at = lane_item(wid, nwg, lid, p.experts);
    if (at.x >= p.group_heads || at.y >= step.n_tokens) {
        return;
    }
    let local = at.x;
    let head = at.y;
    let e = at.z;
    let x = owners[head] * p.hidden;
    let w2 = (local * p.experts + e) * p.inner;
    let ws = (local * p.experts + e) * p.hidden;
    var acc = b2[local * p.experts + e];
    for (var i = 0u; i < p.inner; i++) {
        acc += fc2[w2 + i] * act[head * p.inner + i];
    }
    for (var i = 0u; i < p.hidden; i++) {
        acc += skip[ws + i] * hist_h[x + i];
    }
    logits[head * p.experts + e] = acc;
}
//#else
@group(0) @binding(4) var<storage, read> hist_ids: array<u32>;
@group(0) @binding(5) var<storage, read> fc1: array<f32>;
@group(0) @binding(6) var<storage, read> b1: array<f32>;
@group(0) @binding(7) var<storage, read_write> act: array<f32>;
//#if TOKEN
@group(0) @binding(8) var<storage, read> next_embedding: array<f32>;
//#endif

// The error function (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7), as the CPU heads use.
fn erf(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - poly * exp(-x * x));
}

// This row's fc1 weights summed at the ones of one multi-hot block (ids ≥ experts are absent).
fn block_sum(row: u32, block: u32, ids_at: u32) -> f32 {
    var s = 0.0;
    for (var i = 0u; i < p.top_k; i++) {
        let id = hist_ids[ids_at + i];
        if (id < p.experts) {
            s += fc1[row + p.dense + block * p.experts + id];
        }
    }
    return s;
}

// fc1 row f of the group's head `local` (owned by MoE ordinal `owner`), after the GELU.
fn hidden_unit(local: u32, owner: u32, f: u32) -> f32 {
    let blocks = countOneBits(p.features & 7u);
    let row = (local * p.inner + f) * (p.dense + blocks * p.experts);
    var acc = b1[local * p.inner + f];
    for (var i = 0u; i < p.hidden; i++) {
        acc += fc1[row + i] * hist_h[owner * p.hidden + i];
    }
    if ((p.features & 8u) != 0u) {
        let last = (p.moe_layers - 1u) * p.hidden;
        for (var i = 0u; i < p.hidden; i++) {
            acc += fc1[row + p.hidden + i] * hist_h[last + i];
        }
    }
//#if TOKEN
    let at = row + p.dense - p.hidden;
    for (var i = 0u; i < p.hidden; i++) {
        acc += fc1[at + i] * next_embedding[i];
    }
//#endif
    let cur = (owner + 1u) * p.top_k;
    var block = 0u;
    if ((p.features & 1u) != 0u) {
        acc += block_sum(row, block, cur);
        block += 1u;
    }
    if ((p.features & 2u) != 0u) {
        acc += block_sum(row, block, p.moe_layers * p.top_k + cur);
        block += 1u;
    }
    if ((p.features & 4u) != 0u) {
        acc += block_sum(row, block, owner * p.top_k);
    }
    return acc * 0.5 * (1.0 + erf(acc * 0.70710678118654752));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let at = lane_item(wid, nwg, lid, p.inner);
    if (at.x >= p.group_heads || at.y >= step.n_tokens) {
        return;
    }
    act[at.y * p.inner + at.z] = hidden_unit(at.x, owners[at.y], at.z);
}
//#endif
