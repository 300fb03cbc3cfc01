//! The prerouter on the GPU (the router top-k's capture of each MoE layer's last token, then
//! every head in one dispatch: fc1, scores, top-k) against the CPU heads ([`Head::forward`],
//! the training code's forward pass), heads reading the next token's embedding included.

mod common;

use common::{assert_close, gpu, gpu_chunked, read_f32, read_u32, submit, Rng};
use moestream::gpu::{Gpu, StepUniform};
use moestream::ops::prerouter_heads::{HeadToRun, PrerouterHeads, PrerouterHistory};
use moestream::ops::router::{Capture, RouterIo, RouterShape, RouterTopK};
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

/// A router top-k over `logits` that captures MoE layer `layer` into `history`.
struct CapturingRouter {
    router: RouterTopK,
    logits: wgpu::Buffer,
    ids: wgpu::Buffer,
    hn: wgpu::Buffer,
}

fn capturing_router(
    gpu: &Gpu,
    step: &StepUniform,
    history: &PrerouterHistory,
    c: &Case,
    layer: usize,
    max_tokens: usize,
) -> CapturingRouter {
    let f = |n: usize| (n * 4) as u64;
    let logits = gpu.storage("logits", f(max_tokens * c.experts));
    let ids = gpu.storage("ids", f(max_tokens * c.top_k));
    let weights = gpu.storage("weights", f(max_tokens * c.top_k));
    let hn = gpu.storage("hn", f(max_tokens * c.hidden));
    let io = RouterIo { logits: &logits, ids: &ids, weights: &weights };
    let shape = RouterShape::softmax(c.experts, c.top_k, true);
    let capture = Capture { hn: &hn, history, layer, hidden: c.hidden };
    let router = RouterTopK::with(gpu, &step.buffer, io, shape, None, Some(capture));
    CapturingRouter { router, logits, ids, hn }
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
    // The next token's embedding: the first row of a buffer holding the step's rows.
    let embedding = rng.vec(c.hidden, -1.0, 1.0);
    let step_rows = [embedding.clone(), rng.vec(2 * c.hidden, -1.0, 1.0)].concat();
    let embedding_buffer = gpu.upload("next embedding", bytemuck::cast_slice(&step_rows));
    let heads =
        PrerouterHeads::new(gpu, &history, &to_run, dims, c.features, c.features.token.then_some(&embedding_buffer))
            .unwrap();
    let routers: Vec<CapturingRouter> =
        (0..c.moe_layers).map(|j| capturing_router(gpu, &step, &history, c, j, first)).collect();
    // Per layer, per token of both steps: hidden row and routed ids.
    let mut seen_h: Vec<Vec<Vec<f32>>> = vec![Vec::new(); c.moe_layers];
    let mut seen_ids: Vec<Vec<Vec<u32>>> = vec![Vec::new(); c.moe_layers];
    for n in [first, 1] {
        step.set(gpu, n, 0);
        for (j, r) in routers.iter().enumerate() {
            let h = rng.vec(n * c.hidden, -1.0, 1.0);
            gpu.queue.write_buffer(&r.hn, 0, bytemuck::cast_slice(&h));
            gpu.queue.write_buffer(&r.logits, 0, bytemuck::cast_slice(&rng.vec(n * c.experts, -2.0, 2.0)));
            submit(gpu, |pass| r.router.record(gpu, pass, n));
            seen_h[j].extend(h.chunks(c.hidden).map(<[f32]>::to_vec));
            seen_ids[j].extend(read_u32(gpu, &r.ids, n * c.top_k).chunks(c.top_k).map(<[u32]>::to_vec));
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
        if c.features.token {
            x.extend_from_slice(&embedding);
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
    let every = Features { next: true, prev: true, own: true, deep: true, token: false };
    check(&gpu(), &Case { features: every, ..edge0 }, 3, 3);
    let hidden_only = Features { next: false, prev: false, own: false, deep: false, token: false };
    check(&gpu(), &Case { features: hidden_only, top_k: 1, owners: vec![2], ..edge0 }, 2, 4);
}

#[test]
fn heads_reading_the_next_token_match_cpu_forward() {
    let case = Case {
        hidden: 48,
        experts: 12,
        top_k: 4,
        inner: 24,
        moe_layers: 4,
        owners: vec![0, 1, 2],
        features: "next,prev,token".parse().unwrap(),
    };
    check(&gpu(), &case, 3, 6);
    check(&gpu(), &Case { features: "next,prev,own,deep,token".parse().unwrap(), ..case }, 1, 7);
    check(&gpu(), &Case { features: "token".parse().unwrap(), owners: vec![1], ..case }, 2, 8);
    // The embedding is bound exactly when the heads read it.
    let gpu = gpu();
    let (history, buffer) = (PrerouterHistory::new(&gpu, 2, 8, 2), gpu.storage("x", 64));
    let dims = HeadDims { hidden: 8, dense: 16, sparse: 0, inner: 4, experts: 4 };
    let params = HeadParams::zeros(dims);
    let heads = [HeadToRun { owner: 0, params: &params }];
    let token: Features = "token".parse().unwrap();
    assert!(PrerouterHeads::new(&gpu, &history, &heads, dims, token, None).is_err());
    let dims = HeadDims { dense: 8, ..dims };
    let params = HeadParams::zeros(dims);
    let heads = [HeadToRun { owner: 0, params: &params }];
    assert!(PrerouterHeads::new(&gpu, &history, &heads, dims, "none".parse().unwrap(), Some(&buffer)).is_err());
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
    let heads = PrerouterHeads::new(&gpu, &history, &[HeadToRun { owner: 0, params: &params }], dims, f, None).unwrap();
    let case = Case { hidden, experts, top_k: k, inner, moe_layers: 2, owners: vec![0], features: f };
    let (h0, h1) = (rng.vec(hidden, -1.0, 1.0), rng.vec(hidden, -1.0, 1.0));
    // Logits whose top-2 are known: layer 0 routes to 3, 5 and layer 1 to 1, 6.
    let ladder = |top: [usize; 2]| {
        let mut l = vec![0f32; experts];
        l[top[0]] = 3.0;
        l[top[1]] = 2.0;
        l
    };
    for (j, (h, logits)) in [(&h0, ladder([3, 5])), (&h1, ladder([1, 6]))].into_iter().enumerate() {
        let r = capturing_router(&gpu, &step, &history, &case, j, 1);
        gpu.queue.write_buffer(&r.hn, 0, bytemuck::cast_slice(h));
        gpu.queue.write_buffer(&r.logits, 0, bytemuck::cast_slice(&logits));
        submit(&gpu, |pass| r.router.record(&gpu, pass, 1));
    }
    submit(&gpu, |pass| heads.record(&gpu, pass));
    let got = read_f32(&gpu, &heads.logits, experts);
    let ctx = RoutingContext { next: &[1, 6], prev: None, own: &[3, 5] };
    let mut want = vec![0f32; experts];
    Head { dims, params }.forward(&h0, &f.active(experts, &ctx), &mut Tape::default(), &mut want);
    assert_close("first token's scores", &got, &want, 1e-4);
}
