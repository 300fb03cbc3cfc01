// Depthwise causal conv1d with SiLU over the step's tokens, one invocation per channel, the
// tokens in order: out[t, c] = silu(sum_j w[c, j] * x[t - (kernel - 1) + j, c]), where inputs
// before the step come from the sequence's window [channels, kernel - 1] (oldest first), which
// is left holding the step's last kernel - 1 inputs. Inputs are read at x[t * in_stride + c].
// SNAPSHOTS (a step of draft tokens): the window after token t is also written to `snaps` at
// t * channels * (kernel - 1), in the window's layout.
//#include common

struct Params {
    channels: u32,
    kernel: u32,
    in_stride: u32,
    pad: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> window: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
//#if SNAPSHOTS
@group(0) @binding(6) var<storage, read_write> snaps: array<f32>;
//#endif

// MAX_CONV_KERNEL - 1 past inputs at most.
const MAX_PAST: u32 = 7u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = group_index(wid, nwg) * 64u + lid;
    if (c >= p.channels) {
        return;
    }
    let past = p.kernel - 1u;
    var win: array<f32, MAX_PAST>;
    for (var j = 0u; j < past; j++) {
        win[j] = window[c * past + j];
    }
    for (var t = 0u; t < step.n_tokens; t++) {
        let xv = x[t * p.in_stride + c];
        var acc = 0.0;
        for (var j = 0u; j < past; j++) {
            acc += win[j] * w[c * p.kernel + j];
        }
        acc += xv * w[c * p.kernel + past];
        out[t * p.channels + c] = silu(acc);
        for (var j = 0u; j + 1u < past; j++) {
            win[j] = win[j + 1u];
        }
        win[past - 1u] = xv;
//#if SNAPSHOTS
        for (var j = 0u; j < past; j++) {
            snaps[(t * p.channels + c) * past + j] = win[j];
        }
//#endif
    }
    for (var j = 0u; j < past; j++) {
        window[c * past + j] = win[j];
    }
}
