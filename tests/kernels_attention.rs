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
