//! The prerouter on the GPU (capture of each MoE layer's last token, every head in one batch,
//! top-k) against the CPU heads ([`Head::forward`], the training code's forward pass).

mod common;

use common::{assert_close, gpu, gpu_chunked, read_f32, read_u32, submit, upload_f32, upload_u32, Rng};
use moestream::gpu::{Gpu, StepUniform};
use moestream::ops::prerouter_capture::{PrerouterCapture, PrerouterHistory};
use moestream::ops::prerouter_heads::{HeadToRun, PrerouterHeads};
use moestream::prerouter::features::{Features, RoutingContext};
use moestream::prerouter::head::{Head, HeadDims, HeadParams, Tape};
use moestream::prerouter::metrics::top_k;

struct Case {
    hidden: usize,
    experts: usize,
    top_k: usize,
    inner: usize,
    moe_layers: usize,
    owners: Vec<usize>,
    features: Features,
}

fn random_params(rng: &mut Rng, d: HeadDims) -> HeadParams {
    let mut p = HeadParams::zeros(d);
    for t in p.tensors_mut() {
        for v in t.iter_mut() {
            *v = rng.range(-0.4, 0.4);
        }
    }
    p
}

/// Distinct random experts.
fn routing(rng: &mut Rng, experts: usize, k: usize) -> Vec<u32> {
    let mut all: Vec<u32> = (0..experts as u32).collect();
    rng.shuffle(&mut all);
    all.truncate(k);
    all
}

/// Runs two steps (of `first` tokens, then of one token) through the captures of every MoE
/// layer, then the heads; checks their scores and top-k against the CPU heads.
fn check(gpu: &Gpu, c: &Case, first: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let dims = HeadDims {
        hidden: c.hidden,
        dense: c.features.dense_dim(c.hidden),
        sparse: c.features.sparse_dim(c.experts),
        inner: c.inner,
        experts: c.experts,
    };
    let params: Vec<HeadParams> = c.owners.iter().map(|_| random_params(&mut rng, dims)).collect();
    let step = StepUniform::new(gpu);
    let history = PrerouterHistory::new(gpu, c.moe_layers, c.hidden, c.top_k);
    let to_run: Vec<HeadToRun<'_>> =
        c.owners.iter().zip(&params).map(|(&owner, params)| HeadToRun { owner, params }).collect();
    let heads = PrerouterHeads::new(gpu, &history, &to_run, dims, c.features, c.top_k, c.moe_layers).unwrap();
    let hn = gpu.storage("hn", (first * c.hidden * 4) as u64);
    let ids = gpu.storage("ids", (first * c.top_k * 4) as u64);
    let captures: Vec<PrerouterCapture> =
        (0..c.moe_layers).map(|j| PrerouterCapture::new(gpu, &step.buffer, &hn, &ids, &history, j, c.hidden)).collect();
    // Per step, per layer: hidden rows and routed ids of every token.
    let mut seen_h: Vec<Vec<Vec<f32>>> = vec![Vec::new(); c.moe_layers];
    let mut seen_ids: Vec<Vec<Vec<u32>>> = vec![Vec::new(); c.moe_layers];
    for n in [first, 1] {
        step.set(gpu, n, 0);
        for (j, capture) in captures.iter().enumerate() {
            let h = rng.vec(n * c.hidden, -1.0, 1.0);
            let routed: Vec<u32> = (0..n).flat_map(|_| routing(&mut rng, c.experts, c.top_k)).collect();
            gpu.queue.write_buffer(&hn, 0, bytemuck::cast_slice(&h));
            gpu.queue.write_buffer(&ids, 0, bytemuck::cast_slice(&routed));
            submit(gpu, |pass| capture.record(gpu, pass));
            seen_h[j].extend(h.chunks(c.hidden).map(<[f32]>::to_vec));
            seen_ids[j].extend(routed.chunks(c.top_k).map(<[u32]>::to_vec));
        }
    }
    step.set(gpu, 1, 0);
    submit(gpu, |pass| heads.record(gpu, pass));
    let logits = read_f32(gpu, &heads.logits, c.owners.len() * c.experts);
    let predicted = read_u32(gpu, &heads.predicted, c.owners.len() * c.top_k);

    let u16s = |v: &[u32]| v.iter().map(|&e| e as u16).collect::<Vec<u16>>();
    let t = first; // the last token; t − 1 exists since first ≥ 1
    let mut tape = Tape::default();
    for (h, (&owner, params)) in c.owners.iter().zip(&params).enumerate() {
        let head = Head { dims, params: params.clone() };
        let mut x = seen_h[owner][t].clone();
        if c.features.deep {
            x.extend_from_slice(&seen_h[c.moe_layers - 1][t]);
        }
        let (next, prev, own) =
            (u16s(&seen_ids[owner + 1][t]), u16s(&seen_ids[owner + 1][t - 1]), u16s(&seen_ids[owner][t]));
        let ctx = RoutingContext { next: &next, prev: Some(&prev), own: &own };
        let mut want = vec![0f32; c.experts];
        head.forward(&x, &c.features.active(c.experts, &ctx), &mut tape, &mut want);
        let got = &logits[h * c.experts..(h + 1) * c.experts];
        assert_close(&format!("head {h} (owner {owner}) scores, {:?}", c.features), got, &want, 1e-4);
        let got_top = u16s(&predicted[h * c.top_k..(h + 1) * c.top_k]);
        assert_eq!(got_top, top_k(got, c.top_k), "head {h} top-{} of its scores", c.top_k);
    }
}

