//! The fused FFN norm + router + top-k (`norm_router`, the CPU layouts' one dispatch for what
//! `rms_norm`, the router `matvec` and `router_topk` do) against the kernel it replaces and the
//! CPU reference: its normalised rows bit-identical to `rms_norm`'s (and within 1e-5·(1+|ref|)
//! of `reference::ops::rms_norm`), its routing `reference::ops::route`'s of the logits computed
//! in f64 from those rows on the weights as stored (ids exact, weights |Δ| ≤ 2e-5), for f32,
//! f16, int4 and GGUF routers, softmax, group-limited and sigmoid + bias routing, a router logit
//! bias, 2..=256 experts and several tokens. Tokens whose reference routing changes when the
//! logits move by 2e-5 (a near tie) are not compared by id; at most a quarter may be skipped.
//! Its prerouter variants (`FORCED`, `CAPTURE`) run in `tests/prerouter.rs` and
//! `tests/prerouter_families.rs`, whose predicted routing must be the CPU heads' prediction from
//! the captured rows.

mod common;

use common::{
    as_stored, assert_bits_eq, assert_close, gpu, gpu_layouts, read_f32, read_u32, submit, upload_f32, upload_u32,
    weight_formats, Rng,
};
use moestream::gpu::{Gpu, StepUniform};
use moestream::model::gguf::GgufModel;
use moestream::model::{MoeSpec, RoutingKind};
use moestream::ops::norm_router::{NormRouter, NormRouterIo};
use moestream::ops::rms_norm::{NormRows, RmsNorm};
use moestream::ops::router::RouterShape;
use moestream::ops::GpuMatrix;
use moestream::reference::ops as refops;

const EPS: f32 = 1e-5;

/// One router: sizes, rule and whether its logits have a bias.
#[derive(Clone, Copy, Debug)]
struct Case {
    hidden: usize,
    experts: usize,
    top_k: usize,
    routing: RoutingKind,
    renorm: bool,
    logit_bias: bool,
    tokens: usize,
}

fn moe_spec(c: &Case) -> MoeSpec {
    MoeSpec {
        num_experts: c.experts,
        top_k: c.top_k,
        expert_intermediate: 8,
        routing: c.routing,
        norm_topk_prob: c.renorm,
        routed_scaling_factor: 1.5,
        shared_expert_intermediate: None,
        shared_expert_gate: false,
        router_logit_bias: c.logit_bias,
        expert_act: Default::default(),
    }
}

/// What the fused kernel and the lone norm wrote: (hn, ids, weights, hn of rms_norm).
struct Outputs {
    hn: Vec<f32>,
    ids: Vec<u32>,
    weights: Vec<f32>,
    norm_hn: Vec<f32>,
}

/// Inputs of one case: residual rows, norm weight, logit bias, correction bias.
struct Inputs {
    x: Vec<f32>,
    norm_w: Vec<f32>,
    logit_bias: Vec<f32>,
    sigmoid_bias: Vec<f32>,
}

fn inputs(c: &Case, rng: &mut Rng) -> Inputs {
    Inputs {
        x: rng.vec(c.tokens * c.hidden, -2.0, 2.0),
        norm_w: rng.vec(c.hidden, 0.5, 1.5),
        logit_bias: rng.vec(c.experts, -0.3, 0.3),
        sigmoid_bias: rng.vec(c.experts, -0.02, 0.02),
    }
}

fn shape<'a>(c: &Case, d: &'a Inputs) -> RouterShape<'a> {
    RouterShape {
        n_experts: c.experts,
        top_k: c.top_k,
        renormalize: c.renorm,
        groups: c.routing.groups(),
        routed_scale: 1.5,
        sigmoid_bias: c.routing.has_bias().then_some(&d.sigmoid_bias[..]),
    }
}

