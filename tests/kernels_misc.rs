//! Embedding lookup (f32 / f16 / int4 tables, one buffer and many chunks), SwiGLU, argmax and the
//! teacher-forced token log-prob kernel against the CPU reference.
//!
//! Tolerances: embed exact (f32) / exactly the f16-rounded value (f16) / the CPU-dequantized
//! value within 1e-6·(1+|ref|) (int4: the GPU may fuse `n·scale + min`), chunked tables
//! bit-identical to unchunked ones; swiglu |Δ| ≤ 1e-5·(1+|ref|); argmax exact index (ties →
//! lowest); token_logprob |Δ| ≤ 1e-5·(1+|ref|) against `reference::ops::log_softmax`.

mod common;

use std::sync::Arc;

use common::{
    as_stored, assert_bits_eq, assert_close, gpu, gpu_chunked, read_f32, read_u32, reduce_layouts, submit, upload_f32,
    upload_matrix, upload_u32, weight_formats, Rng,
};
use moestream::gpu::{Gpu, StepUniform};
use moestream::ops::argmax::Argmax;
use moestream::ops::embed::Embed;
use moestream::ops::swiglu::SwiGlu;
use moestream::ops::token_logprob::TokenLogprob;
use moestream::ops::WeightFormat;
use moestream::reference::ops as refops;
use moestream::util::rng::token_noise;

// ------------------------------------------------------------------------------------ embed

/// Looks `tokens` up in `table` (`[vocab, hidden]`); returns x (with one spare row) and the
/// number of table chunks.
fn run_embed(
    gpu: &Arc<Gpu>,
    table: &[f32],
    vocab: usize,
    hidden: usize,
    format: WeightFormat,
    tokens: &[u32],
) -> (Vec<f32>, usize) {
    let t = tokens.len();
    let step = StepUniform::new(gpu);
    step.set(gpu, t, 0);
    let m = upload_matrix(gpu, table, vocab, hidden, format);
    let tb = upload_u32(gpu, tokens);
    let xb = upload_f32(gpu, &vec![-9.0; (t + 1) * hidden]);
    let op = Embed::new(gpu, &step.buffer, &tb, &m, &xb);
    submit(gpu, |pass| op.record(gpu, pass, t));
    (read_f32(gpu, &xb, (t + 1) * hidden), m.chunks.len())
}

fn embed_case(vocab: usize, hidden: usize, t: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut rng = Rng::new(seed);
    let table = rng.vec(vocab * hidden, -1.0, 1.0);
    // First and last ids, repeats, and random ids.
    let mut tokens: Vec<u32> = vec![0, vocab as u32 - 1, 0];
    while tokens.len() < t {
        tokens.push(rng.below(vocab) as u32);
    }
    tokens.truncate(t);
    rng.shuffle(&mut tokens);
    (table, tokens)
}

fn embed_want(table: &[f32], hidden: usize, format: WeightFormat, tokens: &[u32]) -> Vec<f32> {
    let table = as_stored(format, table, table.len() / hidden, hidden);
    let mut want: Vec<f32> =
        tokens.iter().flat_map(|&id| table[id as usize * hidden..(id as usize + 1) * hidden].to_vec()).collect();
    want.extend(vec![-9.0; hidden]);
    want
}

#[test]
fn embed_matches_table_rows() {
    let mut seed = 0;
    for format in weight_formats() {
        for &(vocab, hidden) in &[(37usize, 40usize), (1000, 72), (129, 8)] {
            for &t in &[1usize, 3, 17, 70] {
                seed += 1;
                let (table, tokens) = embed_case(vocab, hidden, t, seed);
                let (got, _) = run_embed(&gpu(), &table, vocab, hidden, format, &tokens);
                let want = embed_want(&table, hidden, format, &tokens);
                assert_bits_eq(&format!("embed {format:?} vocab={vocab} H={hidden} T={t}"), &got, &want);
            }
        }
    }
}

