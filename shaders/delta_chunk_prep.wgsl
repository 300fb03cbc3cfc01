// The chunked gated delta rule, first part (the WY / UT transform of each chunk; transformers'
// `torch_chunk_gated_delta_rule` and flash-linear-attention's chunked kernels write the same
// form): one workgroup per (chunk of CHUNK tokens, value head h), all chunks at once. With q, k
// L2-normalised (q also by 1/sqrt(dk)), beta = sigmoid(b), G the log-decays summed from the
// chunk's first token (per head; KDA: per key channel) and Γ(i, j) = exp(G_i - G_j) (j <= i):
//   A = strictly lower beta_i (k_i . k_j) Γ(i, j),   T = (I + A)^-1 (forward substitution);
//   W = T (beta k exp(G)),   U = T (beta v),   Qg = q exp(G),   Kd = k exp(G_last - G);
//   Aqk = lower (with the diagonal) (q_i . k_j) Γ(i, j),   D = exp(G_last).
// KDA's Γ is per channel, inside the dot products. The state part (delta_chunk_state) then runs
// the chunks in order: V = U - W S, out = Qg S + Aqk V, S = D S + Kd^T V. Every exponent is at
// most 0 (see delta_gates), so nothing overflows. Rows past the step's tokens are zero.
//
// Scratch, f32, each part [chunks, v_heads, CHUNK, width] (width dk: W, Qg, Kd; dv: U; CHUNK:
// Aqk), then D [chunks, v_heads, dk]; KDA keeps G in Kd's place until Kd is written.
//#include common
//#include delta_gates

// f32 as vec4 (dk, dv and so the row stride are multiples of 4).
@group(0) @binding(2) var<storage, read> conv: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> proj: array<f32>;
// A_log [v_heads] then dt_bias [v_heads] (KDA: [v_heads * dk]).
@group(0) @binding(4) var<storage, read> decay_params: array<f32>;
@group(0) @binding(5) var<storage, read_write> scratch: array<f32>;

var<workgroup> q_inv: array<f32, CHUNK>;
var<workgroup> k_inv: array<f32, CHUNK>;
var<workgroup> betas: array<f32, CHUNK>;
// Gated DeltaNet: each token's log-decay, then their sums from the chunk's start.
var<workgroup> g_sum: array<f32, CHUNK>;
// KDA: G of the chunk's last token per key channel (MAX_LINEAR_KEY_DIM).
var<workgroup> g_last: array<f32, 256>;
// A, then T less its unit diagonal (0 on and above it), row-major [CHUNK, CHUNK], four to a
// vec4.
var<workgroup> m: array<vec4<f32>, 256>;

fn conv_at(i: u32) -> f32 {
    return conv[i / 4u][i % 4u];
}

