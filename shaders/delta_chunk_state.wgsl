// The chunked gated delta rule, second part: chunk `p.chunk` of the step over the recurrent
// state, from the scratch delta_chunk_prep wrote (see there); one dispatch per chunk, in order,
// one workgroup per (value head h, block of 64 columns of its state S [dk, dv]):
//   V = U - W S;   out = Qg S + Aqk V;   S = D S + Kd^T V   (D per key channel).
// The columns of S never mix (every product above keeps them apart), so each invocation owns
// two columns, j and j + 64: their S and V stay in its registers, four rows to a vec4, and every
// scratch value it reads is the same for all invocations (one broadcast load, four values at a
// time, feeding both columns); no workgroup memory, no barriers. A dispatch per chunk rather than
// a loop over them keeps each invocation's loop iterations bounded (lavapipe stops an
// invocation's loops after 65535 iterations in all).
//#include common
//#include delta_gates

// f32 as vec4 (dk and dv are multiples of 4, so is every offset into it but U's).
@group(0) @binding(2) var<storage, read> scratch: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn scratch_at(i: u32) -> f32 {
    return scratch[i / 4u][i % 4u];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let blocks = (p.dv + 127u) / 128u;
    let group = group_index(wid, nwg);
    let h = group / blocks;
    // Columns j and j + 64 (the second may be past dv: then it is computed on zeros and never
    // stored).
    let j = (group % blocks) * 128u + lid;
    if (h >= p.v_heads || j >= p.dv || p.chunk * CHUNK >= step.n_tokens) {
        return;
    }
    let two = j + 64u < p.dv;
    let s0 = h * p.dk * p.dv + j;
    let dk4 = p.dk / 4u;
    // S[:, j] and S[:, j + 64] (MAX_LINEAR_KEY_DIM rows), V's two columns, four rows to a vec4.
    var s: array<vec4<f32>, 64>;
    var s2: array<vec4<f32>, 64>;
    var v: array<vec4<f32>, 8>;
    var v2: array<vec4<f32>, 8>;
    for (var d = 0u; d < dk4; d++) {
        let at = s0 + 4u * d * p.dv;
        s[d] = vec4<f32>(state[at], state[at + p.dv], state[at + 2u * p.dv], state[at + 3u * p.dv]);
        s2[d] = vec4<f32>(0.0);
        if (two) {
            let at2 = at + 64u;
            s2[d] = vec4<f32>(state[at2], state[at2 + p.dv], state[at2 + 2u * p.dv], state[at2 + 3u * p.dv]);
        }
    }
    let part = p.chunks * p.v_heads * CHUNK;
    let value_dim = p.v_heads * p.dv;
    let t0 = p.chunk * CHUNK;
    let rows = min(CHUNK, step.n_tokens - t0);
    let block = (p.chunk * p.v_heads + h) * CHUNK;
    // In vec4s, but U's (scalar: one column).
    let w_at = block * dk4;
    let u_at = part * p.dk + block * p.dv + j;
    let qg_at = (part * (p.dk + p.dv) + block * p.dk) / 4u;
    let kd_at = (part * (2u * p.dk + p.dv) + block * p.dk) / 4u;
    let aqk_at = (part * (3u * p.dk + p.dv) + block * CHUNK) / 4u;
    let d_at = (part * (3u * p.dk + p.dv + CHUNK) + (p.chunk * p.v_heads + h) * p.dk) / 4u;
    // Four rows at a time; rows past the step's are 0 in U, W, Qg, Aqk and Kd, so a last group
    // may run past them.
    let groups = (rows + 3u) / 4u;
    // V = U - W S and out = Qg S + Aqk V (Aqk is 0 above its diagonal), a group of rows after
    // the other: a group's out needs V of its own and earlier groups.
    for (var g = 0u; g < groups; g++) {
        let r = 4u * g;
        let u = u_at + r * p.dv;
        var acc = vec4<f32>(scratch_at(u), scratch_at(u + p.dv), scratch_at(u + 2u * p.dv), scratch_at(u + 3u * p.dv));
        var acc2 = vec4<f32>(0.0);
        if (two) {
            let u2 = u + 64u;
            acc2 = vec4<f32>(scratch_at(u2), scratch_at(u2 + p.dv), scratch_at(u2 + 2u * p.dv), scratch_at(u2 + 3u * p.dv));
        }
        var o = vec4<f32>(0.0);
        var o2 = vec4<f32>(0.0);
        let w = w_at + r * dk4;
        let q = qg_at + r * dk4;
        for (var d = 0u; d < dk4; d++) {
            let sd = s[d];
            let sd2 = s2[d];
            let w0 = scratch[w + d];
            let w1 = scratch[w + dk4 + d];
            let w2 = scratch[w + 2u * dk4 + d];
            let w3 = scratch[w + 3u * dk4 + d];
            acc -= vec4<f32>(dot(w0, sd), dot(w1, sd), dot(w2, sd), dot(w3, sd));
            acc2 -= vec4<f32>(dot(w0, sd2), dot(w1, sd2), dot(w2, sd2), dot(w3, sd2));
            let q0 = scratch[q + d];
            let q1 = scratch[q + dk4 + d];
            let q2 = scratch[q + 2u * dk4 + d];
            let q3 = scratch[q + 3u * dk4 + d];
            o += vec4<f32>(dot(q0, sd), dot(q1, sd), dot(q2, sd), dot(q3, sd));
            o2 += vec4<f32>(dot(q0, sd2), dot(q1, sd2), dot(q2, sd2), dot(q3, sd2));
        }
        v[g] = acc;
        v2[g] = acc2;
        let a = aqk_at + r * (CHUNK / 4u);
        for (var i = 0u; i <= g; i++) {
            let a0 = scratch[a + i];
            let a1 = scratch[a + CHUNK / 4u + i];
            let a2 = scratch[a + 2u * (CHUNK / 4u) + i];
            let a3 = scratch[a + 3u * (CHUNK / 4u) + i];
            let vi = v[i];
            let vi2 = v2[i];
            o += vec4<f32>(dot(a0, vi), dot(a1, vi), dot(a2, vi), dot(a3, vi));
            o2 += vec4<f32>(dot(a0, vi2), dot(a1, vi2), dot(a2, vi2), dot(a3, vi2));
        }
        for (var x = 0u; x < min(4u, rows - r); x++) {
            let at = (t0 + r + x) * value_dim + h * p.dv + j;
            out[at] = o[x];
            if (two) {
                out[at + 64u] = o2[x];
            }
        }
    }
    // S = D S + Kd^T V.
    for (var d = 0u; d < dk4; d++) {
        let decay = scratch[d_at + d];
        var x = decay * s[d];
        var x2 = decay * s2[d];
        for (var g = 0u; g < groups; g++) {
            let k = kd_at + 4u * g * dk4 + d;
            let k0 = scratch[k];
            let k1 = scratch[k + dk4];
            let k2 = scratch[k + 2u * dk4];
            let k3 = scratch[k + 3u * dk4];
            let vg = v[g];
            let vg2 = v2[g];
            x += k0 * vg.x + k1 * vg.y + k2 * vg.z + k3 * vg.w;
            x2 += k0 * vg2.x + k1 * vg2.y + k2 * vg2.z + k3 * vg2.w;
        }
        s[d] = x;
        s2[d] = x2;
    }
    for (var d = 0u; d < dk4; d++) {
        let at = s0 + 4u * d * p.dv;
        state[at] = s[d].x;
        state[at + p.dv] = s[d].y;
        state[at + 2u * p.dv] = s[d].z;
        state[at + 3u * p.dv] = s[d].w;
        if (two) {
            let at2 = at + 64u;
            state[at2] = s2[d].x;
            state[at2 + p.dv] = s2[d].y;
            state[at2 + 2u * p.dv] = s2[d].z;
            state[at2 + 3u * p.dv] = s2[d].w;
        }
    }
}