#[test]
fn embed_chunked_table_is_bit_identical() {
    let chunked = gpu_chunked();
    let mut seed = 100;
    for format in weight_formats() {
        for &(vocab, hidden) in &[(1000usize, 40usize), (301, 72)] {
            for &t in &[1usize, 17, 70] {
                seed += 1;
                let (table, tokens) = embed_case(vocab, hidden, t, seed);
                let what = format!("chunked embed {format:?} vocab={vocab} H={hidden} T={t}");
                let (whole, n1) = run_embed(&gpu(), &table, vocab, hidden, format, &tokens);
                let (split, n2) = run_embed(&chunked, &table, vocab, hidden, format, &tokens);
                assert_eq!(n1, 1, "{what}: default table should be one chunk");
                assert!(n2 >= 4, "{what}: only {n2} chunks");
                assert_bits_eq(&what, &split, &whole);
                assert_close(&what, &split, &embed_want(&table, hidden, format, &tokens), 1e-6);
            }
        }
    }
}

// ----------------------------------------------------------------------------------- swiglu

#[test]
fn swiglu_matches_reference() {
    let mut rng = Rng::new(7);
    let gpu = gpu();
    for &inter in &[24usize, 37, 72, 1000] {
        for &t in &[1usize, 3, 9, 17] {
            let gu = rng.vec(t * 2 * inter, -6.0, 6.0);
            let step = StepUniform::new(&gpu);
            step.set(&gpu, t, 0);
            let gb = upload_f32(&gpu, &gu);
            let hb = upload_f32(&gpu, &vec![-3.0; (t + 1) * inter]);
            let op = SwiGlu::new(&gpu, &step.buffer, &gb, &hb, inter);
            submit(&gpu, |pass| op.record(&gpu, pass, t));
            let got = read_f32(&gpu, &hb, (t + 1) * inter);
            let mut want = Vec::new();
            for row in gu.chunks_exact(2 * inter) {
                for i in 0..inter {
                    want.push(refops::silu(row[i]) * row[inter + i]);
                }
            }
            want.extend(vec![-3.0; inter]);
            assert_close(&format!("swiglu I={inter} T={t}"), &got, &want, 1e-5);
        }
    }
}

// ----------------------------------------------------------------------------------- argmax

/// The argmax in each of `common::reduce_layouts()`, which must agree.
fn run_argmax(logits: &[f32], t: usize, vocab: usize) -> u32 {
    let picks: Vec<(&str, u32)> = reduce_layouts()
        .into_iter()
        .map(|(layout, gpu)| {
            let step = StepUniform::new(&gpu);
            step.set(&gpu, t, 0);
            let lb = upload_f32(&gpu, logits);
            let ob = upload_u32(&gpu, &[u32::MAX]);
            let op = Argmax::new(&gpu, &step.buffer, &lb, &ob, vocab);
            submit(&gpu, |pass| op.record(&gpu, pass));
            (layout, read_u32(&gpu, &ob, 1)[0])
        })
        .collect();
    assert!(picks.iter().all(|p| p.1 == picks[0].1), "argmax vocab={vocab} T={t}: layouts disagree: {picks:?}");
    picks[0].1
}

#[test]
fn argmax_of_last_token() {
    let mut rng = Rng::new(11);
    // Multiples of 4 (256, 1000, 5004) read four logits a load (VEC4), the others one.
    for &vocab in &[1usize, 37, 256, 257, 1000, 5003, 5004] {
        for &t in &[1usize, 3, 17] {
            let mut logits = rng.vec(t * vocab, -10.0, 10.0);
            // Earlier tokens hold a bigger value: only the last row may be looked at.
            for tok in 0..t - 1 {
                logits[tok * vocab + rng.below(vocab)] = 1e6;
            }
            let last = &logits[(t - 1) * vocab..];
            let want = refops::argmax(last);
            assert_eq!(run_argmax(&logits, t, vocab) as usize, want, "argmax vocab={vocab} T={t}");
        }
    }
}

#[test]
fn argmax_ties_pick_lowest_index() {
    let vocab = 1000;
    // Ties within one lane's stride (i, i+256), across lanes, within one four-logit load (300,
    // 301; 998, 999 after 997) and at the very end.
    for positions in
        [vec![700usize, 444], vec![999, 3], vec![5, 261, 517], vec![300, 301], vec![999, 998], vec![999, 997, 998]]
    {
        let mut logits = vec![0.0f32; vocab];
        for &p in &positions {
            logits[p] = 7.5;
        }
        let want = *positions.iter().min().unwrap();
        assert_eq!(refops::argmax(&logits), want);
        assert_eq!(run_argmax(&logits, 1, vocab) as usize, want, "argmax tie at {positions:?}");
    }
    // All equal (and all negative): index 0.
    assert_eq!(run_argmax(&vec![-5.0; 777], 1, 777), 0, "all-equal row");
}