// v with component c set to x. FXC cannot compile a loop that writes a private vector's
// component at an index known only at run time (it tries to unroll the loop: error X3511).
fn with_lane(v: vec4<f32>, c: u32, x: f32) -> vec4<f32> {
    return select(v, vec4<f32>(x), vec4<u32>(0u, 1u, 2u, 3u) == vec4<u32>(c));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let group = group_index(wid, nwg);
    let c = group / p.v_heads;
    let h = group % p.v_heads;
    let t0 = c * CHUNK;
    if (t0 >= step.n_tokens) {
        return;
    }
    let rows = min(CHUNK, step.n_tokens - t0);
    let kh = h / (p.v_heads / p.k_heads);
    let key_dim = p.k_heads * p.dk;
    let a_exp = exp(decay_params[h]);
    let block = (c * p.v_heads + h) * CHUNK;
    let part = p.chunks * p.v_heads * CHUNK;
    let w_at = block * p.dk;
    let u_at = part * p.dk + block * p.dv;
    let qg_at = part * (p.dk + p.dv) + block * p.dk;
    let kd_at = part * (2u * p.dk + p.dv) + block * p.dk;
    let aqk_at = part * (3u * p.dk + p.dv) + block * CHUNK;
    let d_at = part * (3u * p.dk + p.dv + CHUNK) + (c * p.v_heads + h) * p.dk;

    // Norms (lanes 0..CHUNK: q of row lid, the rest: k of row lid - CHUNK), beta, decay.
    let r = lid % CHUNK;
    var norm_inv = 0.0;
    if (r < rows) {
        let at = ((t0 + r) * p.conv_stride + (lid / CHUNK) * key_dim + kh * p.dk) / 4u;
        var ss = 0.0;
        for (var i = 0u; i < p.dk / 4u; i++) {
            let x = conv[at + i];
            ss += dot(x, x);
        }
        norm_inv = 1.0 / sqrt(ss + 1e-6);
    }
    if (lid < CHUNK) {
        q_inv[r] = norm_inv / sqrt(f32(p.dk));
        var beta = 0.0;
        var g = 0.0;
        if (r < rows) {
            let gates = (t0 + r) * p.in_stride + p.gate_offset;
            beta = delta_beta(proj[gates + h]);
//#if KDA
//#else
            g = log_decay(proj[gates + p.v_heads + h] + decay_params[p.v_heads + h], a_exp, p.lower_bound);
//#endif
        }
        betas[r] = beta;
        g_sum[r] = g;
    } else {
        k_inv[r] = norm_inv;
    }
//#if KDA
    for (var i = lid; i < p.dk; i += 64u) {
        var g = 0.0;
        for (var t = 0u; t < rows; t++) {
            let x = proj[(t0 + t) * p.in_stride + p.gate_offset + p.v_heads + h * p.dk + i];
            g += log_decay(x + decay_params[p.v_heads + h * p.dk + i], a_exp, p.lower_bound);
            scratch[kd_at + t * p.dk + i] = g;
        }
        g_last[i] = g;
    }
    storageBarrier();
//#else
    workgroupBarrier();
    if (lid == 0u) {
        for (var t = 1u; t < CHUNK; t++) {
            g_sum[t] += g_sum[t - 1u];
        }
    }
//#endif
    workgroupBarrier();

    // A (strictly lower, into m) and Aqk (lower with the diagonal, into the scratch).
    for (var e = lid; e < CHUNK * CHUNK; e += 64u) {
        let i = e / CHUNK;
        let j = e % CHUNK;
        var a = 0.0;
        var aq = 0.0;
        if (j <= i && i < rows) {
            let ki = ((t0 + i) * p.conv_stride + key_dim + kh * p.dk) / 4u;
            let kj = ((t0 + j) * p.conv_stride + key_dim + kh * p.dk) / 4u;
            let qi = ((t0 + i) * p.conv_stride + kh * p.dk) / 4u;
            var kk = 0.0;
            var qk = 0.0;
            for (var d = 0u; d < p.dk / 4u; d++) {
//#if KDA
                let gi = kd_at + i * p.dk + 4u * d;
                let gj = kd_at + j * p.dk + 4u * d;
                let gi4 = vec4<f32>(scratch[gi], scratch[gi + 1u], scratch[gi + 2u], scratch[gi + 3u]);
                let gj4 = vec4<f32>(scratch[gj], scratch[gj + 1u], scratch[gj + 2u], scratch[gj + 3u]);
                let x = conv[kj + d] * exp(gi4 - gj4);
//#else
                let x = conv[kj + d];
//#endif
                kk += dot(conv[ki + d], x);
                qk += dot(conv[qi + d], x);
            }
//#if KDA
            let decay = 1.0;
//#else
            let decay = exp(g_sum[i] - g_sum[j]);
//#endif
            let kj_inv = k_inv[j] * decay;
            a = select(0.0, betas[i] * k_inv[i] * kj_inv * kk, j < i);
            aq = q_inv[i] * kj_inv * qk;
        }
        m[e / 4u][e % 4u] = a;
        scratch[aqk_at + e] = aq;
    }
    workgroupBarrier();

    // T = (I + A)^-1 by rows: T[i][j] = -(A[i][j] + sum_{j < k < i} A[i][k] T[k][j]). The k
    // loop runs on every lane, the same count (FXC rejects a barrier after a loop that only
    // some lanes run or leave early, error X3663).
    for (var i = 1u; i < rows; i++) {
        var t = 0.0;
        if (lid < i) {
            t = m[(i * CHUNK + lid) / 4u][lid % 4u];
        }
        for (var k = 1u; k < i; k++) {
            if (k > lid) {
                t += m[(i * CHUNK + k) / 4u][k % 4u] * m[(k * CHUNK + lid) / 4u][lid % 4u];
            }
        }
        workgroupBarrier();
        if (lid < i) {
            m[(i * CHUNK + lid) / 4u][lid % 4u] = -t;
        }
        workgroupBarrier();
    }

    // Per key channel: Qg, Kd, D and W = T (beta k exp(G)).
    for (var d = lid; d < p.dk; d += 64u) {
//#if KDA
        let gl = g_last[d];
//#else
        let gl = g_sum[rows - 1u];
//#endif
        var kb: array<vec4<f32>, CHUNK / 4u>;
        for (var t = 0u; t < CHUNK; t++) {
            var qg = 0.0;
            var kd = 0.0;
            var kbt = 0.0;
            if (t < rows) {
//#if KDA
                let g = scratch[kd_at + t * p.dk + d];
//#else
                let g = g_sum[t];
//#endif
                let row = (t0 + t) * p.conv_stride + kh * p.dk + d;
                let k = conv_at(row + key_dim) * k_inv[t];
                let decay = exp(g);
                kbt = betas[t] * k * decay;
                qg = conv_at(row) * q_inv[t] * decay;
                kd = k * exp(gl - g);
            }
            kb[t / 4u] = with_lane(kb[t / 4u], t % 4u, kbt);
            scratch[qg_at + t * p.dk + d] = qg;
            scratch[kd_at + t * p.dk + d] = kd;
        }
        for (var t = 0u; t < CHUNK; t++) {
            var w = kb[t / 4u][t % 4u];
            for (var j = 0u; j <= t / 4u; j++) {
                w += dot(m[t * (CHUNK / 4u) + j], kb[j]);
            }
            scratch[w_at + t * p.dk + d] = w;
        }
        scratch[d_at + d] = exp(gl);
    }
    // Per value channel: U = T (beta v).
    for (var e = lid; e < p.dv; e += 64u) {
        var vb: array<vec4<f32>, CHUNK / 4u>;
        for (var t = 0u; t < CHUNK; t++) {
            var vbt = 0.0;
            if (t < rows) {
                vbt = betas[t] * conv_at((t0 + t) * p.conv_stride + 2u * key_dim + h * p.dv + e);
            }
            vb[t / 4u] = with_lane(vb[t / 4u], t % 4u, vbt);
        }
        for (var t = 0u; t < CHUNK; t++) {
            var u = vb[t / 4u][t % 4u];
            for (var j = 0u; j <= t / 4u; j++) {
                u += dot(m[t * (CHUNK / 4u) + j], vb[j]);
            }
            scratch[u_at + t * p.dv + e] = u;
        }
    }
}
