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

// Logits i .. i + 3 of the row at `base` (i < vocab), -3e38 past the row's end.
fn four(base: u32, i: u32) -> vec4<f32> {
    let last = p.vocab - 1u;
    let at = vec4<u32>(i, i + 1u, i + 2u, i + 3u);
    let v = vec4<f32>(
        logits[base + i],
        logits[base + min(at.y, last)],
        logits[base + min(at.z, last)],
        logits[base + min(at.w, last)]
    );
    return select(vec4<f32>(-3.0e38), v, at <= vec4<u32>(last));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg);
    if (t >= step.n_tokens) {
        return;
    }
    let base = t * p.vocab;
    // Four logits an iteration (those past the row read as -3e38, which count for nothing):
    // lavapipe stops an invocation's loops after 65535 iterations in all, which one an
    // iteration passed at a 262,144-token vocabulary in 8-lane workgroups.
    var mx = -3.0e38;
    var bad = 0.0;
    for (var i = lid * 4u; i < p.vocab; i += WG * 4u) {
        let v = four(base, i);
        mx = max(mx, max(max(v.x, v.y), max(v.z, v.w)));
        bad = max(bad, max(max(non_finite(v.x), non_finite(v.y)), max(non_finite(v.z), non_finite(v.w))));
    }
    mx = reduce_max(lid, mx);
    bad = reduce_max(lid, bad);
    var s = 0.0;
    for (var i = lid * 4u; i < p.vocab; i += WG * 4u) {
        let e = exp(four(base, i) - vec4<f32>(mx));
        s += (e.x + e.y) + (e.z + e.w);
    }
    s = reduce_sum(lid, s);
    if (lid == 0u) {
        out[t] = select(logits[base + targets[t]] - mx - log(s), bitcast<f32>(0x7fc00000u), bad > 0.0);
    }
}
