// Prerouter history: after MoE layer `layer`'s routing, keeps what the heads read at the end of
// the step: the step's last token's FFN input (hist_h[layer]) and routed ids (hist_ids cur
// block), and the ids of the token before (prev block: the step's second-to-last token, or the
// previous step's last token). Ids of 0xffffffff mean "no token" (a sequence start).
// One workgroup of 64.
//#include common

struct Params {
    hidden: u32,
    top_k: u32,
    layer: u32,
    moe_layers: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> hn: array<f32>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> hist_h: array<f32>;
@group(0) @binding(5) var<storage, read_write> hist_ids: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    let last = step.n_tokens - 1u;
    for (var i = lid; i < p.hidden; i += 64u) {
        hist_h[p.layer * p.hidden + i] = hn[last * p.hidden + i];
    }
    if (lid < p.top_k) {
        let cur = p.layer * p.top_k + lid;
        let prev = p.moe_layers * p.top_k + cur;
        if (last >= 1u) {
            hist_ids[prev] = ids[(last - 1u) * p.top_k + lid];
        } else {
            hist_ids[prev] = hist_ids[cur];
        }
        hist_ids[cur] = ids[last * p.top_k + lid];
    }
}
