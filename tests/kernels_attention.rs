//! Causal grouped-query attention against `reference::ops::attention`: decode (T = 1) at
//! positions > 0 and prefill (T > 1) at offsets, kv lengths crossing the 64-key tiles
//! (1, 63, 64, 65, 300), head_dim 24/40/64/128/256, GQA (6 heads over 2 or 3 KV heads), MQA and
//! plain MHA. Cache rows past the last visible key hold NaN, so reading them (a causality bug)
//! poisons the output.
//!
//! Tolerance: |Δ| ≤ 1e-4·(1+|ref|) per element (online softmax over tiles vs a two-pass f32
//! softmax with an f64 sum).

mod common;

use common::{assert_close, gpu, read_f32, submit, upload_f32, Rng};
use moestream::gpu::StepUniform;
use moestream::ops::attention::{Attention, Heads};
use moestream::reference::ops as refops;

const TOL: f32 = 1e-4;

fn check(heads: Heads, t: usize, pos: usize, seed: u64) {
    let Heads { n_heads, n_kv_heads, head_dim: hd } = heads;
    let mut rng = Rng::new(seed);
    let q_width = n_heads * hd;
    let kv_width = n_kv_heads * hd;
    let kv_len = pos + t;
    let ctx = kv_len + 7;
    // Queries scaled up so softmaxes are peaked (more sensitive to the max bookkeeping).
    let q = rng.vec(t * q_width, -3.0, 3.0);
    let mut k = rng.vec(ctx * kv_width, -1.0, 1.0);
    let mut v = rng.vec(ctx * kv_width, -1.0, 1.0);
    for x in k[kv_len * kv_width..].iter_mut() {
        *x = f32::NAN;
    }
    for x in v[kv_len * kv_width..].iter_mut() {
        *x = f32::NAN;
    }

    let gpu = gpu();
    let step = StepUniform::new(&gpu);
    step.set(&gpu, t, pos);
    let qb = upload_f32(&gpu, &q);
    let kb = upload_f32(&gpu, &k);
    let vb = upload_f32(&gpu, &v);
    let ob = upload_f32(&gpu, &vec![-555.0; (t + 1) * q_width]);
    let op = Attention::new(&gpu, &step.buffer, &qb, &kb, &vb, &ob, heads);
    submit(&gpu, |pass| op.record(&gpu, pass, t));
    let got = read_f32(&gpu, &ob, (t + 1) * q_width);

    let mut want = vec![0.0f32; t * q_width];
    for i in 0..t {
        refops::attention(
            &q[i * q_width..(i + 1) * q_width],
            &k,
            &v,
            n_heads,
            n_kv_heads,
            hd,
            pos + i + 1,
            &mut want[i * q_width..(i + 1) * q_width],
        );
    }
    let what = format!("attention {heads:?} T={t} pos={pos}");
    assert_close(&what, &got[..t * q_width], &want, TOL);
    assert!(got[t * q_width..].iter().all(|&x| x == -555.0), "{what}: wrote past the step's tokens");
}

