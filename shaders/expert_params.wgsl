// Parameters shared by the expert kernels: model dims, the slot-table base of the layer and its
// experts (`n_experts`, the prefill expert_matmul's), the arena chunk this dispatch covers, and
// where each projection lies inside a slot.
struct Params {
    hidden: u32,
    inter: u32,
    top_k: u32,
    table_base: u32,
    first_slot: u32,
    slots: u32,
    slot_words: u32,
    n_experts: u32,
    // Per projection, relative to the slot start: (data in weight units, scales f16 index,
    // mins f16 index, unused).
    gate: vec4<u32>,
    up: vec4<u32>,
    down: vec4<u32>,
    // CLAMPED (gpt-oss): (swiglu_alpha, swiglu_limit, unused, unused).
    act: vec4<f32>,
}

//#if CLAMPED
// Where expert `e`'s biases start in `expert_bias` (bound by each kernel after its own
// buffers): per expert of the layer its gate bias (inter), up bias (inter), down bias (hidden).
fn bias_base(e: u32) -> u32 {
    return e * (2u * p.inter + p.hidden);
}
//#endif

// The projection `o` of the expert in slot `slot` (already relative to this chunk).
fn proj(slot: u32, o: vec4<u32>, cols: u32) -> WMat {
    let words = slot * p.slot_words;
    return WMat(words * UNITS_PER_WORD + o.x, cols, words * 2u + o.y, words * 2u + o.z);
}

@group(0) @binding(1) var<uniform> p: Params;
