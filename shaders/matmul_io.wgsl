// Parameters and bindings shared by the prefill matmul and the decode matvec (one launcher binds
// both): y[t, row_offset + n] (+)= W[n] . x[t] (+ bias[first_row + n]) for the rows of one
// weight chunk; w_scales / w_mins are the int4 segment offsets of the chunk's blob.
struct Params {
    k: u32,
    n: u32,
    row_offset: u32,
    out_stride: u32,
    first_row: u32,
    w_scales: u32,
    w_mins: u32,
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
//#if BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
//#if WIDE
@group(0) @binding(6) var<storage, read> w4: array<vec4<u32>>;
//#endif
//#else
//#if WIDE
@group(0) @binding(5) var<storage, read> w4: array<vec4<u32>>;
//#endif
//#endif
