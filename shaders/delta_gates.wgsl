// What the delta rule's kernels share (the token-by-token one and the chunked pair): their
// parameters and the gates (Gated DeltaNet's and KDA's). `x` is the decay input plus `dt_bias`,
// `a_exp` is exp(A_log[h]):
//   Gated DeltaNet and KDA's softplus gate: g = -a_exp * softplus(x);
//   KDA's safe gate (SAFE_GATE): g = lower_bound * sigmoid(a_exp * x).
// Every g is at most 0, so exp of a sum of them, or of a later sum less an earlier one, is at
// most 1.

struct Params {
    k_heads: u32,
    v_heads: u32,
    dk: u32,
    dv: u32,
    in_stride: u32,
    conv_stride: u32,
    gate_offset: u32,
    // The safe KDA gate's lower bound of g.
    lower_bound: f32,
    // Chunks the chunked form's scratch holds.
    chunks: u32,
    // The chunk a dispatch of the chunked state pass runs.
    chunk: u32,
}

@group(0) @binding(1) var<uniform> p: Params;

// Tokens per chunk of the chunked form (`ops::gated_delta_rule::CHUNK`).
const CHUNK: u32 = 32u;

fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

// The log-decay g of one key channel (KDA) or head (Gated DeltaNet).
fn log_decay(x: f32, a_exp: f32, lower_bound: f32) -> f32 {
//#if SAFE_GATE
    return lower_bound / (1.0 + exp(-a_exp * x));
//#else
    return -a_exp * softplus(x);
//#endif
}

// beta = sigmoid(b).
fn delta_beta(b: f32) -> f32 {
    return 1.0 / (1.0 + exp(-b));
}
