// The merge of split-K (flash-decoding) partials, shared by attention_merge and mla_merge. Split
// s of head h left, at (s * n_heads + h) * stride in `partial` (declared by the including
// kernel): its max m_s, its sum l_s, then stride - 2 accumulator values a_s. The splits merge
// as M = max m_s, L = sum l_s e^(m_s - M), value d = sum a_s[d] e^(m_s - M) / L.

struct Splits {
    h: u32,
    n_heads: u32,
    stride: u32,
    count: u32,
}

fn split_base(sp: Splits, s: u32) -> u32 {
    return (s * sp.n_heads + sp.h) * sp.stride;
}

// M, starting from `floor` (a sink logit, or -1e30).
fn merged_max(sp: Splits, floor: f32) -> f32 {
    var m = floor;
    for (var s = 0u; s < sp.count; s++) {
        m = max(m, partial[split_base(sp, s)]);
    }
    return m;
}

// L, starting from `l0` (a sink's e^(sink - M), or 0).
fn merged_sum(sp: Splits, big_m: f32, l0: f32) -> f32 {
    var l = l0;
    for (var s = 0u; s < sp.count; s++) {
        let base = split_base(sp, s);
        l += partial[base + 1u] * exp(partial[base] - big_m);
    }
    return l;
}

// sum a_s[d] e^(m_s - M) (not yet divided by L).
fn merged_acc(sp: Splits, big_m: f32, d: u32) -> f32 {
    var a = 0.0;
    for (var s = 0u; s < sp.count; s++) {
        let base = split_base(sp, s);
        a += partial[base + 2u + d] * exp(partial[base] - big_m);
    }
    return a;
}
