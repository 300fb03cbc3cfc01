// `w_load8` for ggml types without a reader of their own: value by value (weights_ggml).
fn w_load8(m: WMat, row: u32, k8: u32) -> W8 {
    return w_load8_by_value(m, row, k8);
}