fn run(gpu: &Gpu, c: &Case, d: &Inputs, router: &GpuMatrix) -> Outputs {
    let (t, h, k) = (c.tokens, c.hidden, c.top_k);
    let step = StepUniform::new(gpu);
    step.set(gpu, t, 0);
    let x = upload_f32(gpu, &d.x);
    let norm_w = upload_f32(gpu, &d.norm_w);
    let bias = upload_f32(gpu, &d.logit_bias);
    let hn = upload_f32(gpu, &vec![-7.0; (t + 1) * h]);
    let ids = upload_u32(gpu, &vec![u32::MAX; t * k + 1]);
    let weights = upload_f32(gpu, &vec![-1.0; t * k + 1]);
    let io = NormRouterIo {
        x: &x,
        norm_weight: &norm_w,
        hn: &hn,
        router,
        logit_bias: c.logit_bias.then_some(&bias),
        ids: &ids,
        weights: &weights,
    };
    let op = NormRouter::new(gpu, &step.buffer, io, shape(c, d), EPS).expect("the CPU layout fuses the router");
    submit(gpu, |pass| op.record(gpu, pass, t));
    let norm_out = upload_f32(gpu, &vec![0.0; t * h]);
    let rows = NormRows { n: h, rows_per_token: 1, at_cache_pos: false };
    let norm = RmsNorm::new(gpu, &step.buffer, &norm_w, &x, Some(&norm_out), rows, EPS);
    submit(gpu, |pass| norm.record(gpu, pass, t));
    let hn = read_f32(gpu, &hn, (t + 1) * h);
    assert!(hn[t * h..].iter().all(|&v| v == -7.0), "{c:?}: wrote past the step's rows of hn");
    let ids = read_u32(gpu, &ids, t * k + 1);
    let weights = read_f32(gpu, &weights, t * k + 1);
    assert_eq!((ids[t * k], weights[t * k]), (u32::MAX, -1.0), "{c:?}: wrote past T*top_k");
    Outputs {
        hn: hn[..t * h].to_vec(),
        ids: ids[..t * k].to_vec(),
        weights: weights[..t * k].to_vec(),
        norm_hn: read_f32(gpu, &norm_out, t * h),
    }
}

/// Runs `c` with `stored` (the router as the GPU holds it) and checks it; returns (tokens
/// compared by id, tokens skipped as near ties).
fn check(gpu: &Gpu, c: &Case, d: &Inputs, router: &GpuMatrix, stored: &[f32], what: &str) -> (usize, usize) {
    let (h, e, k) = (c.hidden, c.experts, c.top_k);
    let out = run(gpu, c, d, router);
    assert_bits_eq(&format!("{what}: hn against rms_norm"), &out.hn, &out.norm_hn);
    let mut want_hn = vec![0.0; c.tokens * h];
    for (xt, ot) in d.x.chunks(h).zip(want_hn.chunks_mut(h)) {
        refops::rms_norm(xt, &d.norm_w, EPS, ot);
    }
    assert_close(&format!("{what}: hn against the reference"), &out.hn, &want_hn, 1e-5);
    let moe = moe_spec(c);
    let sigmoid_bias = c.routing.has_bias().then_some(&d.sigmoid_bias[..]);
    let mut rng = Rng::new(99);
    let (mut compared, mut skipped) = (0, 0);
    for tok in 0..c.tokens {
        let hn = &out.hn[tok * h..(tok + 1) * h];
        let logits: Vec<f32> = (0..e)
            .map(|r| {
                let dot: f64 = stored[r * h..(r + 1) * h].iter().zip(hn).map(|(&w, &v)| w as f64 * v as f64).sum();
                (dot + if c.logit_bias { d.logit_bias[r] as f64 } else { 0.0 }) as f32
            })
            .collect();
        let want = refops::route(&logits, &moe, sigmoid_bias);
        let ids_of = |r: &[(usize, f32)]| r.iter().map(|&(i, _)| i).collect::<Vec<_>>();
        let near_tie = (0..4).any(|_| {
            let moved: Vec<f32> = logits.iter().map(|l| l + rng.range(-2e-5, 2e-5)).collect();
            ids_of(&refops::route(&moved, &moe, sigmoid_bias)) != ids_of(&want)
        });
        if near_tie {
            skipped += 1;
            continue;
        }
        compared += 1;
        for (i, &(id, weight)) in want.iter().enumerate() {
            let at = format!("{what}: token {tok} choice {i}");
            assert_eq!(out.ids[tok * k + i] as usize, id, "{at}: expert id");
            let got = out.weights[tok * k + i];
            assert!((got - weight).abs() <= 2e-5, "{at}: weight {got} vs {weight} (|Δ| ≤ 2e-5)");
        }
    }
    (compared, skipped)
}

