//! The ggml readers (`shaders/weights_q4_0.wgsl` ... one per type) inside the matmul (decode
//! matvec and prefill tile) and embedding kernels, on the GGUF bytes of
//! `tests/fixtures/gguf/quants.gguf`, against the CPU reference on the `gguf` package's own
//! dequantization of the same bytes (`T.ref`). Tolerance |Δ| ≤ 1e-4·(1+|ref|): the GPU may fuse
//! the block products; the dequantized values themselves are checked exactly by the embedding.
//! Row-chunked uploads (tiny binding limit, rows starting at any byte) must be bit-identical.

mod common;

use std::sync::Arc;

use common::{
    assert_bits_eq, assert_close, gpu, gpu_chunked, gpu_layouts, gpu_layouts_team32, gpu_no_subgroups,
    gpu_tiled_prefill, read_f32, submit, upload_f32, upload_u32, Rng,
};
use moestream::gpu::{Gpu, StepUniform};
use moestream::model::gguf::{GgmlType, GgufModel};
use moestream::ops::embed::Embed;
use moestream::ops::matmul::{MatMul, MatMulOut};
use moestream::ops::matrix::write_gguf_blob;
use moestream::ops::{GpuMatrix, WeightFormat};
use moestream::quant::{Int4Matrix, Q4_0_AS_INT4};
use moestream::reference::ops as refops;

