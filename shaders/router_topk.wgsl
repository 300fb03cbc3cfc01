// Router: softmax over the experts' logits, top-k (ties go to the lower index), optional
// renormalisation of the k probabilities. One invocation per token; at most 256 experts.
//#include common

struct Params {
    n_experts: u32,
    top_k: u32,
    renormalize: u32,
    pad: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * 64u + lid;
    if (t >= step.n_tokens) {
        return;
    }
    let base = t * p.n_experts;
    var mx = -1.0e30;
    for (var e = 0u; e < p.n_experts; e++) {
        mx = max(mx, logits[base + e]);
    }
    var total = 0.0;
    for (var e = 0u; e < p.n_experts; e++) {
        total += exp(logits[base + e] - mx);
    }
    var taken = array<u32, 8>(0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u);
    var chosen_sum = 0.0;
    for (var i = 0u; i < p.top_k; i++) {
        var best = 0u;
        var best_logit = -3.0e38;
        for (var e = 0u; e < p.n_experts; e++) {
            let free = (taken[e / 32u] & (1u << (e % 32u))) == 0u;
            if (free && logits[base + e] > best_logit) {
                best = e;
                best_logit = logits[base + e];
            }
        }
        taken[best / 32u] |= 1u << (best % 32u);
        let prob = exp(best_logit - mx) / total;
        ids[t * p.top_k + i] = best;
        weights[t * p.top_k + i] = prob;
        chosen_sum += prob;
    }
    if (p.renormalize == 1u) {
        for (var i = 0u; i < p.top_k; i++) {
            weights[t * p.top_k + i] /= chosen_sum;
        }
    }
}
