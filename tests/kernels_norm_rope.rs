//! RMSNorm and RoPE kernels against the CPU reference at odd sizes: in place and into a
//! separate output, whole rows and per-head rows, rows at the step position of a KV cache
//! (`at_cache_pos`), token counts crossing workgroup sizes.
//!
//! Tolerances: RMSNorm |Δ| ≤ 1e-5·(1+|ref|) (f32 sum of squares vs the reference's f64);
//! RoPE |Δ| ≤ 1e-5·(1+|ref|) (the host table computes cos/sin in f64, the reference in f32).
//! Rows outside the step must be bit-for-bit untouched.

mod common;

use common::{
    assert_bits_eq, assert_close, gpu, gpu_layouts, gpu_no_subgroups, read_f32, read_u32, submit, upload_f32, Rng,
};
use moestream::gpu::Gpu;
use moestream::gpu::StepUniform;
use moestream::model::RopeSpec;
use moestream::ops::kv_store::{KvChunk, KvDtype, KvStore, StoreRope};
use moestream::ops::moe_combine::MoeCombine;
use moestream::ops::rms_norm::{NormRows, RmsNorm};
use moestream::ops::rope::{Rope, RopeLayout};
use moestream::reference::ops as refops;

const NORM_TOL: f32 = 1e-5;
const ROPE_TOL: f32 = 1e-5;

/// Reference RMSNorm of every `n`-row of `x`.
fn ref_norm_rows(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for (o, r) in out.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
        refops::rms_norm(r, w, eps, o);
    }
    out
}

