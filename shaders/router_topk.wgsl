// Router: softmax over the experts' logits, top-k (ties go to the lower index), optional
// renormalisation of the k weights, times routed_scale, as router_choice chooses them from
// logits another kernel computed (the router matmul after the FFN norm).
// FORCED and CAPTURE (the prerouter's) as router_choice describes them; CAPTURE also copies the
// step's last token's FFN input `hn` into hist_h[layer].
//#include common
//#include reduce

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

//#include router_choice

// Expert e's logit: with ONE_SUBGROUP from the lane that holds it (on lavapipe, reading the
// buffer at a forced expert's index from inside router_choice made the FORCED variant ~20x
// slower, 4 ms a dispatch); the same value either way.
fn logit_of(t: u32, e: u32) -> f32 {
//#if ONE_SUBGROUP
    return subgroupShuffle(lane_logits[e / WG], e % WG);
//#else
    return logits[t * p.n_experts + e];
//#endif
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= step.n_tokens) {
        return;
    }
    for (var j = 0u; j < EPL; j++) {
        let e = lid + WG * j;
        if (e < p.n_experts) {
            lane_logits[j] = logits[t * p.n_experts + e];
        }
    }
    choose_experts(t, lid);
//#if CAPTURE
    if (t + 1u == step.n_tokens) {
        for (var i = lid; i < p.hidden; i += WG) {
            hist_h[p.layer * p.hidden + i] = hn[t * p.hidden + i];
        }
    }
//#endif
}
