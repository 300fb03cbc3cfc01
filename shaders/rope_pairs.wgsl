// RoPE's pairs, shared by rope and kv_store's ROPE variant. The including kernel has
// `p.rotary_dim`, `p.interleaved` and the host tables `cos_table` / `sin_table`
// ([max_positions, rotary_dim / 2]). Pair j of a head is (j, j + rotary_dim/2) (rotate-half /
// NeoX) or (2j, 2j + 1) when `interleaved` (DeepSeek), from the head's first rotated value.

// Where one buffer's rotated values sit (the launcher: RopeLayout).
struct Layout {
    n_heads: u32,
    head_stride: u32,
    row_stride: u32,
    offset: u32,
    at_cache_pos: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

// Pair i of layout l: the indices of its two values and its cos, sin.
struct Pair {
    a: u32,
    b: u32,
    c: f32,
    s: f32,
}

fn pair_at(l: Layout, i: u32) -> Pair {
    let half_dim = p.rotary_dim / 2u;
    let t = i / (l.n_heads * half_dim);
    let h = (i / half_dim) % l.n_heads;
    let j = i % half_dim;
    let pos = step.pos + t;
    let row = t + l.at_cache_pos * step.pos;
    let base = row * l.row_stride + h * l.head_stride + l.offset;
    var a = base + j;
    var b = base + j + half_dim;
    if (p.interleaved == 1u) {
        a = base + 2u * j;
        b = a + 1u;
    }
    let cs = angle(pos, j);
    return Pair(a, b, cs.x, cs.y);
}

// (cos, sin) of pair j's angle at position `pos`.
fn angle(pos: u32, j: u32) -> vec2<f32> {
    let half_dim = p.rotary_dim / 2u;
    return vec2<f32>(cos_table[pos * half_dim + j], sin_table[pos * half_dim + j]);
}

// The pair (x1, x2) rotated by the angle of cosine c and sine s.
fn rotated(c: f32, s: f32, x1: f32, x2: f32) -> vec2<f32> {
    return vec2<f32>(x1 * c - x2 * s, x2 * c + x1 * s);
}
