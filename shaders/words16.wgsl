// Sixteen bytes of a storage buffer as the 16-byte-load kernels bind them: four words, or with
// WORDS64 (Caps::words64: the CPU layout on an adapter with 8-byte integers) two 8-byte ones,
// which lavapipe loads in half the per-lane loops. `words_of` gives the four words either way,
// `floats_of` the four f32 values of an input bound as `Floats4`.
//#if WORDS64
alias Words16 = vec2<u64>;
alias Floats4 = vec2<u64>;

fn words_of(v: Words16) -> vec4<u32> {
    return vec4<u32>(u32(v.x), u32(v.x >> 32u), u32(v.y), u32(v.y >> 32u));
}

fn floats_of(v: Floats4) -> vec4<f32> {
    return bitcast<vec4<f32>>(words_of(v));
}
//#else
alias Words16 = vec4<u32>;
alias Floats4 = vec4<f32>;

fn words_of(v: Words16) -> vec4<u32> {
    return v;
}

fn floats_of(v: Floats4) -> vec4<f32> {
    return v;
}
//#endif
