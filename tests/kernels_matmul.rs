//! The matmul kernel (decode matvec and the tiled prefill GEMM, 32 rows × 32 tokens × 32-column
//! k slices) against `reference::ops::matvec`: f32, f16 and int4 (affine g32, symmetric g64)
//! weights, bias, ACCUMULATE, column-offset outputs, token counts in and across tiles
//! (`TOKEN_COUNTS`), partial row tiles and k slices, long k; plus chunked weights (tiny binding limit) and the
//! shared-memory fallback without subgroups, and workgroup counts above the per-dimension limit.
//!
//! Tolerance: |Δ| ≤ 1e-4·(1+|ref|) per element against the reference in f32 (for f16 and int4
//! weights, the reference runs on the f16-rounded / CPU-dequantized weights). Chunked results must be bit-identical to the
//! unchunked ones; the no-subgroup variant must agree with the subgroup one to 1e-5·(1+|ref|).

mod common;

use std::sync::Arc;

use common::{
    as_stored, assert_bits_eq, assert_close, gpu, gpu_chunked, gpu_layouts, gpu_layouts_no_subgroups,
    gpu_layouts_team32, gpu_no_subgroups, gpu_tiled_prefill, lane_wide_formats, read_f32, submit, upload_f32,
    upload_matrix, weight_formats, Rng,
};
use moestream::gpu::{Gpu, GpuOptions, StepUniform};
use moestream::ops::matmul::{MatMul, MatMulOut, MATVEC_MAX_TOKENS};
use moestream::ops::WeightFormat;
use moestream::reference::ops as refops;

const TOL: f32 = 1e-4;

/// Token counts: decode (1), every partial shape of the first 32-token tile's lanes (8 tokens
/// per lane column), and counts around one and two whole tiles.
const TOKEN_COUNTS: [usize; 14] = [1, 2, 3, 5, 7, 8, 9, 15, 17, 31, 32, 33, 64, 65];

/// One matmul problem.
struct Case {
    rows: usize,
    cols: usize,
    t: usize,
    format: WeightFormat,
    bias: bool,
    out: MatMulOut,
    /// Rows of the output buffer (≥ t).
    out_rows: usize,
}

struct Data {
    w: Vec<f32>,
    x: Vec<f32>,
    bias: Vec<f32>,
    y0: Vec<f32>,
}

fn data(c: &Case, seed: u64) -> Data {
    let mut rng = Rng::new(seed);
    Data {
        w: rng.vec(c.rows * c.cols, -1.0, 1.0),
        x: rng.vec(c.t * c.cols, -1.0, 1.0),
        bias: rng.vec(c.rows, -0.5, 0.5),
        y0: rng.vec(c.out_rows * c.out.stride, -2.0, 2.0),
    }
}

fn run(gpu: &Arc<Gpu>, c: &Case, d: &Data) -> Vec<f32> {
    let step = StepUniform::new(gpu);
    step.set(gpu, c.t, 0);
    let w = upload_matrix(gpu, &d.w, c.rows, c.cols, c.format);
    let xb = upload_f32(gpu, &d.x);
    let bb = upload_f32(gpu, &d.bias);
    let yb = upload_f32(gpu, &d.y0);
    let op = MatMul::new(gpu, &step.buffer, &xb, &w, c.bias.then_some(&bb), &yb, c.out);
    submit(gpu, |pass| op.record(gpu, pass, c.t));
    read_f32(gpu, &yb, d.y0.len())
}

/// The expected output buffer: y0 with the step's cells replaced (or accumulated into).
fn reference(c: &Case, d: &Data) -> Vec<f32> {
    let w = as_stored(c.format, &d.w, c.rows, c.cols);
    let mut y = d.y0.clone();
    let mut r = vec![0.0f32; c.rows];
    let first = if c.out.last_token { c.t - 1 } else { 0 };
    for t in first..c.t {
        refops::matvec(&w, c.rows, c.cols, &d.x[t * c.cols..(t + 1) * c.cols], &mut r);
        if c.bias {
            refops::add_bias(&mut r, &d.bias);
        }
        for (n, v) in r.iter().enumerate() {
            let cell = &mut y[t * c.out.stride + c.out.col_offset + n];
            *cell = if c.out.accumulate { *cell + v } else { *v };
        }
    }
    y
}

fn describe(c: &Case) -> String {
    format!("matmul {:?} rows={} cols={} T={} bias={} {:?}", c.format, c.rows, c.cols, c.t, c.bias, c.out)
}