fn heads(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Heads {
    Heads { n_heads, n_kv_heads, head_dim }
}

#[test]
fn attention_decode_across_key_tiles() {
    let mut seed = 0;
    for h in [heads(6, 2, 64), heads(6, 3, 40), heads(6, 6, 24), heads(4, 1, 128)] {
        for kv_len in [1usize, 63, 64, 65, 300] {
            seed += 1;
            check(h, 1, kv_len - 1, seed);
        }
    }
}

#[test]
fn attention_prefill_causal() {
    let mut seed = 100;
    for h in [heads(6, 2, 24), heads(6, 3, 64), heads(2, 1, 128), heads(3, 3, 40)] {
        // (T, pos): prefill from 0; chunked prefill continuing at an offset, with the causal
        // boundary inside and across 64-key tiles; ending exactly at / past 300 keys.
        for (t, pos) in [(3usize, 0usize), (17, 0), (9, 55), (17, 47), (3, 62), (17, 283)] {
            seed += 1;
            check(h, t, pos, seed);
        }
    }
}

#[test]
fn attention_head_dim_256() {
    // The largest head_dim the kernel takes: each thread accumulates 4 output dims.
    check(heads(2, 1, 256), 1, 64, 200);
    check(heads(2, 2, 256), 9, 60, 201);
}

/// Decompresses latent rows into per-head keys `[k_nope | k_rope]` and values (the plain MLA
/// form the CPU reference model runs).
fn decompress(c: &[f32], kr: &[f32], kv_b: &[f32], s: refops::MlaShape, len: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    let blk = s.nope + s.v;
    for t in 0..len {
        let mut kv = vec![0.0f32; s.n_heads * blk];
        refops::matvec(kv_b, s.n_heads * blk, s.rank, &c[t * s.rank..(t + 1) * s.rank], &mut kv);
        for head in kv.chunks_exact(blk) {
            keys.extend_from_slice(&head[..s.nope]);
            keys.extend_from_slice(&kr[t * s.rope..(t + 1) * s.rope]);
            values.extend_from_slice(&head[s.nope..]);
        }
    }
    (keys, values)
}

/// The absorbed MLA kernel (reading only latents) against decompressed attention on the CPU,
/// and the CPU's own absorbed form against the same: decode and prefill, across key tiles,
/// with NaN latents past the last visible position.
#[test]
fn mla_absorbed_matches_decompressed_reference() {
    use moestream::model::MlaSpec;
    use moestream::ops::mla_attention::{LatentCache, MlaAttention, MlaIo};
    let mut rng = Rng::new(77);
    // (heads, rank, nope, rope, v, tokens, pos)
    for &(heads, rank, nope, rope, v, t, pos) in &[
        (4usize, 32usize, 16usize, 8usize, 16usize, 1usize, 70usize),
        (3, 40, 8, 16, 24, 9, 60),
        (2, 512, 32, 64, 16, 1, 5),
    ] {
        let m = MlaSpec {
            q_lora_rank: None,
            kv_lora_rank: rank,
            qk_nope_head_dim: nope,
            qk_rope_head_dim: rope,
            v_head_dim: v,
            softmax_scale: 0.8 / ((nope + rope) as f32).sqrt(),
        };
        let s = refops::MlaShape { n_heads: heads, rank, nope, rope, v, scale: m.softmax_scale };
        let (qk, len, ctx) = (nope + rope, pos + t, pos + t + 5);
        let q = rng.vec(t * heads * qk, -1.5, 1.5);
        let mut c = rng.vec(ctx * rank, -1.0, 1.0);
        let mut kr = rng.vec(ctx * rope, -1.0, 1.0);
        c[len * rank..].fill(f32::NAN);
        kr[len * rope..].fill(f32::NAN);
        let kv_b = rng.vec(heads * (nope + v) * rank, -0.3, 0.3);

        let gpu = gpu();
        let step = StepUniform::new(&gpu);
        step.set(&gpu, t, pos);
        let (qb, cb, krb, wb) =
            (upload_f32(&gpu, &q), upload_f32(&gpu, &c), upload_f32(&gpu, &kr), upload_f32(&gpu, &kv_b));
        let ob = upload_f32(&gpu, &vec![-555.0; t * heads * v]);
        let io = MlaIo { q: &qb, cache: LatentCache { c: &cb, k_rope: &krb }, kv_b: &wb, out: &ob };
        let op = MlaAttention::new(&gpu, &step.buffer, io, heads, &m);
        submit(&gpu, |pass| op.record(&gpu, pass, t));
        let got = read_f32(&gpu, &ob, t * heads * v);

        let (keys, values) = decompress(&c, &kr, &kv_b, s, len);
        let shape = refops::HeadShape { n_heads: heads, n_kv_heads: heads, k_dim: qk, v_dim: v, scale: s.scale };
        let mut want = vec![0.0f32; t * heads * v];
        let mut absorbed = vec![0.0f32; t * heads * v];
        for i in 0..t {
            let (qi, out) = (&q[i * heads * qk..(i + 1) * heads * qk], i * heads * v..(i + 1) * heads * v);
            refops::attention_with(qi, &keys, &values, shape, pos + i + 1, &mut want[out.clone()]);
            refops::mla_absorbed(qi, &c, &kr, &kv_b, s, pos + i + 1, &mut absorbed[out]);
        }
        let what = format!("mla heads={heads} rank={rank} nope={nope} rope={rope} v={v} T={t} pos={pos}");
        assert_close(&format!("{what} GPU"), &got, &want, TOL);
        assert_close(&format!("{what} CPU absorbed"), &absorbed, &want, TOL);
    }
}
