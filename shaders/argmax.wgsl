// Greedy pick: index of the largest logit of the step's last token (the lowest index among
// equals), or 0xffffffff when any logit is NaN or infinite. One workgroup. VEC4 (vocab a multiple
// of 4): each lane loads four logits at a time, a quarter of the dependent loads. NOISE (a
// sampled MTP draft): the largest logit over the temperature plus each token's Gumbel noise under
// a key, as util::rng::token_noise computes it on the host.
//#include common
//#include reduce

struct Params {
    vocab: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
//#if VEC4
@group(0) @binding(2) var<storage, read> logits: array<vec4<f32>>;
//#else
@group(0) @binding(2) var<storage, read> logits: array<f32>;
//#endif
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

//#if NOISE
// The key's low and high 32 bits, and 1 / temperature (f32 bits).
@group(0) @binding(4) var<storage, read> noise: array<u32, 4>;

// lowbias32.
fn hash_mix(x: u32) -> u32 {
    var h = x;
    h ^= h >> 16u;
    h *= 0x7feb352du;
    h ^= h >> 15u;
    h *= 0x846ca68bu;
    return h ^ (h >> 16u);
}

fn value(v: f32, id: u32) -> f32 {
    let k = hash_mix(noise[0] ^ hash_mix(noise[1]));
    let h = hash_mix(hash_mix(k ^ id) ^ noise[1]);
    let u = (f32(h >> 8u) + 0.5) / 16777216.0;
    return v * bitcast<f32>(noise[2]) - log(-log(u));
}
//#else
fn value(v: f32, id: u32) -> f32 {
    return v;
}
//#endif

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    let base = (step.n_tokens - 1u) * p.vocab;
    var bv = -3.0e38;
    var bi = 0xffffffffu;
    var bad = 0.0;
//#if VEC4
    for (var i = lid; i < p.vocab / 4u; i += WG) {
        let v4 = logits[base / 4u + i];
        for (var c = 0u; c < 4u; c++) {
            let v = v4[c];
            bad = max(bad, non_finite(v));
            let x = value(v, 4u * i + c);
            if (x > bv) {
                bv = x;
                bi = 4u * i + c;
            }
        }
    }
//#else
    for (var i = lid; i < p.vocab; i += WG) {
        let v = logits[base + i];
        bad = max(bad, non_finite(v));
        let x = value(v, i);
        if (x > bv) {
            bv = x;
            bi = i;
        }
    }
//#endif
    let best = reduce_argmax(lid, bv, bi);
    let any_bad = reduce_max(lid, bad);
    if (lid == 0u) {
        out[0] = select(best.i, 0xffffffffu, any_bad > 0.0);
    }
}