/// `c` against the reference on the CPU adapter's own kernels and, for prefill steps, in the
/// tiled GEMM that GPUs run.
fn check(c: &Case, seed: u64) {
    let d = data(c, seed);
    let want = reference(c, &d);
    assert_close(&describe(c), &run(&gpu(), c, &d), &want, TOL);
    if c.t > MATVEC_MAX_TOKENS {
        assert_close(&format!("tiled {}", describe(c)), &run(&gpu_tiled_prefill(), c, &d), &want, TOL);
    }
}

fn plain(rows: usize, cols: usize, t: usize, format: WeightFormat, bias: bool) -> Case {
    Case { rows, cols, t, format, bias, out: MatMulOut::plain(rows), out_rows: t }
}

#[test]
fn matvec_steps_stay_under_the_software_loop_limit() {
    // The CPU layout's matvec runs a step's tokens in one invocation, and lavapipe stops an
    // invocation's loops after 65535 iterations: f32 rows of 8192 values in a 48-token step
    // came out wrong. The engine holds its steps to `software_step_limit` of the widest input.
    use moestream::ops::matmul::software_step_limit;
    for width in [6144, 8192, 10944] {
        let t = software_step_limit(width);
        assert!(t >= 16, "{width}: {t}");
        check(&plain(16, width, t, WeightFormat::F32, false), width as u64);
    }
    assert!(software_step_limit(4096) >= 64, "the default 64-token steps stay for 4096-wide models");
}

#[test]
fn matmul_f32_token_sweep() {
    for t in TOKEN_COUNTS {
        check(&plain(37, 72, t, WeightFormat::F32, false), t as u64);
    }
}

#[test]
fn matmul_f16_token_sweep() {
    for t in TOKEN_COUNTS {
        check(&plain(37, 40, t, WeightFormat::F16, false), 100 + t as u64);
    }
}

#[test]
fn matmul_int4_token_sweep() {
    // cols 72: a short last group for both group sizes (32+32+8, 64+8).
    for t in TOKEN_COUNTS {
        for format in &weight_formats()[2..] {
            check(&plain(29, 72, t, *format, t % 2 == 0), 150 + t as u64);
        }
    }
}

#[test]
fn matmul_shapes_and_bias() {
    let mut seed = 200;
    // cols 1032: many k slices; rows 1000 spans many row tiles; (8, 8) is less than one tile.
    for &(rows, cols) in &[(37usize, 40usize), (129, 72), (1000, 40), (129, 1032), (8, 8)] {
        for &t in &[1usize, 3, 17, 33] {
            for format in weight_formats() {
                for bias in [false, true] {
                    seed += 1;
                    check(&plain(rows, cols, t, format, bias), seed);
                }
            }
        }
    }
}

#[test]
fn matmul_accumulate_into_residual() {
    let mut seed = 300;
    for &t in &[1usize, 8, 9, 17] {
        for format in weight_formats() {
            for bias in [false, true] {
                seed += 1;
                let mut c = plain(72, 40, t, format, bias);
                c.out.accumulate = true;
                check(&c, seed);
            }
        }
    }
}

#[test]
fn matmul_column_offset_shares_one_output() {
    // Two matrices writing columns [0, 37) and [37, 37+29) of one [T, 70] output (one spare
    // column at the end that nobody writes), each checked on its own and then together.
    for &t in &[1usize, 9, 17] {
        for format in weight_formats() {
            let stride = 70;
            for (rows, col_offset, bias, accumulate) in
                [(37usize, 0usize, true, false), (29, 37, false, true), (29, 41, true, true)]
            {
                let c = Case {
                    rows,
                    cols: 40,
                    t,
                    format,
                    bias,
                    out: MatMulOut { stride, col_offset, accumulate, last_token: false },
                    out_rows: t,
                };
                check(&c, 500 + t as u64 + col_offset as u64);
            }
        }
    }
}

#[test]
fn matmul_last_token_writes_only_its_row() {
    // The lm_head for the next token: row T-1 is computed and no other row changes, whatever
    // the step's length (the reference keeps y0's other rows).
    let mut seed = 450;
    for &t in &[1usize, 2, 5, 33] {
        for format in weight_formats() {
            seed += 1;
            let mut c = plain(37, 72, t, format, seed % 2 == 0);
            c.out.last_token = true;
            c.out.col_offset = 3;
            c.out.stride = 41;
            check(&c, seed);
        }
    }
}

