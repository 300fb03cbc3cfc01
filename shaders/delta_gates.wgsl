// The gates of the delta rule (Gated DeltaNet's and KDA's), shared by its sequential and chunked
// kernels. `x` is the decay input plus `dt_bias`, `a_exp` is exp(A_log[h]):
//   Gated DeltaNet and KDA's softplus gate: g = -a_exp * softplus(x);
//   KDA's safe gate (SAFE_GATE): g = lower_bound * sigmoid(a_exp * x).
// Every g is at most 0, so exp of a sum of them, or of a later sum less an earlier one, is at
// most 1.

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