#[test]
fn argmax_flags_non_finite_logits() {
    // A NaN or infinity anywhere in the last row, in any place of a four-logit load: 0xffffffff.
    for vocab in [1000usize, 1001] {
        for (at, bad) in [(0usize, f32::NAN), (501, f32::INFINITY), (999, f32::NEG_INFINITY), (998, f32::NAN)] {
            let mut logits = vec![0.5f32; 2 * vocab];
            logits[vocab + at] = bad;
            assert_eq!(run_argmax(&logits, 2, vocab), u32::MAX, "vocab={vocab}: {bad} at {at}");
        }
    }
}

#[test]
fn noisy_argmax_is_the_samplers_choice_under_the_same_key() {
    // A sampled MTP draft: the largest logit over the temperature plus util::rng::token_noise of
    // the key, as the sampler draws without top-k or top-p. Near-ties between the two largest
    // noisy values (the GPU's log may round differently) are skipped; most are not.
    let mut rng = Rng::new(17);
    let mut compared = 0;
    for (layout, gpu) in reduce_layouts() {
        for &vocab in &[37usize, 1000, 5003] {
            for (k, &temperature) in [0.5f32, 0.8, 1.3].iter().enumerate() {
                let logits = rng.vec(2 * vocab, -4.0, 4.0);
                let key = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(vocab as u64 + k as u64);
                let noisy: Vec<f32> = logits[vocab..]
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| l / temperature + token_noise(key, i as u32))
                    .collect();
                let mut sorted = noisy.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                if sorted[0] - sorted[1] < 1e-4 {
                    continue;
                }
                let step = StepUniform::new(&gpu);
                step.set(&gpu, 2, 0);
                let lb = upload_f32(&gpu, &logits);
                let ob = upload_u32(&gpu, &[u32::MAX]);
                let op = Argmax::with_noise(&gpu, &step.buffer, &lb, &ob, vocab);
                op.set_noise(&gpu, key, temperature);
                submit(&gpu, |pass| op.record(&gpu, pass));
                let want = refops::argmax(&noisy);
                assert_eq!(read_u32(&gpu, &ob, 1)[0] as usize, want, "{layout} vocab={vocab} t={temperature}");
                compared += 1;
            }
        }
    }
    assert!(compared >= 6, "only {compared} cases without a near-tie");
}

// ---------------------------------------------------------------------------- token_logprob

#[test]
fn token_logprob_matches_log_softmax() {
    let mut rng = Rng::new(13);
    for (layout, gpu) in reduce_layouts() {
        // Vocabularies that are no multiple of 4 and 8 (rows read four logits at a time), and
        // 262,144 (Gemma's), whose rows once passed lavapipe's 65535 loop iterations per
        // invocation in the 8-lane layout (dropping the last logits from the log-sum-exp).
        for &vocab in &[37usize, 129, 1000, 5003, 262_144] {
            for &t in &[1usize, 3, 17] {
                for &scale in &[1.0f32, 20.0] {
                    let mut logits = rng.vec(t * vocab, -scale, scale);
                    // A heavy tail: the last logits of each row hold much of the mass.
                    for row in logits.chunks_mut(vocab) {
                        row[vocab - 3..].iter_mut().for_each(|x| *x = scale);
                    }
                    let mut targets: Vec<u32> = (0..t).map(|_| rng.below(vocab) as u32).collect();
                    targets[0] = vocab as u32 - 1;
                    let step = StepUniform::new(&gpu);
                    step.set(&gpu, t, 0);
                    let lb = upload_f32(&gpu, &logits);
                    let tb = upload_u32(&gpu, &targets);
                    let ob = upload_f32(&gpu, &vec![1.0; t + 1]);
                    let op = TokenLogprob::new(&gpu, &step.buffer, &lb, &tb, &ob, vocab);
                    submit(&gpu, |pass| op.record(&gpu, pass, t));
                    let got = read_f32(&gpu, &ob, t + 1);
                    let mut want: Vec<f32> = (0..t)
                        .map(|i| refops::log_softmax(&logits[i * vocab..(i + 1) * vocab])[targets[i] as usize])
                        .collect();
                    want.push(1.0);
                    assert_close(
                        &format!("{layout}: token_logprob vocab={vocab} T={t} scale={scale}"),
                        &got,
                        &want,
                        1e-5,
                    );
                }
            }
        }
    }
}