/// The adapters the norm tests run on: with subgroups (on lavapipe the `ONE_SUBGROUP` kernel,
/// 8 lanes summed by subgroupAdd), without (64 lanes summed in workgroup memory), and in the GPU
/// layouts (rows of 1024 values or more over 256 lanes, `WIDE_ROW`).
fn norm_gpus() -> [(&'static str, std::sync::Arc<Gpu>); 3] {
    [("subgroups", gpu()), ("no subgroups", gpu_no_subgroups()), ("gpu layouts", gpu_layouts())]
}

/// Runs one RMSNorm over a buffer of `total_rows` rows of `n`; returns (x after, out after).
#[allow(clippy::too_many_arguments)]
fn run_norm(
    gpu: &Gpu,
    x: &[f32],
    w: &[f32],
    rows: NormRows,
    with_out: bool,
    out_len: usize,
    n_tokens: usize,
    pos: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let step = StepUniform::new(gpu);
    step.set(gpu, n_tokens, pos);
    let xb = upload_f32(gpu, x);
    let wb = upload_f32(gpu, w);
    let sentinel = vec![-777.0f32; out_len.max(1)];
    let ob = upload_f32(gpu, &sentinel);
    let op = RmsNorm::new(gpu, &step.buffer, &wb, &xb, with_out.then_some(&ob), rows, eps);
    submit(gpu, |pass| op.record(gpu, pass, n_tokens));
    (read_f32(gpu, &xb, x.len()), read_f32(gpu, &ob, out_len.max(1)))
}

#[test]
fn rms_norm_in_place_whole_rows() {
    for (label, gpu) in norm_gpus() {
        let mut rng = Rng::new(1);
        // n crosses the 64-lane stride (40 < 64 < 72 < 128 < 1000) and, in the GPU layouts, the
        // 256-lane rows from 1024 on (1030: a short last stride, 2048: whole ones); tokens cross
        // 8 and 64.
        for &n in &[40usize, 72, 129, 1000, 1030, 2048] {
            for &t in &[1usize, 3, 9, 17, 70] {
                let w = rng.vec(n, 0.5, 1.5);
                // A row scale varying over tokens exercises the normalisation, not just the weight.
                let x: Vec<f32> = (0..t * n).map(|i| rng.range(-1.0, 1.0) * (1.0 + (i / n) as f32)).collect();
                let eps = 1e-6;
                let rows = NormRows { n, rows_per_token: 1, at_cache_pos: false };
                let (got, _) = run_norm(&gpu, &x, &w, rows, false, 0, t, 0, eps);
                let want = ref_norm_rows(&x, &w, n, eps);
                assert_close(&format!("{label}: rms_norm n={n} T={t}"), &got, &want, NORM_TOL);
            }
        }
    }
}

#[test]
fn rms_norm_out_variant_leaves_input_and_tail() {
    for (label, gpu) in norm_gpus() {
        let mut rng = Rng::new(2);
        for &(n, t) in &[(72usize, 1usize), (40, 17), (1000, 3), (1030, 3)] {
            let w = rng.vec(n, -1.5, 1.5);
            let x = rng.vec(t * n, -3.0, 3.0);
            let eps = 1e-5;
            let rows = NormRows { n, rows_per_token: 1, at_cache_pos: false };
            // The output buffer has one spare row that must stay untouched.
            let (x_after, out) = run_norm(&gpu, &x, &w, rows, true, (t + 1) * n, t, 0, eps);
            assert_bits_eq(&format!("{label}: rms_norm OUT: input unchanged"), &x_after, &x);
            let want = ref_norm_rows(&x, &w, n, eps);
            assert_close(&format!("{label}: rms_norm OUT n={n} T={t}"), &out[..t * n], &want, NORM_TOL);
            assert!(out[t * n..].iter().all(|&v| v == -777.0), "{label}: rms_norm OUT wrote past T rows");
        }
    }
}

#[test]
fn rms_norm_after_combine_is_combine_then_norm() {
    for (label, gpu) in norm_gpus() {
        // The fused x += sum of top-k expert rows, then the norm into `out`, is bit-identical to
        // moe_combine followed by the OUT norm (both x and out), and writes no row past the step.
        let mut rng = Rng::new(3);
        for &(n, t, k) in &[(72usize, 1usize, 2usize), (40, 17, 1), (1000, 3, 4), (129, 70, 2), (1030, 9, 2)] {
            let w = rng.vec(n, -1.5, 1.5);
            // One spare row past the step in x and out, which must stay untouched.
            let x = rng.vec((t + 1) * n, -3.0, 3.0);
            let y = rng.vec(t * k * n, -1.0, 1.0);
            let eps = 1e-5;
            let step = StepUniform::new(&gpu);
            step.set(&gpu, t, 0);
            let (wb, yb) = (upload_f32(&gpu, &w), upload_f32(&gpu, &y));
            let run = |fused: bool| {
                let xb = upload_f32(&gpu, &x);
                let ob = upload_f32(&gpu, &vec![-777.0f32; (t + 1) * n]);
                if fused {
                    let op = RmsNorm::after_combine(&gpu, &step.buffer, &wb, &xb, &ob, &yb, n, k, eps);
                    submit(&gpu, |pass| op.record(&gpu, pass, t));
                } else {
                    let combine = MoeCombine::new(&gpu, &step.buffer, &yb, &xb, None, n, k);
                    let rows = NormRows { n, rows_per_token: 1, at_cache_pos: false };
                    let norm = RmsNorm::new(&gpu, &step.buffer, &wb, &xb, Some(&ob), rows, eps);
                    submit(&gpu, |pass| {
                        combine.record(&gpu, pass, t);
                        norm.record(&gpu, pass, t);
                    });
                }
                (read_f32(&gpu, &xb, x.len()), read_f32(&gpu, &ob, (t + 1) * n))
            };
            let ((x1, o1), (x2, o2)) = (run(true), run(false));
            let what = format!("{label}: n={n} T={t} k={k}");
            assert_bits_eq(&format!("after_combine {what}: residual"), &x1, &x2);
            assert_bits_eq(&format!("after_combine {what}: normed"), &o1, &o2);
            assert_bits_eq(&format!("after_combine {what}: row past the step"), &x1[t * n..], &x[t * n..]);
            assert!(o1[t * n..].iter().all(|&v| v == -777.0), "after_combine {what} wrote past T rows");
        }
    }
}

#[test]
fn rms_norm_per_head_rows() {
    for (label, gpu) in norm_gpus() {
        let mut rng = Rng::new(3);
        // q-norm: rows_per_token = n_heads, n = head_dim.
        for &(hd, heads, t) in &[(24usize, 6usize, 1usize), (40, 3, 9), (128, 6, 17), (64, 2, 3)] {
            let w = rng.vec(hd, 0.5, 1.5);
            let x = rng.vec(t * heads * hd, -2.0, 2.0);
            let rows = NormRows { n: hd, rows_per_token: heads, at_cache_pos: false };
            let (got, _) = run_norm(&gpu, &x, &w, rows, false, 0, t, 0, 1e-6);
            let want = ref_norm_rows(&x, &w, hd, 1e-6);
            assert_close(&format!("{label}: rms_norm per-head hd={hd} heads={heads} T={t}"), &got, &want, NORM_TOL);
        }
    }
}

/// A layer's q and k norms in one dispatch (`RmsNorm::pair`): per head (q and k heads of one
/// head_dim, different weights) and over whole projections of different widths, each tensor
/// bit-identical to its norm alone, the rows past the step's untouched.
#[test]
fn paired_norms_are_each_norm_alone() {
    for (label, gpu) in norm_gpus() {
        let mut rng = Rng::new(4);
        // (q rows: n, per token; k rows: n, per token; tokens)
        for &((n1, r1), (n2, r2), t) in &[
            ((64usize, 8usize), (64usize, 4usize), 1usize),
            ((128, 6), (128, 2), 5),
            ((512, 1), (256, 1), 3),
            ((1024, 1), (128, 1), 2),
        ] {
            let (w1, w2) = (rng.vec(n1, 0.5, 1.5), rng.vec(n2, 0.5, 1.5));
            // One token's rows more than the step holds: left as they are.
            let x1 = rng.vec((t + 1) * r1 * n1, -2.0, 2.0);
            let x2 = rng.vec((t + 1) * r2 * n2, -2.0, 2.0);
            let rows1 = NormRows { n: n1, rows_per_token: r1, at_cache_pos: false };
            let rows2 = NormRows { n: n2, rows_per_token: r2, at_cache_pos: false };
            let (alone1, _) = run_norm(&gpu, &x1, &w1, rows1, false, 0, t, 0, 1e-6);
            let (alone2, _) = run_norm(&gpu, &x2, &w2, rows2, false, 0, t, 0, 1e-6);
            let step = StepUniform::new(&gpu);
            step.set(&gpu, t, 0);
            let (xb1, xb2, wb1, wb2) =
                (upload_f32(&gpu, &x1), upload_f32(&gpu, &x2), upload_f32(&gpu, &w1), upload_f32(&gpu, &w2));
            let op = RmsNorm::pair(&gpu, &step.buffer, (&wb1, &xb1, rows1), (&wb2, &xb2, rows2), 1e-6);
            submit(&gpu, |pass| op.record(&gpu, pass, t));
            let what = format!("{label}: paired norms {n1}×{r1} and {n2}×{r2}, T={t}");
            assert_bits_eq(&format!("{what}: first"), &read_f32(&gpu, &xb1, x1.len()), &alone1);
            assert_bits_eq(&format!("{what}: second"), &read_f32(&gpu, &xb2, x2.len()), &alone2);
            assert_eq!(alone1[t * r1 * n1..], x1[t * r1 * n1..], "{what}: the norm alone touched rows past the step");
        }
    }
}

#[test]
fn rms_norm_at_cache_pos_only_touches_step_rows() {
    for (label, gpu) in norm_gpus() {
        let mut rng = Rng::new(4);
        // k-norm in the KV cache: rows of kv_heads*head_dim, step at `pos`, ctx rows in total.
        for &(hd, kvh, t, pos) in
            &[(64usize, 2usize, 1usize, 63usize), (40, 3, 9, 5), (24, 2, 17, 100), (128, 1, 3, 64)]
        {
            let ctx = pos + t + 4;
            let w = rng.vec(hd, 0.5, 1.5);
            let x = rng.vec(ctx * kvh * hd, -2.0, 2.0);
            let rows = NormRows { n: hd, rows_per_token: kvh, at_cache_pos: true };
            let (got, _) = run_norm(&gpu, &x, &w, rows, false, 0, t, pos, 1e-6);
            let width = kvh * hd;
            let (lo, hi) = (pos * width, (pos + t) * width);
            let want = ref_norm_rows(&x[lo..hi], &w, hd, 1e-6);
            let what = format!("{label}: rms_norm at_cache_pos hd={hd} kvh={kvh} T={t} pos={pos}");
            assert_close(&what, &got[lo..hi], &want, NORM_TOL);
            assert_bits_eq(&format!("{what}: rows before"), &got[..lo], &x[..lo]);
            assert_bits_eq(&format!("{what}: rows after"), &got[hi..], &x[hi..]);

            // OUT variant: reads cache rows at pos, writes out rows from 0.
            let (x_after, out) = run_norm(&gpu, &x, &w, rows, true, t * width, t, pos, 1e-6);
            assert_bits_eq(&format!("{what} OUT: input"), &x_after, &x);
            assert_close(&format!("{what} OUT"), &out, &want, NORM_TOL);
        }
    }
}

/// Rotates `x` with the GPU kernel; returns x after.
fn run_rope(x: &[f32], heads: usize, hd: usize, t: usize, pos: usize, theta: f32, at_cache_pos: bool) -> Vec<f32> {
    run_rope_spec(x, &RopeSpec::plain(theta, hd), RopeLayout::heads(heads, hd, at_cache_pos), t, pos)
}

/// Rotates `x` (laid out as `layout`) by `spec` with the GPU kernel; returns x after.
fn run_rope_spec(x: &[f32], spec: &RopeSpec, layout: RopeLayout, t: usize, pos: usize) -> Vec<f32> {
    let gpu = gpu();
    let step = StepUniform::new(&gpu);
    step.set(&gpu, t, pos);
    let (cos, sin) = spec.tables(pos + t + 1);
    let cb = upload_f32(&gpu, &cos);
    let sb = upload_f32(&gpu, &sin);
    let xb = upload_f32(&gpu, x);
    let op = Rope::new(&gpu, &step.buffer, (&cb, &sb), &xb, spec, layout);
    submit(&gpu, |pass| op.record(&gpu, pass, t));
    read_f32(&gpu, &xb, x.len())
}

#[test]
fn rope_matches_reference_at_offsets() {
    let mut rng = Rng::new(5);
    for &(hd, heads, t, pos, theta) in &[
        (24usize, 6usize, 1usize, 0usize, 10_000.0f32),
        (40, 3, 9, 7, 10_000.0),
        (64, 2, 17, 300, 1_000_000.0),
        (128, 6, 3, 63, 10_000.0),
        (128, 1, 1, 1199, 500_000.0),
    ] {
        let width = heads * hd;
        let x = rng.vec(t * width, -2.0, 2.0);
        let got = run_rope(&x, heads, hd, t, pos, theta, false);
        let mut want = x.clone();
        for (i, row) in want.chunks_exact_mut(width).enumerate() {
            refops::rope(row, heads, hd, pos + i, &RopeSpec::plain(theta, hd));
        }
        assert_close(&format!("rope hd={hd} heads={heads} T={t} pos={pos}"), &got, &want, ROPE_TOL);
    }
}

#[test]
fn rope_at_cache_pos_only_touches_step_rows() {
    let mut rng = Rng::new(6);
    for &(hd, kvh, t, pos) in &[(64usize, 2usize, 1usize, 64usize), (40, 3, 17, 48), (24, 2, 9, 1)] {
        let width = kvh * hd;
        let ctx = pos + t + 3;
        let x = rng.vec(ctx * width, -2.0, 2.0);
        let got = run_rope(&x, kvh, hd, t, pos, 10_000.0, true);
        let (lo, hi) = (pos * width, (pos + t) * width);
        let mut want = x[lo..hi].to_vec();
        for (i, row) in want.chunks_exact_mut(width).enumerate() {
            refops::rope(row, kvh, hd, pos + i, &RopeSpec::plain(10_000.0, hd));
        }
        let what = format!("rope at_cache_pos hd={hd} kvh={kvh} T={t} pos={pos}");
        assert_close(&what, &got[lo..hi], &want, ROPE_TOL);
        assert_bits_eq(&format!("{what}: rows before"), &got[..lo], &x[..lo]);
        assert_bits_eq(&format!("{what}: rows after"), &got[hi..], &x[hi..]);
    }
}

/// The caches (raw words) and queries after `KvStore` with its ROPE, or after the rope kernel
/// on queries and keys then a plain store, for KV heads in chunks of `per_chunk`.
#[allow(clippy::too_many_arguments)]
fn store_with_rope(
    fused: bool,
    spec: &RopeSpec,
    hd: usize,
    (qh, kh, per_chunk): (usize, usize, usize),
    (t, pos): (usize, usize),
    dtype: KvDtype,
    (q, k, v): (&[f32], &[f32], &[f32]),
) -> (Vec<f32>, Vec<Vec<u32>>) {
    let gpu = gpu();
    let step = StepUniform::new(&gpu);
    step.set(&gpu, t, pos);
    let context = pos + t + 2;
    let (cos, sin) = spec.tables(context);
    let (cb, sb) = (upload_f32(&gpu, &cos), upload_f32(&gpu, &sin));
    let (qb, kb, vb) = (upload_f32(&gpu, q), upload_f32(&gpu, k), upload_f32(&gpu, v));
    let words = per_chunk * context * dtype.row_bytes(hd) / 4;
    let caches: Vec<_> = (0..kh)
        .step_by(per_chunk)
        .map(|h0| {
            (h0, per_chunk.min(kh - h0), upload_f32(&gpu, &vec![0.0; words]), upload_f32(&gpu, &vec![0.0; words]))
        })
        .collect();
    let rope = StoreRope { tables: (&cb, &sb), q: &qb, n_heads: qh, spec };
    let stores: Vec<_> = caches
        .iter()
        .map(|(h0, n, ck, cv)| {
            let chunk = KvChunk { k: ck, v: cv, kv_head0: *h0, heads: *n, context, dtype, ring: false };
            KvStore::new(&gpu, &step.buffer, (&kb, &vb), chunk, kh, (hd, hd), fused.then_some(rope))
        })
        .collect();
    let ropes = [(&qb, qh), (&kb, kh)]
        .map(|(x, h)| Rope::new(&gpu, &step.buffer, (&cb, &sb), x, spec, RopeLayout::heads(h, hd, false)));
    submit(&gpu, |pass| {
        if !fused {
            ropes.iter().for_each(|r| r.record(&gpu, pass, t));
        }
        stores.iter().for_each(|s| s.record(&gpu, pass, t));
    });
    let cached =
        caches.iter().flat_map(|(_, _, ck, cv)| [read_u32(&gpu, ck, words), read_u32(&gpu, cv, words)]).collect();
    (read_f32(&gpu, &qb, q.len()), cached)
}

#[test]
fn kv_store_rope_is_rope_then_store() {
    // A grouped layer's RoPE done by its cache store (keys rotated as they are cached, each
    // chunk's query heads in place): bit-identical to the rope kernel on queries and keys and
    // then the plain store, for rotate-half, partial and interleaved rotations, f16 and f32
    // caches, KV heads in one chunk or several.
    let mut rng = Rng::new(8);
    let mut partial_interleaved = RopeSpec::plain(10_000.0, 64);
    partial_interleaved.rotary_dim = 32;
    partial_interleaved.interleaved = true;
    let mut partial = RopeSpec::plain(10_000.0, 64);
    partial.rotary_dim = 32;
    for (spec, hd) in [(RopeSpec::plain(10_000.0, 40), 40usize), (partial_interleaved, 64), (partial, 64)] {
        for &(heads, t, pos) in &[((6usize, 2usize, 2usize), 1usize, 5usize), ((4, 4, 1), 9, 0), ((8, 4, 3), 3, 70)] {
            for dtype in [KvDtype::F16, KvDtype::F32] {
                let (qh, kh, _) = heads;
                let (q, k, v) =
                    (rng.vec(t * qh * hd, -2.0, 2.0), rng.vec(t * kh * hd, -2.0, 2.0), rng.vec(t * kh * hd, -2.0, 2.0));
                let inputs = (&q[..], &k[..], &v[..]);
                let (q1, c1) = store_with_rope(true, &spec, hd, heads, (t, pos), dtype, inputs);
                let (q2, c2) = store_with_rope(false, &spec, hd, heads, (t, pos), dtype, inputs);
                let what = format!(
                    "kv_store rope hd={hd} rotary={} heads {heads:?} T={t} pos={pos} {dtype:?}",
                    spec.rotary_dim
                );
                assert_bits_eq(&format!("{what}: queries"), &q1, &q2);
                assert!(q1 != q, "{what}: queries were not rotated");
                for (i, (a, b)) in c1.iter().zip(&c2).enumerate() {
                    assert_eq!(a, b, "{what}: cache buffer {i}");
                }
            }
        }
    }
}

/// Scaled, partial and interleaved rotations (GLM's half-width rotate-half, DeepSeek's
/// interleaved YaRN on the rotary tail of each head) against the reference.
#[test]
fn rope_scaled_partial_interleaved_match_reference() {
    use moestream::model::RopeScaling;
    let mut rng = Rng::new(7);
    let yarn = RopeScaling::Yarn {
        factor: 40.0,
        original_max_positions: 64,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.3,
        truncate: true,
    };
    let linear = RopeScaling::Linear { factor: 4.0 };
    // (head_dim, heads, offset, rotary_dim, interleaved, scaling)
    for (hd, heads, offset, rot, inter, scaling) in [
        (24usize, 3usize, 0usize, 12usize, false, linear.clone()),
        (40, 2, 24, 16, true, yarn.clone()),
        (32, 1, 0, 32, true, yarn),
    ] {
        let spec = RopeSpec { theta: 10_000.0, scaling, rotary_dim: rot, interleaved: inter };
        let (t, pos) = (5, 90);
        let layout =
            RopeLayout { n_heads: heads, head_stride: hd, row_stride: heads * hd, offset, at_cache_pos: false };
        let x = rng.vec(t * heads * hd, -2.0, 2.0);
        let got = run_rope_spec(&x, &spec, layout, t, pos);
        let mut want = x.clone();
        for (i, row) in want.chunks_exact_mut(heads * hd).enumerate() {
            for head in row.chunks_exact_mut(hd) {
                refops::rope(&mut head[offset..offset + rot], 1, rot, pos + i, &spec);
            }
        }
        assert_close(&format!("rope hd={hd} rot={rot} interleaved={inter}"), &got, &want, ROPE_TOL);
    }
}
