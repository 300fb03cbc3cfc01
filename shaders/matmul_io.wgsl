// Parameters and bindings shared by the prefill matmul and the decode matvec (one launcher binds
// both): y[t, row_offset + n] (+)= W[n] . x[t] (+ bias[first_row + n]) for the rows of one
// weight chunk; w_scales / w_mins are the int4 segment offsets of the chunk's blob.
// SPLIT_OUT (fused projections such as q|k|v): rows from split.x of the whole matrix go to
// y1[t, row - split.x] (row stride split.z), rows from split.y to y2[t, row - split.y] (stride
// split.w); the rows before split.x to y as above.
struct Params {
    k: u32,
    n: u32,
    row_offset: u32,
    out_stride: u32,
    first_row: u32,
    w_scales: u32,
    w_mins: u32,
    pad: u32,
//#if SPLIT_OUT
    split: vec4<u32>,
//#endif
}

@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<Floats4>;
//#if VEC4_WEIGHTS
@group(0) @binding(3) var<storage, read> w4: array<Words16>;
//#else
@group(0) @binding(3) var<storage, read> w: array<u32>;
//#endif
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
// The optional bindings follow in this order: y1 and y2, bias, w4.
//#if SPLIT_OUT
@group(0) @binding(5) var<storage, read_write> y1: array<f32>;
@group(0) @binding(6) var<storage, read_write> y2: array<f32>;
const SPLIT_BINDINGS: u32 = 2u;
//#else
const SPLIT_BINDINGS: u32 = 0u;
//#endif
//#if BIAS
@group(0) @binding(5u + SPLIT_BINDINGS) var<storage, read> bias: array<f32>;
const BIAS_BINDINGS: u32 = 1u;
//#else
const BIAS_BINDINGS: u32 = 0u;
//#endif
//#if WIDE
@group(0) @binding(5u + SPLIT_BINDINGS + BIAS_BINDINGS) var<storage, read> w4: array<Words16>;
//#endif

// Writes `value`, row n of this chunk for token t, to its output (adding the bias, and with
// ACCUMULATE what the output held).
fn store_row(t: u32, n: u32, value: f32) {
    var v = value;
//#if BIAS
    v += bias[p.first_row + n];
//#endif
//#if SPLIT_OUT
    let row = p.first_row + n;
    if (row >= p.split.y) {
        let i = t * p.split.w + row - p.split.y;
//#if ACCUMULATE
        v += y2[i];
//#endif
        y2[i] = v;
        return;
    }
    if (row >= p.split.x) {
        let i = t * p.split.z + row - p.split.x;
//#if ACCUMULATE
        v += y1[i];
//#endif
        y1[i] = v;
        return;
    }
//#endif
    let yi = t * p.out_stride + p.row_offset + n;
//#if ACCUMULATE
    v += y[yi];
//#endif
    y[yi] = v;
}
