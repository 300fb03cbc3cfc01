// Greedy pick: index of the largest logit of the step's last token (the lowest index among
// equals). One workgroup.
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
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    let base = (step.n_tokens - 1u) * p.vocab;
    var bv = -3.0e38;
    var bi = 0xffffffffu;
    for (var i = lid; i < p.vocab; i += 64u) {
        let v = logits[base + i];
        if (v > bv) {
            bv = v;
            bi = i;
        }
    }
    let best = reduce_argmax(lid, bv, bi);
    if (lid == 0u) {
        out[0] = best.i;
    }
}