#[test]
fn matmul_chunked_weights_are_bit_identical() {
    let chunked = gpu_chunked();
    assert_eq!(chunked.caps.max_binding, 4096);
    let options = GpuOptions { max_binding_override: Some(4096), tiled_prefill: true, ..Default::default() };
    let chunked_tiled = Gpu::new(&options).unwrap();
    let mut seed = 600;
    for &(rows, cols, t) in &[(129usize, 72usize, 9usize), (37, 40, 33), (1000, 40, 3)] {
        for format in weight_formats() {
            for (bias, accumulate) in [(false, false), (true, false), (true, true)] {
                seed += 1;
                let c = Case {
                    rows,
                    cols,
                    t,
                    format,
                    bias,
                    out: MatMulOut { stride: rows + 3, col_offset: 2, accumulate, last_token: false },
                    out_rows: t,
                };
                let w = upload_matrix(&chunked, &vec![0.0; rows * cols], rows, cols, format);
                assert!(w.chunks.len() >= 3, "{}: not chunked", describe(&c));
                let d = data(&c, seed);
                let whole = run(&gpu(), &c, &d);
                let split = run(&chunked, &c, &d);
                assert_bits_eq(&format!("chunked {}", describe(&c)), &split, &whole);
                assert_close(&describe(&c), &split, &reference(&c, &d), TOL);
                let tiled = run(&gpu_tiled_prefill(), &c, &d);
                let tiled_split = run(&chunked_tiled, &c, &d);
                assert_bits_eq(&format!("chunked tiled {}", describe(&c)), &tiled_split, &tiled);
            }
        }
    }
}

#[test]
fn matmul_without_subgroups_matches_with() {
    let with = gpu();
    let without = gpu_no_subgroups();
    assert!(!without.caps.subgroups);
    eprintln!("adapter {}: subgroups {}", with.adapter.name, with.caps.subgroups);
    if !with.caps.subgroups {
        eprintln!("note: adapter has no SUBGROUP feature; both runs use the fallback kernel");
    }
    let mut seed = 700;
    for &(rows, cols) in &[(37usize, 72usize), (129, 1032), (8, 8)] {
        for &t in &[1usize, 3, 9, 33] {
            for format in weight_formats() {
                seed += 1;
                let mut c = plain(rows, cols, t, format, seed % 2 == 0);
                c.out.accumulate = seed % 3 == 0;
                let d = data(&c, seed);
                let a = run(&with, &c, &d);
                let b = run(&without, &c, &d);
                assert_close(&format!("no-subgroups vs subgroups {}", describe(&c)), &b, &a, 1e-5);
                assert_close(&format!("no-subgroups {}", describe(&c)), &b, &reference(&c, &d), TOL);
            }
        }
    }
}

/// The three outputs of a [`MatMul::split`] of the rows `parts` stacked, and those of three
/// plain matmuls of each part, on `gpu`.
fn split_and_separate(
    gpu: &Arc<Gpu>,
    parts: [usize; 3],
    cols: usize,
    t: usize,
    format: WeightFormat,
    bias: bool,
    seed: u64,
) -> [(Vec<f32>, Vec<f32>); 3] {
    let mut rng = Rng::new(seed);
    let rows: usize = parts.iter().sum();
    let (w, x, b) = (rng.vec(rows * cols, -1.0, 1.0), rng.vec(t * cols, -1.0, 1.0), rng.vec(rows, -0.5, 0.5));
    let step = StepUniform::new(gpu);
    step.set(gpu, t, 0);
    let xb = upload_f32(gpu, &x);
    let stale = |n: usize| upload_f32(gpu, &vec![7.0; t * n]);
    let fused_w = upload_matrix(gpu, &w, rows, cols, format);
    let fused_b = upload_f32(gpu, &b);
    let ys = parts.map(stale);
    let outputs = [0, 1, 2].map(|j| (&ys[j], parts[j]));
    let fused = MatMul::split(gpu, &step.buffer, &xb, &fused_w, bias.then_some(&fused_b), outputs);
    submit(gpu, |pass| fused.record(gpu, pass, t));
    let mut first = 0;
    [0, 1, 2].map(|j| {
        let (n, rows) = (parts[j], first..first + parts[j]);
        first += n;
        let part_w = upload_matrix(gpu, &w[rows.start * cols..rows.end * cols], n, cols, format);
        let part_b = upload_f32(gpu, &b[rows]);
        let y = stale(n);
        let op = MatMul::new(gpu, &step.buffer, &xb, &part_w, bias.then_some(&part_b), &y, MatMulOut::plain(n));
        submit(gpu, |pass| op.record(gpu, pass, t));
        (read_f32(gpu, &ys[j], t * n), read_f32(gpu, &y, t * n))
    })
}