const TYPES: [&str; 9] = ["BF16", "Q4_0", "Q8_0", "MXFP4", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"];

/// A `[rows, cols]` matrix of one ggml type: its bytes and the `gguf` package's dequantization.
type Fixture = (GgmlType, usize, usize, Vec<u8>, Vec<f32>);

/// Every block type's fixture, rows repeated `times`.
fn matrices(times: usize) -> Vec<Fixture> {
    let m = GgufModel::open(&common::fixtures_dir().join("gguf/quants.gguf")).unwrap();
    TYPES
        .iter()
        .map(|name| {
            let info = m.info(name).unwrap();
            let (rows, cols) = (info.shape[0], info.shape[1]);
            let bytes = m.bytes(name).unwrap().repeat(times);
            let want = m.dequantize(&format!("{name}.ref")).unwrap().repeat(times);
            (info.ggml_type, rows * times, cols, bytes, want)
        })
        .collect()
}

/// The CPU reference's products of the `[rows, cols]` weights `want` with each token's `cols`
/// inputs in `x`.
fn reference(want: &[f32], rows: usize, cols: usize, x: &[f32]) -> Vec<f32> {
    let mut y = vec![0.0; x.len() / cols * rows];
    for (xt, yt) in x.chunks(cols).zip(y.chunks_mut(rows)) {
        refops::matvec(want, rows, cols, xt, yt);
    }
    y
}

fn matmul(gpu: &Arc<Gpu>, w: &GpuMatrix, x: &[f32], t: usize) -> Vec<f32> {
    let step = StepUniform::new(gpu);
    step.set(gpu, t, 0);
    let xb = upload_f32(gpu, x);
    let yb = upload_f32(gpu, &vec![0.0; t * w.rows]);
    let op = MatMul::new(gpu, &step.buffer, &xb, w, None, &yb, MatMulOut::plain(w.rows));
    submit(gpu, |pass| op.record(gpu, pass, t));
    read_f32(gpu, &yb, t * w.rows)
}

#[test]
fn matmul_reads_every_ggml_type() {
    // The CPU adapter's own kernels (the matvec at every step length) and the tiled GEMM that
    // GPUs run for prefill steps.
    let (gpu, tiled) = (gpu(), gpu_tiled_prefill());
    let mut rng = Rng::new(17);
    for (ty, rows, cols, bytes, want) in matrices(3) {
        let w = GpuMatrix::upload_ggml(&gpu, ty.name(), rows, cols, ty, &bytes).unwrap();
        let wt = GpuMatrix::upload_ggml(&tiled, ty.name(), rows, cols, ty, &bytes).unwrap();
        for t in [1, 3, 9] {
            let x = rng.vec(t * cols, -1.0, 1.0);
            let expected = reference(&want, rows, cols, &x);
            assert_close(&format!("{} T={t}", ty.name()), &matmul(&gpu, &w, &x, t), &expected, 1e-4);
            assert_close(&format!("{} T={t}, tiled", ty.name()), &matmul(&tiled, &wt, &x, t), &expected, 1e-4);
        }
    }
}

#[test]
fn chunked_ggml_matrices_are_bit_identical() {
    let (whole, chunked) = (gpu(), gpu_chunked());
    let mut rng = Rng::new(18);
    for (ty, rows, cols, bytes, _) in matrices(13) {
        let a = GpuMatrix::upload_ggml(&whole, ty.name(), rows, cols, ty, &bytes).unwrap();
        let b = GpuMatrix::upload_ggml(&chunked, ty.name(), rows, cols, ty, &bytes).unwrap();
        assert!(b.chunks.len() > 1, "{}: {} chunk(s)", ty.name(), b.chunks.len());
        for t in [1, 5] {
            let x = rng.vec(t * cols, -1.0, 1.0);
            assert_bits_eq(&format!("{} T={t}", ty.name()), &matmul(&chunked, &b, &x, t), &matmul(&whole, &a, &x, t));
        }
    }
}

#[test]
fn wide_block_loads_are_bit_identical() {
    // Q4_K's, Q5_K's and padded Q6_K's 16-byte loads and padded Q8_0's and MXFP4's word loads
    // (weights_ggml_wide): on CPU adapters with 8-lane subgroups two groups a step with the
    // input shared by lanes (LANE_WIDE),
    // bit-identical to the k8-by-k8 reader of the file's own blocks without subgroups; in the
    // GPU layouts (WIDE, teams of 8 and 32) within the tolerance of the reference.
    let (wide, plain) = (gpu(), gpu_no_subgroups());
    let mut rng = Rng::new(20);
    for (ty, rows, cols, bytes, want) in matrices(5)
        .into_iter()
        .filter(|m| [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::Q8_0, GgmlType::Mxfp4].contains(&m.0))
    {
        let w = GpuMatrix::upload_gguf(&wide, ty.name(), rows, cols, ty, &bytes).unwrap();
        let wp = GpuMatrix::upload_ggml(&plain, ty.name(), rows, cols, ty, &bytes).unwrap();
        for t in [1, 2, 3] {
            let x = rng.vec(t * cols, -1.0, 1.0);
            let expected = reference(&want, rows, cols, &x);
            let y = matmul(&wide, &w, &x, t);
            let name = ty.name();
            assert_close(&format!("{name} lane-wide T={t}"), &y, &expected, 1e-4);
            assert_bits_eq(&format!("{name} lane-wide vs k8 loads T={t}"), &y, &matmul(&plain, &wp, &x, t));
            for g in [gpu_layouts(), gpu_layouts_team32()] {
                let team = g.caps.decode_team;
                let y = matmul(&g, &GpuMatrix::upload_gguf(&g, ty.name(), rows, cols, ty, &bytes).unwrap(), &x, t);
                assert_close(&format!("{name} WIDE, {team}-lane teams, T={t}"), &y, &expected, 1e-4);
            }
        }
    }
}

#[test]
fn padded_blocks_are_the_same_matrix() {
    // Q6_K, Q8_0 and MXFP4 in padded blocks (how a GGUF model's matrices of those types are uploaded):
    // the embedding gathers exactly the gguf package's values, and the prefill tile and chunked
    // uploads compute exactly what the file's own blocks give.
    let (gpu, chunked, tiled) = (gpu(), gpu_chunked(), gpu_tiled_prefill());
    let mut rng = Rng::new(21);
    for (ty, rows, cols, bytes, want) in
        matrices(13).into_iter().filter(|m| [GgmlType::Q6K, GgmlType::Q8_0, GgmlType::Mxfp4].contains(&m.0))
    {
        let name = ty.name();
        let w = GpuMatrix::upload_gguf(&gpu, name, rows, cols, ty, &bytes).unwrap();
        assert_eq!(w.format, WeightFormat::Padded(ty));
        let raw = GpuMatrix::upload_ggml(&gpu, name, rows, cols, ty, &bytes).unwrap();
        let wc = GpuMatrix::upload_gguf(&chunked, name, rows, cols, ty, &bytes).unwrap();
        assert!(wc.chunks.len() > 1);
        let wt = GpuMatrix::upload_gguf(&tiled, name, rows, cols, ty, &bytes).unwrap();
        let raw_t = GpuMatrix::upload_ggml(&tiled, name, rows, cols, ty, &bytes).unwrap();
        for t in [1, 9] {
            let x = rng.vec(t * cols, -1.0, 1.0);
            let y = matmul(&gpu, &w, &x, t);
            if t > 1 {
                assert_bits_eq(&format!("padded {name} T={t} vs its blocks"), &y, &matmul(&gpu, &raw, &x, t));
                let tiled_y = matmul(&tiled, &wt, &x, t);
                assert_bits_eq(
                    &format!("padded {name} T={t} vs its blocks, tiled"),
                    &tiled_y,
                    &matmul(&tiled, &raw_t, &x, t),
                );
            }
            assert_bits_eq(&format!("padded {name} T={t}, chunked"), &matmul(&chunked, &wc, &x, t), &y);
        }
        let (got, expected) = embed_every_row(&gpu, &w, &want);
        assert_bits_eq(&format!("padded {name}, embedding"), &got, &expected);
    }
}

#[test]
fn embedding_gathers_exact_ggml_values() {
    let gpu = gpu();
    for (ty, rows, cols, bytes, want) in matrices(1) {
        let table = GpuMatrix::upload_ggml(&gpu, ty.name(), rows, cols, ty, &bytes).unwrap();
        let (got, expected) = embed_every_row(&gpu, &table, &want);
        assert_bits_eq(ty.name(), &got, &expected);
    }
}

/// Every row of `table` gathered by the embedding kernel (last row first), and `want`'s rows in
/// that order.
fn embed_every_row(gpu: &Arc<Gpu>, table: &GpuMatrix, want: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (rows, cols) = (table.rows, table.cols);
    let tokens: Vec<u32> = (0..rows as u32).rev().collect();
    let step = StepUniform::new(gpu);
    step.set(gpu, rows, 0);
    let tb = upload_u32(gpu, &tokens);
    let xb = upload_f32(gpu, &vec![0.0; rows * cols]);
    let op = Embed::new(gpu, &step.buffer, &tb, table, &xb);
    submit(gpu, |pass| op.record(gpu, pass, rows));
    let expected = tokens.iter().flat_map(|&r| want[r as usize * cols..][..cols].to_vec()).collect();
    (read_f32(gpu, &xb, rows * cols), expected)
}

#[test]
fn q4_0_as_int4_is_the_same_matrix() {
    // Q4_0 repacked as int4 symmetric in groups of 32 (what a GGUF model's dense Q4_0 matrices
    // run as): every weight bit-identical to the gguf package's dequantization, and the int4
    // kernels (decode matvec, prefill tile, embedding gather, chunked) compute with them.
    let (gpu, chunked) = (gpu(), gpu_chunked());
    let mut rng = Rng::new(19);
    let (ty, rows, cols, bytes, want) = matrices(13).into_iter().find(|m| m.0 == GgmlType::Q4_0).unwrap();
    let m = Int4Matrix::from_q4_0(&bytes, rows, cols).unwrap();
    assert_eq!(m.params, Q4_0_AS_INT4);
    assert_bits_eq("Q4_0 as int4, dequantized", &m.dequantize(), &want);
    let w = GpuMatrix::upload_gguf(&gpu, "q4_0", rows, cols, ty, &bytes).unwrap();
    assert_eq!(w.format, WeightFormat::Int4(Q4_0_AS_INT4));
    let wc = GpuMatrix::upload_gguf(&chunked, "q4_0", rows, cols, ty, &bytes).unwrap();
    assert!(wc.chunks.len() > 1);
    let tiled = gpu_tiled_prefill();
    let wt = GpuMatrix::upload_gguf(&tiled, "q4_0", rows, cols, ty, &bytes).unwrap();
    for t in [1, 3, 9] {
        let x = rng.vec(t * cols, -1.0, 1.0);
        let expected = reference(&want, rows, cols, &x);
        let y = matmul(&gpu, &w, &x, t);
        assert_close(&format!("{} as int4 T={t}", ty.name()), &y, &expected, 1e-4);
        assert_close(&format!("{} as int4 T={t}, tiled", ty.name()), &matmul(&tiled, &wt, &x, t), &expected, 1e-4);
        assert_bits_eq(&format!("{} as int4 T={t}, chunked", ty.name()), &matmul(&chunked, &wc, &x, t), &y);
    }
    let (got, expected) = embed_every_row(&gpu, &w, &want);
    assert_bits_eq("Q4_0 as int4, embedding", &got, &expected);
}

#[test]
fn malformed_ggml_uploads_are_refused() {
    let gpu = gpu();
    let q4 = GgmlType::Q4_0;
    assert!(GpuMatrix::upload_ggml(&gpu, "short", 2, 64, q4, &[0u8; 71]).is_err());
    assert!(GpuMatrix::upload_ggml(&gpu, "partial block", 1, 48, q4, &[0u8; 27]).is_err());
    assert!(GpuMatrix::upload_gguf(&gpu, "short", 2, 64, q4, &[0u8; 71]).is_err());
    assert!(GpuMatrix::upload_gguf(&gpu, "partial block", 1, 48, q4, &[0u8; 27]).is_err());
    assert!(Int4Matrix::from_q4_0(&[0u8; 71], 2, 64).is_err());
    let q6 = GgmlType::Q6K;
    assert!(GpuMatrix::upload_gguf(&gpu, "short", 1, 256, q6, &[0u8; 209]).is_err());
    assert!(GpuMatrix::upload_gguf(&gpu, "partial block", 1, 128, q6, &[0u8; 105]).is_err());
    // A blob written into a buffer of the wrong size is refused, not truncated.
    let mut out = vec![0u8; WeightFormat::Padded(q6).blob_bytes(1, 256).unwrap() - 256];
    assert!(write_gguf_blob(q6, 1, 256, &[0u8; 210], &mut out).is_err());
}
