// Router: softmax over the experts' logits, top-k (ties go to the lower index), optional
// renormalisation of the k probabilities. One workgroup of 64 lanes per token; each lane holds
// up to 4 experts (at most 256), and every step is a workgroup reduction, with no per-lane
// loops over all experts (lavapipe compiled the old one-lane-per-token version into a
// pathologically slow shader).
// Variant FORCED (the prerouter's prediction-as-routing): the k experts are not chosen here but
// read from forced[forced_offset..], and their probabilities come from this softmax.
// Variant CAPTURE (prerouter heads attached): also keeps what the heads read at the end of the
// step, for MoE layer ordinal `layer`: the step's last token's FFN input (hist_h[layer]) and
// routed ids (hist_ids cur block), and the ids of the token before (prev block: the step's
// second-to-last token, or the previous step's last token). Ids 0xffffffff mean "no token".
//#include common
//#include reduce

struct Params {
    n_experts: u32,
    top_k: u32,
    renormalize: u32,
    forced_offset: u32,
    hidden: u32,
    layer: u32,
    moe_layers: u32,
    pad: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;
//#if FORCED
@group(0) @binding(5) var<storage, read> forced: array<u32>;
//#if CAPTURE
@group(0) @binding(6) var<storage, read> hn: array<f32>;
@group(0) @binding(7) var<storage, read_write> hist_h: array<f32>;
@group(0) @binding(8) var<storage, read_write> hist_ids: array<u32>;
//#endif
//#else
//#if CAPTURE
@group(0) @binding(5) var<storage, read> hn: array<f32>;
@group(0) @binding(6) var<storage, read_write> hist_h: array<f32>;
@group(0) @binding(7) var<storage, read_write> hist_ids: array<u32>;
//#endif
//#endif

const NONE: f32 = -3.0e38;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= step.n_tokens) {
        return;
    }
    let base = t * p.n_experts;
    var vals = array<f32, 4>(NONE, NONE, NONE, NONE);
    var local_max = NONE;
    for (var j = 0u; j < 4u; j++) {
        let e = lid + 64u * j;
        if (e < p.n_experts) {
            vals[j] = logits[base + e];
            local_max = max(local_max, vals[j]);
        }
    }
    let mx = reduce_max(lid, local_max);
    var local_sum = 0.0;
    for (var j = 0u; j < 4u; j++) {
        if (lid + 64u * j < p.n_experts) {
            local_sum += exp(vals[j] - mx);
        }
    }
    let total = reduce_sum(lid, local_sum);
    var chosen_sum = 0.0;
    for (var i = 0u; i < p.top_k; i++) {
//#if FORCED
        let winner = forced[p.forced_offset + i];
        let prob = exp(logits[base + winner] - mx) / total;
//#else
        // This lane's best untaken expert (lowest index among equals).
        var bv = NONE;
        var bi = 0xffffffffu;
        for (var j = 0u; j < 4u; j++) {
            if (vals[j] > bv) {
                bv = vals[j];
                bi = lid + 64u * j;
            }
        }
        let best = reduce_argmax(lid, bv, bi);
        let winner = best.i;
        let prob = exp(best.v - mx) / total;
        if (winner % 64u == lid) {
            vals[winner / 64u] = NONE;
        }
//#endif
        if (lid == 0u) {
            ids[t * p.top_k + i] = winner;
            weights[t * p.top_k + i] = prob;
//#if CAPTURE
            let cur = p.layer * p.top_k + i;
            let prev = p.moe_layers * p.top_k + cur;
            if (t + 1u == step.n_tokens) {
                if (t == 0u) {
                    hist_ids[prev] = hist_ids[cur];
                }
                hist_ids[cur] = winner;
            } else if (t + 2u == step.n_tokens) {
                hist_ids[prev] = winner;
            }
//#endif
        }
        chosen_sum += prob;
    }
//#if CAPTURE
    if (t + 1u == step.n_tokens) {
        for (var i = lid; i < p.hidden; i += 64u) {
            hist_h[p.layer * p.hidden + i] = hn[t * p.hidden + i];
        }
    }
//#endif
    if (p.renormalize == 1u && lid == 0u) {
        for (var i = 0u; i < p.top_k; i++) {
            weights[t * p.top_k + i] /= chosen_sum;
        }
    }
}
