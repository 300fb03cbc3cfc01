// The gated delta rule over the step's tokens in order, one workgroup per value head h (key
// head kh = h / (v_heads / k_heads)), its recurrent state S [dk, dv] in `state` at h * dk * dv.
// Per token, from the conv output (q | k | v per token, conv_stride apart) and the projection
// (b at gate_offset + h, a at gate_offset + v_heads + h, in_stride apart):
//   q, k L2-normalised (eps 1e-6), q scaled by 1/sqrt(dk);
//   g = -exp(A_log[h]) * softplus(a + dt_bias[h]), beta = sigmoid(b);
//   S *= exp(g); S[:, j] += k * beta * (v[j] - k . S[:, j]); out[t, h, j] = q . S[:, j].
// KDA (Kimi Delta Attention): one g per key channel i from a[h * dk + i] (f_proj, at the same
// offset) and dt_bias[h * dk + i]: g_i = lower_bound * sigmoid(exp(A_log[h]) * x) with
// SAFE_GATE, else -exp(A_log[h]) * softplus(x), x = a + dt_bias; S[i, :] *= exp(g_i).
// Each invocation owns columns j = lid, lid + 64, ... of S. A column is read once for both
// dot products with the old state (k . S and q . S against the decayed k and q), then updated
// in place: out = (q * d) . S_old + (q . k) delta, so the state is written once per token.
// SNAPSHOTS (a step of draft tokens): the state after token t is also written to `snaps` at
// t * v_heads * dk * dv, so the step can be cut back to any token without running it again.
//#include common
//#include delta_gates

@group(0) @binding(2) var<storage, read> conv: array<f32>;
@group(0) @binding(3) var<storage, read> proj: array<f32>;
// A_log [v_heads] then dt_bias [v_heads] (KDA: [v_heads * dk]).
@group(0) @binding(4) var<storage, read> decay_params: array<f32>;
@group(0) @binding(5) var<storage, read_write> state: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
//#if SNAPSHOTS
@group(0) @binding(7) var<storage, read_write> snaps: array<f32>;
//#endif

// MAX_LINEAR_KEY_DIM.
var<workgroup> qs: array<f32, 256>;
var<workgroup> ks: array<f32, 256>;
// The decay exp(g) of each key channel, and q and k times it.
var<workgroup> ds: array<f32, 256>;
var<workgroup> qds: array<f32, 256>;
var<workgroup> kds: array<f32, 256>;
var<workgroup> red: array<f32, 64>;

// The sum of every invocation's `v` (all invocations must call it).
fn workgroup_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            red[lid] += red[lid + stride];
        }
        workgroupBarrier();
    }
    let s = red[0];
    workgroupBarrier();
    return s;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = group_index(wid, nwg);
    if (h >= p.v_heads) {
        return;
    }
    let kh = h / (p.v_heads / p.k_heads);
    let key_dim = p.k_heads * p.dk;
    let value_dim = p.v_heads * p.dv;
    let s0 = h * p.dk * p.dv;
    let a_exp = exp(decay_params[h]);
    for (var t = 0u; t < step.n_tokens; t++) {
        let row = t * p.conv_stride;
        var sq = 0.0;
        var sk = 0.0;
        var sqk = 0.0;
        for (var i = lid; i < p.dk; i += 64u) {
            let qv = conv[row + kh * p.dk + i];
            let kv = conv[row + key_dim + kh * p.dk + i];
            qs[i] = qv;
            ks[i] = kv;
            sq += qv * qv;
            sk += kv * kv;
            sqk += qv * kv;
        }
        let q_scale = 1.0 / (sqrt(workgroup_sum(lid, sq) + 1e-6) * sqrt(f32(p.dk)));
        let k_scale = 1.0 / sqrt(workgroup_sum(lid, sk) + 1e-6);
        let qk = workgroup_sum(lid, sqk) * k_scale;
        let gates = t * p.in_stride + p.gate_offset;
        let decay_in = gates + p.v_heads;
//#if KDA
        for (var i = lid; i < p.dk; i += 64u) {
            let x = proj[decay_in + h * p.dk + i] + decay_params[p.v_heads + h * p.dk + i];
            let d = exp(log_decay(x, a_exp, p.lower_bound));
            ds[i] = d;
            qds[i] = qs[i] * d;
            kds[i] = ks[i] * d;
        }
//#else
        let head_decay = exp(log_decay(proj[decay_in + h] + decay_params[p.v_heads + h], a_exp, 0.0));
        for (var i = lid; i < p.dk; i += 64u) {
            ds[i] = head_decay;
            qds[i] = qs[i] * head_decay;
            kds[i] = ks[i] * head_decay;
        }
//#endif
        workgroupBarrier();
        let beta = delta_beta(proj[gates + h]);
        for (var j = lid; j < p.dv; j += 64u) {
            var k_dot = 0.0;
            var q_dot = 0.0;
            for (var i = 0u; i < p.dk; i++) {
                let s = state[s0 + i * p.dv + j];
                k_dot += s * kds[i];
                q_dot += s * qds[i];
            }
            let kv_mem = k_dot * k_scale;
            let delta = (conv[row + 2u * key_dim + h * p.dv + j] - kv_mem) * beta;
            let kd = k_scale * delta;
            for (var i = 0u; i < p.dk; i++) {
                let at = s0 + i * p.dv + j;
                let updated = state[at] * ds[i] + ks[i] * kd;
                state[at] = updated;
//#if SNAPSHOTS
                snaps[t * p.v_heads * p.dk * p.dv + at] = updated;
//#endif
            }
            out[t * value_dim + h * p.dv + j] = (q_dot + qk * delta) * q_scale;
        }
        workgroupBarrier();
    }
}
