// An MoE layer's FFN input norm, router matmul and top-k in one dispatch, for CPU layouts
// (always ONE_SUBGROUP: an 8-lane workgroup that is one subgroup; the launcher,
// src/ops/norm_router.rs). One workgroup per token:
// 1. hn[t] = x[t] * rsqrt(mean(x[t]^2) + eps) * norm_w, bit-identical to rms_norm's
//    ONE_SUBGROUP (the same lanes sum the same squares, subgroupAdd, the same products);
// 2. the router logits W · hn[t] (+ ROUTER_BIAS): each lane takes every eighth k8 of the row,
//    normalises those 8 inputs and adds them into one accumulator per expert (32 experts at a
//    time), and the lanes' sums are added by subgroupAdd (W through the kernel's weight reader,
//    weights_select);
// 3. router_choice's top-k on them, the lanes' logits exchanged by subgroupShuffle (FORCED and
//    CAPTURE as there; CAPTURE keeps the step's last normalised row in hist_h[layer]).
// lavapipe charges ~0.1 ms per dispatch whatever its size: three dispatches per MoE layer become
// one.
// No loop over the accumulators may end at a bound read from the uniforms (`min(EXPERT_BLOCK,
// p.n_experts - e0)` did): lavapipe (Mesa 22.3's lvp_execute.c, update_inline_shader_state) then
// marks the shader "must inline" and, at every dispatch whose uniform buffer changed, inlines the
// uniforms' values and compiles a new LLVM shader that it never frees: ~13 ms and ~1.4 MiB per
// dispatch on the bundled model (decode 13x slower, RSS growing ~10 MiB a token). The loops run
// EXPERT_BLOCK times and test the expert instead; tests/memory_flat.rs guards it.
//#include common
//#include reduce
//#include weights_select

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;
@group(0) @binding(5) var<storage, read> norm_w: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> w: array<u32>;
@group(0) @binding(7) var<storage, read_write> hn: array<vec4<f32>>;
// The optional bindings follow in this order: logit_bias, forced, hist_h and hist_ids.
//#if ROUTER_BIAS
@group(0) @binding(8) var<storage, read> logit_bias: array<f32>;
const BIAS_BINDINGS: u32 = 1u;
//#else
const BIAS_BINDINGS: u32 = 0u;
//#endif
//#if FORCED
@group(0) @binding(8u + BIAS_BINDINGS) var<storage, read> forced: array<u32>;
const FORCED_BINDINGS: u32 = 1u;
//#else
const FORCED_BINDINGS: u32 = 0u;
//#endif
//#if CAPTURE
@group(0) @binding(8u + BIAS_BINDINGS + FORCED_BINDINGS) var<storage, read_write> hist_h: array<vec4<f32>>;
@group(0) @binding(9u + BIAS_BINDINGS + FORCED_BINDINGS) var<storage, read_write> hist_ids: array<u32>;
//#endif

//#include router_choice

// Experts whose logits are accumulated together.
const EXPERT_BLOCK: u32 = 32u;

fn logit_of(t: u32, e: u32) -> f32 {
    return subgroupShuffle(lane_logits[e / WG], e % WG);
}

// One of x[t]'s values (index i of the row).
fn x_value(t: u32, i: u32) -> f32 {
    return x[(t * p.hidden + i) / 4u][i % 4u];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= step.n_tokens) {
        return;
    }
    var s = 0.0;
    for (var i = lid; i < p.hidden; i += WG) {
        let v = x_value(t, i);
        s += v * v;
    }
    let inv = inverseSqrt(subgroupAdd(s) / f32(p.hidden) + p.eps);
    let m = WMat(0u, p.hidden, p.w_scales, p.w_mins);
    let row4 = t * (p.hidden / 4u);
    // Experts a block of accumulators at a time (a 256-entry array cost lavapipe ~0.8 s of
    // shader compilation); the inputs are normalised again per block, written once.
    for (var e0 = 0u; e0 < p.n_experts; e0 += EXPERT_BLOCK) {
        var acc: array<f32, EXPERT_BLOCK>;
        for (var k8 = lid; k8 < p.hidden / 8u; k8 += WG) {
            let xa = x[row4 + 2u * k8] * inv * norm_w[2u * k8];
            let xb = x[row4 + 2u * k8 + 1u] * inv * norm_w[2u * k8 + 1u];
            if (e0 == 0u) {
                hn[row4 + 2u * k8] = xa;
                hn[row4 + 2u * k8 + 1u] = xb;
//#if CAPTURE
                if (t + 1u == step.n_tokens) {
                    let h4 = p.layer * (p.hidden / 4u) + 2u * k8;
                    hist_h[h4] = xa;
                    hist_h[h4 + 1u] = xb;
                }
//#endif
            }
            for (var j = 0u; j < EXPERT_BLOCK; j++) {
                if (e0 + j < p.n_experts) {
                    let v = w_load8(m, e0 + j, k8);
                    acc[j] += dot(v.a, xa) + dot(v.b, xb);
                }
            }
        }
        for (var j = 0u; j < EXPERT_BLOCK; j++) {
            let e = e0 + j;
            if (e >= p.n_experts) {
                break;
            }
            var logit = subgroupAdd(acc[j]);
//#if ROUTER_BIAS
            logit += logit_bias[e];
//#endif
            if (e % WG == lid) {
                lane_logits[e / WG] = logit;
            }
        }
    }
    choose_experts(t, lid);
}