fn cases() -> Vec<Case> {
    let plain = |hidden, experts, top_k, tokens| Case {
        hidden,
        experts,
        top_k,
        routing: RoutingKind::Softmax,
        renorm: true,
        logit_bias: false,
        tokens,
    };
    vec![
        plain(64, 2, 1, 1),
        plain(512, 16, 2, 3),
        Case { renorm: false, logit_bias: true, ..plain(128, 32, 4, 5) },
        plain(256, 128, 8, 2),
        Case { routing: RoutingKind::SoftmaxGroupLimited { n_group: 8, topk_group: 3 }, ..plain(192, 64, 6, 4) },
        Case { routing: RoutingKind::SigmoidBiased { n_group: 1, topk_group: 1 }, ..plain(64, 8, 2, 3) },
        Case { routing: RoutingKind::SigmoidBiased { n_group: 8, topk_group: 4 }, ..plain(128, 256, 8, 2) },
    ]
}

#[test]
fn norm_router_matches_rms_norm_and_the_reference_in_every_format() {
    let gpu = gpu();
    let mut rng = Rng::new(7);
    let (mut compared, mut skipped) = (0, 0);
    for c in cases() {
        for format in weight_formats() {
            let d = inputs(&c, &mut rng);
            let w = rng.vec(c.experts * c.hidden, -0.2, 0.2);
            let t = moestream::model::weights::HostTensor::new(vec![c.experts, c.hidden], w.clone());
            let router = GpuMatrix::upload(&gpu, "router", &t, format).unwrap();
            let stored = as_stored(format, &w, c.experts, c.hidden);
            let (n, s) = check(&gpu, &c, &d, &router, &stored, &format!("{format:?} {c:?}"));
            compared += n;
            skipped += s;
        }
    }
    assert!(skipped * 4 <= compared + skipped, "{skipped} of {} tokens were near ties", compared + skipped);
}

/// GGUF routers in their own block types (`tests/fixtures/gguf/quants.gguf`, the `gguf`
/// package's dequantization as the stored values).
#[test]
fn norm_router_reads_gguf_routers() {
    let gpu = gpu();
    let m = GgufModel::open(&common::fixtures_dir().join("gguf/quants.gguf")).unwrap();
    let mut rng = Rng::new(8);
    for name in ["BF16", "Q8_0", "Q4_0", "Q4_K"] {
        let info = m.info(name).unwrap();
        let (rows, cols) = (info.shape[0], info.shape[1]);
        let router = GpuMatrix::upload_gguf(&gpu, name, rows, cols, info.ggml_type, m.bytes(name).unwrap()).unwrap();
        let stored = m.dequantize(&format!("{name}.ref")).unwrap();
        let c = Case {
            hidden: cols,
            experts: rows,
            top_k: 2.min(rows),
            routing: RoutingKind::Softmax,
            renorm: true,
            logit_bias: true,
            tokens: 3,
        };
        let d = inputs(&c, &mut rng);
        let (compared, _) = check(&gpu, &c, &d, &router, &stored, name);
        assert!(compared > 0, "{name}: every token was a near tie");
    }
}

/// GPUs keep the three kernels: a spread matmul beats one workgroup per token reading the
/// whole router there.
#[test]
fn gpu_layouts_do_not_fuse_the_router() {
    let gpu = gpu_layouts();
    let c = Case {
        hidden: 64,
        experts: 8,
        top_k: 2,
        routing: RoutingKind::Softmax,
        renorm: true,
        logit_bias: false,
        tokens: 1,
    };
    let mut rng = Rng::new(9);
    let d = inputs(&c, &mut rng);
    let t = moestream::model::weights::HostTensor::new(vec![8, 64], rng.vec(8 * 64, -0.2, 0.2));
    let router = GpuMatrix::upload(&gpu, "router", &t, moestream::ops::WeightFormat::F32).unwrap();
    let b = upload_f32(&gpu, &[0.0; 64]);
    let io = NormRouterIo { x: &b, norm_weight: &b, hn: &b, router: &router, logit_bias: None, ids: &b, weights: &b };
    let step = StepUniform::new(&gpu);
    assert!(NormRouter::new(&gpu, &step.buffer, io, shape(&c, &d), EPS).is_none());
}