#[test]
fn heads_match_cpu_forward() {
    let edge0 = Case {
        hidden: 64,
        experts: 16,
        top_k: 3,
        inner: 40,
        moe_layers: 5,
        owners: vec![0, 1, 3],
        features: Features::EDGE0,
    };
    check(&gpu(), &edge0, 4, 1);
    check(&gpu(), &edge0, 1, 2);
    let every = Features { next: true, prev: true, own: true, deep: true };
    check(&gpu(), &Case { features: every, ..edge0 }, 3, 3);
    let hidden_only = Features { next: false, prev: false, own: false, deep: false };
    check(&gpu(), &Case { features: hidden_only, top_k: 1, owners: vec![2], ..edge0 }, 2, 4);
}

#[test]
fn heads_split_into_groups_under_a_small_binding_limit() {
    // 4 KiB bindings: four heads of these sizes per group, so five heads need two groups.
    let case = Case {
        hidden: 16,
        experts: 8,
        top_k: 2,
        inner: 8,
        moe_layers: 6,
        owners: vec![0, 1, 2, 3, 4],
        features: Features::EDGE0,
    };
    check(&gpu_chunked(), &case, 2, 5);
}

#[test]
fn sequence_start_has_no_previous_routing() {
    // After a reset, a one-token step leaves the t−1 block empty: the same as a CPU head
    // given no previous routing.
    let gpu = gpu();
    let mut rng = Rng::new(9);
    let (hidden, experts, k, inner) = (32, 8, 2, 16);
    let f = Features::EDGE0;
    let dims = HeadDims { hidden, dense: hidden, sparse: f.sparse_dim(experts), inner, experts };
    let params = random_params(&mut rng, dims);
    let step = StepUniform::new(&gpu);
    step.set(&gpu, 1, 0);
    let history = PrerouterHistory::new(&gpu, 2, hidden, k);
    let heads = PrerouterHeads::new(&gpu, &history, &[HeadToRun { owner: 0, params: &params }], dims, f, k, 2).unwrap();
    let (h0, h1) = (rng.vec(hidden, -1.0, 1.0), rng.vec(hidden, -1.0, 1.0));
    let (ids0, ids1) = (vec![3u32, 5], vec![1u32, 6]);
    for (j, (h, ids)) in [(&h0, &ids0), (&h1, &ids1)].into_iter().enumerate() {
        let (hb, ib) = (upload_f32(&gpu, h), upload_u32(&gpu, ids));
        let capture = PrerouterCapture::new(&gpu, &step.buffer, &hb, &ib, &history, j, hidden);
        submit(&gpu, |pass| capture.record(&gpu, pass));
    }
    submit(&gpu, |pass| heads.record(&gpu, pass));
    let got = read_f32(&gpu, &heads.logits, experts);
    let ctx = RoutingContext { next: &[1, 6], prev: None, own: &[3, 5] };
    let mut want = vec![0f32; experts];
    Head { dims, params }.forward(&h0, &f.active(experts, &ctx), &mut Tape::default(), &mut want);
    assert_close("first token's scores", &got, &want, 1e-4);
}