#[test]
fn matmul_split_outputs_equal_three_matmuls() {
    // q | k | v stacked into one matrix and written to three outputs in one dispatch: each row
    // is computed as it is alone (decode matvec and prefill GEMM, every format, chunked
    // weights whose chunks straddle the outputs, the GPU layouts), so bit-identical.
    let mut seed = 1000;
    for gpu in [gpu(), gpu_chunked(), gpu_layouts()] {
        for format in weight_formats() {
            for &(parts, cols) in &[([64usize, 32, 32], 128usize), ([40, 24, 24], 72), ([8, 16, 8], 64)] {
                for &t in &[1usize, 3, 9, 33] {
                    seed += 1;
                    let bias = seed % 2 == 0;
                    for (j, (fused, alone)) in
                        split_and_separate(&gpu, parts, cols, t, format, bias, seed).iter().enumerate()
                    {
                        let what = format!("split output {j} of {parts:?} x {cols} {format:?} T={t} bias={bias}");
                        assert_bits_eq(&what, fused, alone);
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_lane_wide_loads_are_bit_identical() {
    // On CPU adapters with 8-lane subgroups (lavapipe) the decode matvec reads int4 and f16
    // rows of a multiple of 64 two groups a step (LANE_WIDE: 16-byte loads, the input shared
    // through subgroupBroadcast); without subgroups it takes the input lane by lane. Same additions in the
    // same order: bit-identical. (On a hardware GPU both runs are the teams layout, shuffles
    // against workgroup memory: bit-identical as well.)
    let (with, without) = (gpu(), gpu_no_subgroups());
    let mut seed = 800;
    let shapes = [(37usize, 128usize), (129, 1024), (64, 512), (8, 64), (300, 192)];
    for (format, &(rows, cols)) in lane_wide_formats().into_iter().flat_map(|f| shapes.iter().map(move |s| (f, s))) {
        for &t in &[1usize, 2, 3] {
            seed += 1;
            let mut c = plain(rows, cols, t, format, seed % 2 == 0);
            c.out.accumulate = seed % 3 == 0;
            c.out.last_token = seed % 4 == 0;
            let d = data(&c, seed);
            let a = run(&with, &c, &d);
            assert_close(&format!("lane-wide {}", describe(&c)), &a, &reference(&c, &d), TOL);
            assert_bits_eq(&format!("lane-wide vs one-word loads {}", describe(&c)), &a, &run(&without, &c, &d));
        }
    }
}

#[test]
fn matmul_in_the_gpu_layouts_matches_the_reference() {
    // What hardware GPUs run: the matvec in 8-lane (or 32-lane) teams summed by subgroup shuffles, or through
    // workgroup memory without subgroups (both add in the same order: bit-identical), reading
    // int4 groups of 32 whole (WIDE) where rows are 16-byte aligned.
    let (teams, shared, team32) = (gpu_layouts(), gpu_layouts_no_subgroups(), gpu_layouts_team32());
    assert!(!teams.caps.cpu_layouts && !shared.caps.cpu_layouts && !shared.caps.subgroups);
    assert_eq!((teams.caps.decode_team, team32.caps.decode_team), (8, 32));
    let mut seed = 900;
    // cols 96 and 1024 (multiples of 32): int4 in groups of 32 takes the WIDE 16-byte loads.
    for &(rows, cols) in &[(37usize, 72usize), (129, 1032), (8, 8), (1000, 40), (37, 96), (129, 1024)] {
        for &t in &[1usize, 2, 3, 9] {
            for format in weight_formats() {
                seed += 1;
                let mut c = plain(rows, cols, t, format, seed % 2 == 0);
                c.out.accumulate = seed % 3 == 0;
                c.out.last_token = seed % 5 == 0;
                let d = data(&c, seed);
                let a = run(&teams, &c, &d);
                let want = reference(&c, &d);
                assert_close(&format!("GPU layout {}", describe(&c)), &a, &want, TOL);
                assert_close(&format!("GPU layout, 32-lane teams {}", describe(&c)), &run(&team32, &c, &d), &want, TOL);
                if teams.caps.subgroups {
                    let b = run(&shared, &c, &d);
                    assert_bits_eq(&format!("GPU layout, shared vs shuffles {}", describe(&c)), &b, &a);
                }
            }
        }
    }
}

#[test]
fn matmul_folds_dispatch_over_dimension_limit() {
    // ⌈rows/32⌉ × ⌈T/32⌉ prefill workgroups (and ⌈rows/64⌉ decode ones) above the
    // per-dimension limit are folded into x and y; the surplus workgroups of the fold must not
    // write anything.
    let gpu = gpu();
    let rows = 64 * (gpu.caps.max_workgroups_per_dim as usize + 1234);
    for &t in &[1usize, 2] {
        let c = Case {
            rows,
            cols: 8,
            t,
            format: WeightFormat::F16,
            bias: true,
            out: MatMulOut { stride: rows + 1, col_offset: 1, accumulate: false, last_token: false },
            out_rows: t + 1,
        };
        check(&c, 800 + t as u64);
    }
}
