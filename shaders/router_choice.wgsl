// router_topk's top-k choice: softmax (or SIGMOID scores) over one
// token's router logits, optional expert groups (GROUPS), k rounds of argmax (ties go to the
// lower index), optional renormalisation, times routed_scale. One workgroup of WG lanes per
// token (reduce: 64, or 8 with ONE_SUBGROUP); lane `lid` holds the logits of experts
// lid + WG * j (at most 256 experts in all) in `lane_logits`, which the kernel fills
// before calling choose_experts, and defines `fn logit_of(t: u32, e: u32) -> f32`, expert e's
// logit for token t (e is the same in every lane). Every step is a workgroup reduction, with no
// per-lane loops over all experts (lavapipe compiled the old one-lane-per-token version into a
// pathologically slow shader).
// SIGMOID (DeepSeek-V3 / GLM-4.5 noaux_tc): weights are sigmoid(logit), experts are chosen by
// sigmoid(logit) + bias[e] (the correction bias, a static parameter).
// GROUPS (n_group > 1, any variant): experts form n_group equal groups; a group's score is its
// best choice value (softmax: its best logit, the same order as its best probability) or, with
// SIGMOID, the sum of its two best; experts are chosen only within the best topk_group groups
// (ties to the lower group index).
// A token any of whose logits is NaN or infinite is routed to experts 0..k-1 with NaN weights,
// so the poison reaches its logits (which the engine refuses) instead of routing it to
// nothing or to whatever lost every comparison with a NaN.
// FORCED (the prerouter's prediction-as-routing): the k experts are read from
// forced[forced_offset..] instead of chosen, and their probabilities come from this softmax.
// Renormalised, they are taken relative to the best forced logit instead of the router's maximum
// (the same weights), so forced experts far below the router's best do not all underflow to 0
// (0/0 = NaN). CAPTURE (prerouter heads attached): also keeps the ids the heads read at the end
// of the step, for MoE layer ordinal `layer`: the step's last token's routed ids (hist_ids cur
// block) and those of the token before (prev block: the step's second-to-last token, or the
// previous step's last token); the including kernel keeps the FFN input (hist_h). Ids
// 0xffffffff mean "no token".

struct Params {
    n_experts: u32,
    top_k: u32,
    renormalize: u32,
    forced_offset: u32,
    // Hidden size: CAPTURE's FFN input rows.
    hidden: u32,
    layer: u32,
    moe_layers: u32,
    n_group: u32,
    topk_group: u32,
    routed_scale: f32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
    pad3: u32,
    pad4: u32,
    pad5: u32,
    // SIGMOID: the correction bias of expert 4i + j in bias[i][j].
    bias: array<vec4<f32>, 64>,
}

@group(0) @binding(1) var<uniform> p: Params;

const NONE: f32 = -3.0e38;

// Experts per lane.
const EPL: u32 = 256u / WG;

// This lane's logits: expert lid + WG * j in lane_logits[j] (for those below n_experts).
var<private> lane_logits: array<f32, EPL>;

//#if GROUPS
// Choice values of this token's experts and which groups are kept.
var<workgroup> choice_sh: array<f32, 256>;
var<workgroup> group_sh: array<f32, 256>;
//#endif

// An expert's routing weight before renormalisation.
fn score(logit: f32, mx: f32, total: f32) -> f32 {
//#if SIGMOID
    return 1.0 / (1.0 + exp(-logit));
//#else
    return exp(logit - mx) / total;
//#endif
}

// Token t's experts into ids[t * top_k ..] and their weights into weights[t * top_k ..].
fn choose_experts(t: u32, lid: u32) {
    // vals: what experts are chosen by (the logit, or with SIGMOID the biased sigmoid score).
    var vals: array<f32, EPL>;
    var local_max = NONE;
    var local_bad = 0.0;
    for (var j = 0u; j < EPL; j++) {
        vals[j] = NONE;
        let e = lid + WG * j;
        if (e < p.n_experts) {
            let logit = lane_logits[j];
            local_max = max(local_max, logit);
            local_bad = max(local_bad, non_finite(logit));
            vals[j] = logit;
//#if SIGMOID
            vals[j] = 1.0 / (1.0 + exp(-logit)) + p.bias[e / 4u][e % 4u];
//#endif
        }
    }
    let mx = reduce_max(lid, local_max);
    let poisoned = reduce_max(lid, local_bad) > 0.0;
    var local_sum = 0.0;
    for (var j = 0u; j < EPL; j++) {
        if (lid + WG * j < p.n_experts) {
            local_sum += exp(lane_logits[j] - mx);
        }
    }
    let total = reduce_sum(lid, local_sum);
//#if GROUPS
    {
        let per = p.n_experts / p.n_group;
        for (var j = 0u; j < EPL; j++) {
            choice_sh[lid + WG * j] = vals[j];
        }
        workgroupBarrier();
        // Lane g scores group g: its best choice value (SIGMOID: the sum of its best two).
        for (var g = lid; g < p.n_group; g += WG) {
            var b1 = NONE;
            var b2 = NONE;
            for (var e = g * per; e < (g + 1u) * per; e++) {
                let v = choice_sh[e];
                if (v > b1) {
                    b2 = b1;
                    b1 = v;
                } else if (v > b2) {
                    b2 = v;
                }
            }
            group_sh[g] = b1;
//#if SIGMOID
            group_sh[g] = b1 + b2;
//#endif
        }
        workgroupBarrier();
        // An expert stays when fewer than topk_group groups beat its group.
        for (var j = 0u; j < EPL; j++) {
            let e = lid + WG * j;
            if (e < p.n_experts) {
                let g = e / per;
                var better = 0u;
                for (var o = 0u; o < p.n_group; o++) {
                    if (group_sh[o] > group_sh[g] || (group_sh[o] == group_sh[g] && o < g)) {
                        better++;
                    }
                }
                if (better >= p.topk_group) {
                    vals[j] = NONE;
                }
            }
        }
    }
//#endif
    var chosen_max = mx;
//#if FORCED
    if (p.renormalize == 1u) {
        chosen_max = NONE;
        for (var i = 0u; i < p.top_k; i++) {
            chosen_max = max(chosen_max, logit_of(t, forced[p.forced_offset + i]));
        }
    }
//#endif
    var chosen_sum = 0.0;
    for (var i = 0u; i < p.top_k; i++) {
//#if FORCED
        var winner = forced[p.forced_offset + i];
//#else
        // This lane's best untaken expert (lowest index among equals).
        var bv = NONE;
        var bi = 0xffffffffu;
        for (var j = 0u; j < EPL; j++) {
            if (vals[j] > bv) {
                bv = vals[j];
                bi = lid + WG * j;
            }
        }
        let best = reduce_argmax(lid, bv, bi);
        var winner = best.i;
        if (winner < p.n_experts && winner % WG == lid) {
            vals[winner / WG] = NONE;
        }
//#endif
        var prob = 0.0;
        if (poisoned) {
            winner = i;
            prob = bitcast<f32>(0x7fc00000u);
        } else {
            prob = score(logit_of(t, winner), chosen_max, total);
        }
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
    if (lid == 0u) {
        for (var i = 0u; i < p.top_k; i++) {
            var w = weights[t * p.top_k + i];
            if (p.renormalize == 1u) {
                w /= chosen_sum;
            }
            weights[t * p.top_k + i] = w * p.routed_scale;
        }
    }
}
