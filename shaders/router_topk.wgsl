// Router: softmax over the experts' logits, top-k (ties go to the lower index), optional
// renormalisation of the k weights, times routed_scale, as router_choice chooses them from
// logits another kernel computed (the router matmul; CPU layouts fuse the three into
// norm_router where no prerouter routes).
// Variant FORCED (the prerouter's prediction-as-routing): the k experts are not chosen here but
// read from forced[forced_offset..], and their probabilities come from this softmax. Renormalised,
// they are taken relative to the best forced logit instead of the router's maximum (the same
// weights), so forced experts far below the router's best do not all underflow to 0 (0/0 = NaN).
// Variant CAPTURE (prerouter heads attached): also keeps what the heads read at the end of the
// step, for MoE layer ordinal `layer`: the step's last token's FFN input (hist_h[layer]) and
// routed ids (hist_ids cur block), and the ids of the token before (prev block: the step's
// second-to-last token, or the previous step's last token). Ids 0xffffffff mean "no token".
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

fn logit_of(t: u32, e: u32) -> f32 {
    return logits[t * p.n_experts + e];
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
            lane_logits[j] = logit_of(t, e);
        }
    }
    choose_experts(t, lid);
}
