// Teacher-forced scoring: out[t] = logits[t, targets[t]] - logsumexp(logits[t, :]), or a NaN
// (written as bits) when any of the token's logits is NaN or infinite. One workgroup per token.
//#include common
//#include reduce

struct Params {
    vocab: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read> targets: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= step.n_tokens) {
        return;
    }
    let base = t * p.vocab;
    var mx = -3.0e38;
    var bad = 0.0;
    for (var i = lid; i < p.vocab; i += WG) {
        let v = logits[base + i];
        mx = max(mx, v);
        bad = max(bad, non_finite(v));
    }
    mx = reduce_max(lid, mx);
    bad = reduce_max(lid, bad);
    var s = 0.0;
    for (var i = lid; i < p.vocab; i += WG) {
        s += exp(logits[base + i] - mx);
    }
    s = reduce_sum(lid, s);
    if (lid == 0u) {
        out[t] = select(logits[base + targets[t]] - mx - log(s), bitcast<f32>(0x7fc00000u), bad > 0.0);
    }
}
