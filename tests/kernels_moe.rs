//! MoE kernels against the CPU reference: router softmax/top-k (`reference::ops::router_topk`),
//! the routed-expert FFN over the slot arena + slot table (`w · swiglu_mlp` per pair, with
//! experts that are in no slot left untouched), the arena split into many chunks, and the MoE
//! combine with and without the gated shared expert.
//!
//! Tolerances: router ids exact and weights |Δ| ≤ 1e-6 (logits built without near-ties);
//! expert FFN |Δ| ≤ 1e-4·(1+|ref|) for f32, f16 and int4 experts (reference on the f16-rounded /
//! CPU-dequantized weights), chunked arena
//! bit-identical to the unchunked one; moe_combine |Δ| ≤ 1e-5·(1+|ref|).

mod common;

use std::sync::Arc;

use common::{
    as_stored, assert_bits_eq, assert_close, gpu, gpu_chunked, gpu_layouts, gpu_layouts_no_subgroups,
    gpu_layouts_team32, gpu_no_subgroups, lane_wide_formats, read_f32, read_u32, reduce_layouts, submit, upload_f32,
    upload_u32, weight_formats, Rng,
};
use moestream::experts::arena::SlotLayout;
use moestream::experts::{SlotArena, SlotTable};
use moestream::gpu::{Gpu, StepUniform};
use moestream::ops::experts::{ExpertFfn, ExpertIo, ExpertPrefill};
use moestream::ops::moe_combine::MoeCombine;
use moestream::ops::router::{Forced, RouterIo, RouterShape, RouterTopK};
use moestream::ops::WeightFormat;
use moestream::reference::ops as refops;

// ----------------------------------------------------------------------------------- router

/// Logits whose sorted values are at least `gap` apart (a random permutation of a ladder plus
/// jitter below the gap), so top-k choices are unambiguous.
fn ladder_logits(rng: &mut Rng, n: usize, gap: f32) -> Vec<f32> {
    let mut order: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut order);
    let offset = rng.range(-4.0, 2.0);
    order.iter().map(|&r| offset + r as f32 * gap + rng.range(0.0, gap * 0.4)).collect()
}

fn run_router(logits: &[f32], t: usize, e: usize, k: usize, renorm: bool) -> Vec<(&'static str, Vec<u32>, Vec<f32>)> {
    run_router_shape(logits, t, RouterShape::softmax(e, k, renorm))
}

/// The router's (ids, weights) for `shape` in each of `common::reduce_layouts()`, with the
/// layout's name.
fn run_router_shape(logits: &[f32], t: usize, shape: RouterShape<'_>) -> Vec<(&'static str, Vec<u32>, Vec<f32>)> {
    let k = shape.top_k;
    let mut out = Vec::new();
    for (layout, gpu) in reduce_layouts() {
        let step = StepUniform::new(&gpu);
        step.set(&gpu, t, 0);
        let lb = upload_f32(&gpu, logits);
        let ib = upload_u32(&gpu, &vec![u32::MAX; t * k + 1]);
        let wb = upload_f32(&gpu, &vec![-1.0; t * k + 1]);
        let io = RouterIo { logits: &lb, ids: &ib, weights: &wb };
        let op = RouterTopK::new(&gpu, &step.buffer, io, shape);
        submit(&gpu, |pass| op.record(&gpu, pass, t));
        let ids = read_u32(&gpu, &ib, t * k + 1);
        let w = read_f32(&gpu, &wb, t * k + 1);
        assert_eq!(ids[t * k], u32::MAX, "{layout}: router wrote past T*top_k ids");
        assert_eq!(w[t * k], -1.0, "{layout}: router wrote past T*top_k weights");
        out.push((layout, ids[..t * k].to_vec(), w[..t * k].to_vec()));
    }
    out
}

fn check_router(logits: &[f32], t: usize, e: usize, k: usize, renorm: bool) {
    for (layout, ids, w) in run_router(logits, t, e, k, renorm) {
        for tok in 0..t {
            let want = refops::router_topk(&logits[tok * e..(tok + 1) * e], k, renorm);
            for (i, &(id, weight)) in want.iter().enumerate() {
                let what = format!("{layout}: router E={e} k={k} renorm={renorm} T={t} token {tok} choice {i}");
                assert_eq!(ids[tok * k + i] as usize, id, "{what}: expert id");
                let got = w[tok * k + i];
                assert!((got - weight).abs() <= 1e-6, "{what}: weight {got} vs {weight} (|Δ| ≤ 1e-6)");
            }
        }
    }
}

#[test]
fn router_topk_matches_reference() {
    let mut rng = Rng::new(1);
    for &e in &[2usize, 8, 37, 60, 64] {
        for k in 1..=4usize.min(e) {
            for renorm in [false, true] {
                for &t in &[1usize, 3, 17, 70] {
                    let logits: Vec<f32> = (0..t).flat_map(|_| ladder_logits(&mut rng, e, 0.05)).collect();
                    check_router(&logits, t, e, k, renorm);
                }
            }
        }
    }
}

/// Group-limited softmax (DeepSeek-V2) and sigmoid + correction bias (DeepSeek-V3, GLM-4.5)
/// routing, with and without groups, renormalised or not, scaled, against `reference::ops::route`.
#[test]
fn router_group_and_sigmoid_kinds_match_reference() {
    use moestream::model::{MoeSpec, RoutingKind};
    let mut rng = Rng::new(3);
    let kinds = [
        (16usize, 3usize, RoutingKind::SoftmaxGroupLimited { n_group: 4, topk_group: 2 }),
        (64, 6, RoutingKind::SoftmaxGroupLimited { n_group: 8, topk_group: 3 }),
        (8, 2, RoutingKind::SigmoidBiased { n_group: 1, topk_group: 1 }),
        (16, 3, RoutingKind::SigmoidBiased { n_group: 4, topk_group: 2 }),
        (256, 8, RoutingKind::SigmoidBiased { n_group: 8, topk_group: 4 }),
    ];
    for (e, k, routing) in kinds {
        for renorm in [false, true] {
            let moe = MoeSpec {
                num_experts: e,
                top_k: k,
                expert_intermediate: 8,
                routing,
                norm_topk_prob: renorm,
                routed_scaling_factor: 2.5,
                shared_expert_intermediate: None,
                shared_expert_gate: false,
                router_logit_bias: false,
                expert_act: Default::default(),
            };
            let t = 7;
            let logits: Vec<f32> = (0..t).flat_map(|_| ladder_logits(&mut rng, e, 0.05)).collect();
            let bias: Vec<f32> = (0..e).map(|_| rng.range(-0.02, 0.02)).collect();
            let sigmoid_bias = routing.has_bias().then_some(&bias[..]);
            let shape = RouterShape {
                n_experts: e,
                top_k: k,
                renormalize: renorm,
                groups: routing.groups(),
                routed_scale: 2.5,
                sigmoid_bias,
            };
            for (layout, ids, w) in run_router_shape(&logits, t, shape) {
                for tok in 0..t {
                    let want = refops::route(&logits[tok * e..(tok + 1) * e], &moe, sigmoid_bias);
                    for (i, &(id, weight)) in want.iter().enumerate() {
                        let what = format!("{layout}: {routing:?} E={e} k={k} renorm={renorm} token {tok} choice {i}");
                        assert_eq!(ids[tok * k + i] as usize, id, "{what}: expert id");
                        let got = w[tok * k + i];
                        assert!((got - weight).abs() <= 1e-5, "{what}: weight {got} vs {weight} (|Δ| ≤ 1e-5)");
                    }
                }
            }
        }
    }
}

#[test]
fn router_topk_many_experts() {
    // Up to the 256-expert maximum (all eight words of the kernel's taken-bitmask), top_k 8.
    let mut rng = Rng::new(2);
    for &(e, k) in &[(128usize, 8usize), (256, 8), (256, 1), (160, 6)] {
        for renorm in [false, true] {
            let t = 5;
            let logits: Vec<f32> = (0..t).flat_map(|_| ladder_logits(&mut rng, e, 0.05)).collect();
            check_router(&logits, t, e, k, renorm);
        }
    }
}

#[test]
fn router_topk_exact_ties_pick_lower_index() {
    // Exact ties are well defined: the lower expert index is chosen first.
    let e = 12;
    let mut logits = vec![0.5f32; e];
    logits[3] = 2.0;
    logits[9] = 2.0;
    logits[7] = 1.0;
    logits[1] = 1.0;
    check_router(&logits, 1, e, 4, true);
    check_router(&logits, 1, e, 4, false);
    for (layout, ids, _) in run_router(&logits, 1, e, 4, true) {
        assert_eq!(ids, vec![3, 9, 1, 7], "{layout}");
    }
    for (layout, ids, w) in run_router(&vec![0.25f32; 64], 1, 64, 3, false) {
        assert_eq!(ids, vec![0, 1, 2], "{layout}: all-equal logits");
        for x in w {
            assert!((x - 1.0 / 64.0).abs() <= 1e-6, "{layout}: all-equal weight {x}");
        }
    }
}

#[test]
fn forced_router_weighs_the_given_experts() {
    // Prediction-as-routing: the experts come from a buffer (at an offset), the weights from
    // the softmax over all logits. At a spread of ±300 the forced experts' logits are mostly
    // far below the best: renormalised, their weights must still sum to one.
    let mut rng = Rng::new(4);
    for &(e, k, spread) in &[(8usize, 2usize, 3.0), (60, 4, 3.0), (256, 8, 3.0), (8, 2, 300.0), (60, 4, 300.0)] {
        for renorm in [false, true] {
            for (layout, gpu) in reduce_layouts() {
                let step = StepUniform::new(&gpu);
                step.set(&gpu, 1, 0);
                let logits = rng.vec(e, -spread, spread);
                let offset = 5;
                let mut chosen: Vec<usize> = (0..e).collect();
                rng.shuffle(&mut chosen);
                chosen.truncate(k);
                let mut forced = vec![u32::MAX; offset + k + 3];
                for (i, &c) in chosen.iter().enumerate() {
                    forced[offset + i] = c as u32;
                }
                let (lb, fb) = (upload_f32(&gpu, &logits), upload_u32(&gpu, &forced));
                let ib = upload_u32(&gpu, &vec![u32::MAX; k]);
                let wb = upload_f32(&gpu, &vec![-1.0; k]);
                let io = RouterIo { logits: &lb, ids: &ib, weights: &wb };
                let shape = RouterShape::softmax(e, k, renorm);
                let forced = Forced { experts: &fb, offset };
                let op = RouterTopK::with(&gpu, &step.buffer, io, shape, Some(forced), None);
                submit(&gpu, |pass| op.record(&gpu, pass, 1));
                let (ids, w) = (read_u32(&gpu, &ib, k), read_f32(&gpu, &wb, k));
                for (i, (id, weight)) in refops::router_forced(&logits, &chosen, renorm).into_iter().enumerate() {
                    assert_eq!(ids[i] as usize, id, "{layout}: forced E={e} k={k} choice {i}");
                    assert!((w[i] - weight).abs() <= 1e-6, "{layout}: forced E={e} k={k} weight {} vs {weight}", w[i]);
                }
                if renorm {
                    let sum: f32 = w.iter().sum();
                    assert!(
                        (sum - 1.0).abs() < 1e-5,
                        "{layout}: forced E={e} k={k} spread {spread}: weights sum to {sum}"
                    );
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------- expert FFN

struct Expert {
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// A random MoE layer setup: experts, which are resident where, and a routing.
struct FfnCase {
    format: WeightFormat,
    hidden: usize,
    inter: usize,
    n_experts: usize,
    slots: usize,
    layers: usize,
    layer: usize,
    t: usize,
    top_k: usize,
    /// Experts of `layer` to leave out of the arena.
    absent: usize,
    /// How steps of more than three tokens run.
    prefill: ExpertPrefill,
}

struct FfnData {
    /// Experts of every layer, `[layer][expert]`.
    experts: Vec<Vec<Expert>>,
    /// (layer, expert) → slot.
    placement: Vec<(usize, usize, u32)>,
    x: Vec<f32>,
    ids: Vec<u32>,
    route_w: Vec<f32>,
}

const SENTINEL: f32 = 4242.0;

fn ffn_data(c: &FfnCase, seed: u64) -> FfnData {
    let mut rng = Rng::new(seed);
    let (h, i) = (c.hidden, c.inter);
    let experts: Vec<Vec<Expert>> = (0..c.layers)
        .map(|_| {
            (0..c.n_experts)
                .map(|_| Expert {
                    gate: rng.vec(i * h, -0.5, 0.5),
                    up: rng.vec(i * h, -0.5, 0.5),
                    down: rng.vec(h * i, -0.5, 0.5),
                })
                .collect()
        })
        .collect();
    // The layer under test gets n_experts - absent resident experts in random slots; the other
    // slots hold experts of another layer (which must never be used for this layer).
    let mut slots: Vec<u32> = (0..c.slots as u32).collect();
    rng.shuffle(&mut slots);
    let mut resident: Vec<usize> = (0..c.n_experts).collect();
    rng.shuffle(&mut resident);
    resident.truncate(c.n_experts - c.absent);
    assert!(resident.len() <= c.slots);
    let mut placement = Vec::new();
    let mut free = slots.into_iter();
    for &e in &resident {
        placement.push((c.layer, e, free.next().unwrap()));
    }
    let other = (c.layer + 1) % c.layers;
    if other != c.layer {
        for (e, s) in free.enumerate() {
            placement.push((other, e % c.n_experts, s));
        }
    }
    let x = rng.vec(c.t * h, -1.0, 1.0);
    let mut ids = Vec::new();
    for _ in 0..c.t {
        let mut all: Vec<u32> = (0..c.n_experts as u32).collect();
        rng.shuffle(&mut all);
        ids.extend(&all[..c.top_k]);
    }
    let route_w = rng.vec(c.t * c.top_k, 0.05, 1.0);
    FfnData { experts, placement, x, ids, route_w }
}

/// Runs the expert FFN; returns (h, y) buffers read back.
fn run_ffn(gpu: &Arc<Gpu>, c: &FfnCase, d: &FfnData) -> (Vec<f32>, Vec<f32>, usize) {
    let pairs = c.t * c.top_k;
    let step = StepUniform::new(gpu);
    step.set(gpu, c.t, 0);
    let layout = SlotLayout::new(c.format, c.hidden, c.inter).unwrap();
    let arena = SlotArena::new(gpu, c.slots, layout).unwrap();
    let mut table = SlotTable::new(gpu, c.layers, c.n_experts);
    for &(l, e, s) in &d.placement {
        let ex = &d.experts[l][e];
        let bytes = layout.encode(&ex.gate, &ex.up, &ex.down).unwrap();
        arena.write(gpu, s as usize, &bytes);
        table.set(gpu, l, e, s);
    }
    let xb = upload_f32(gpu, &d.x);
    let ib = upload_u32(gpu, &d.ids);
    let wb = upload_f32(gpu, &d.route_w);
    let hb = upload_f32(gpu, &vec![SENTINEL; pairs * c.inter]);
    let yb = upload_f32(gpu, &vec![SENTINEL; (pairs + 1) * c.hidden]);
    let io = ExpertIo { x: &xb, ids: &ib, route_w: &wb, h: &hb, y: &yb, act: (Default::default(), None) };
    let op = ExpertFfn::new(gpu, &step.buffer, io, arena.binding(&table), &arena.layout, c.layer, c.top_k, c.prefill);
    submit(gpu, |pass| op.record(gpu, pass, c.t));
    (read_f32(gpu, &hb, pairs * c.inter), read_f32(gpu, &yb, (pairs + 1) * c.hidden), arena.chunks.len())
}

fn describe(c: &FfnCase) -> String {
    format!(
        "expert FFN {:?} H={} I={} E={} slots={} layer={} T={} k={} {:?}",
        c.format, c.hidden, c.inter, c.n_experts, c.slots, c.layer, c.t, c.top_k, c.prefill
    )
}

fn check_ffn_against_reference(c: &FfnCase, d: &FfnData, h: &[f32], y: &[f32]) {
    let (hd, id) = (c.hidden, c.inter);
    let what = describe(c);

    let mut absent_pairs = 0;
    for j in 0..c.t * c.top_k {
        let e = d.ids[j] as usize;
        let (hj, yj) = (&h[j * id..(j + 1) * id], &y[j * hd..(j + 1) * hd]);
        let resident = d.placement.iter().any(|&(l, pe, _)| l == c.layer && pe == e);
        if !resident {
            absent_pairs += 1;
            assert!(
                hj.iter().chain(yj).all(|&v| v == SENTINEL),
                "{what}: pair {j} routes to non-resident expert {e} but its h/y rows were written"
            );
            continue;
        }
        let ex = &d.experts[c.layer][e];
        let gate = as_stored(c.format, &ex.gate, id, hd);
        let up = as_stored(c.format, &ex.up, id, hd);
        let down = as_stored(c.format, &ex.down, hd, id);
        let xt = &d.x[(j / c.top_k) * hd..(j / c.top_k + 1) * hd];
        // h = silu(gate·x) * (up·x)
        let (mut g, mut u) = (vec![0.0; id], vec![0.0; id]);
        refops::matvec(&gate, id, hd, xt, &mut g);
        refops::matvec(&up, id, hd, xt, &mut u);
        let want_h: Vec<f32> = g.iter().zip(&u).map(|(a, b)| refops::silu(*a) * b).collect();
        assert_close(&format!("{what}: h of pair {j} (expert {e})"), hj, &want_h, 1e-4);
        let mut want_y = vec![0.0; hd];
        refops::swiglu_mlp(&gate, &up, &down, hd, id, xt, &mut want_y);
        for v in want_y.iter_mut() {
            *v *= d.route_w[j];
        }
        assert_close(&format!("{what}: y of pair {j} (expert {e})"), yj, &want_y, 1e-4);
    }
    assert!(y[c.t * c.top_k * hd..].iter().all(|&v| v == SENTINEL), "{what}: wrote y past T*top_k pairs");
    if c.absent > 0 && c.t * c.top_k >= c.n_experts {
        assert!(absent_pairs > 0, "{what}: test routed no pair to an absent expert");
    }
}

fn case(format: WeightFormat, hidden: usize, inter: usize, t: usize, top_k: usize) -> FfnCase {
    let prefill = ExpertPrefill::Pairs;
    FfnCase { format, hidden, inter, n_experts: 12, slots: 9, layers: 3, layer: 1, t, top_k, absent: 4, prefill }
}

/// Both prefill paths for steps of more than three tokens (decode steps have one).
fn prefills(t: usize) -> &'static [ExpertPrefill] {
    match t {
        0..=3 => &[ExpertPrefill::Pairs],
        _ => &[ExpertPrefill::Pairs, ExpertPrefill::Gather],
    }
}

#[test]
fn expert_ffn_matches_reference() {
    let mut seed = 10;
    for format in weight_formats() {
        for &(hidden, inter) in &[(40usize, 24usize), (72, 48), (16, 520), (520, 16)] {
            for &(t, k) in &[(1usize, 1usize), (1, 4), (3, 2), (9, 3), (17, 4)] {
                seed += 1;
                for &prefill in prefills(t) {
                    let c = FfnCase { prefill, ..case(format, hidden, inter, t, k) };
                    let d = ffn_data(&c, seed);
                    let (h, y, _) = run_ffn(&gpu(), &c, &d);
                    check_ffn_against_reference(&c, &d, &h, &y);
                }
            }
        }
    }
}

#[test]
fn expert_ffn_in_the_gpu_layouts_matches_reference() {
    // What hardware GPUs run for decode steps: expert_gate_up / expert_down in 8-lane (or
    // 32-lane) teams summed by subgroup shuffles, or through workgroup memory without subgroups
    // (same order).
    let (teams, shared, team32) = (gpu_layouts(), gpu_layouts_no_subgroups(), gpu_layouts_team32());
    let mut seed = 60;
    for format in weight_formats() {
        // (64, 96), (96, 64): int4 in groups of 32 takes the WIDE 16-byte loads.
        for &(hidden, inter) in &[(40usize, 24usize), (72, 48), (16, 520), (520, 16), (64, 96), (96, 64)] {
            for &(t, k) in &[(1usize, 1usize), (1, 4), (3, 2)] {
                seed += 1;
                let c = case(format, hidden, inter, t, k);
                let d = ffn_data(&c, seed);
                let (h, y, _) = run_ffn(&teams, &c, &d);
                check_ffn_against_reference(&c, &d, &h, &y);
                let (h32, y32, _) = run_ffn(&team32, &c, &d);
                check_ffn_against_reference(&c, &d, &h32, &y32);
                if teams.caps.subgroups {
                    let (h2, y2, _) = run_ffn(&shared, &c, &d);
                    assert_bits_eq(&format!("{}: h, shared vs shuffles", describe(&c)), &h2, &h);
                    assert_bits_eq(&format!("{}: y, shared vs shuffles", describe(&c)), &y2, &y);
                }
            }
        }
    }
}

#[test]
fn expert_ffn_lane_wide_loads_are_bit_identical() {
    // expert_gate_up / expert_down on CPU adapters with 8-lane subgroups read int4 and f16
    // projections with rows of a multiple of 64 two groups a step (LANE_WIDE), and take the
    // input lane by lane without subgroups: the same additions in the same order.
    let (with, without) = (gpu(), gpu_no_subgroups());
    let mut seed = 90;
    let shapes = [(64usize, 128usize), (128, 64), (192, 320), (64, 40)];
    for (format, &(hidden, inter)) in lane_wide_formats().into_iter().flat_map(|f| shapes.iter().map(move |s| (f, s))) {
        for &(t, k) in &[(1usize, 1usize), (1, 4), (3, 2)] {
            seed += 1;
            let c = case(format, hidden, inter, t, k);
            let d = ffn_data(&c, seed);
            let (h, y, _) = run_ffn(&with, &c, &d);
            check_ffn_against_reference(&c, &d, &h, &y);
            let (h2, y2, _) = run_ffn(&without, &c, &d);
            assert_bits_eq(&format!("{}: h, lane-wide vs one-word loads", describe(&c)), &h, &h2);
            assert_bits_eq(&format!("{}: y, lane-wide vs one-word loads", describe(&c)), &y, &y2);
        }
    }
}

#[test]
fn expert_ffn_layer_zero_and_all_resident() {
    // Layer 0 (table base 0) with every expert resident and every slot used.
    for (format, &prefill) in weight_formats().into_iter().flat_map(|f| prefills(17).iter().map(move |p| (f, p))) {
        let c = FfnCase {
            format,
            hidden: 40,
            inter: 24,
            n_experts: 8,
            slots: 8,
            layers: 1,
            layer: 0,
            t: 17,
            top_k: 2,
            absent: 0,
            prefill,
        };
        let d = ffn_data(&c, 77);
        let (h, y, _) = run_ffn(&gpu(), &c, &d);
        check_ffn_against_reference(&c, &d, &h, &y);
    }
}

#[test]
fn expert_ffn_chunked_arena_is_bit_identical() {
    let chunked = gpu_chunked();
    let mut seed = 300;
    // With a 4096-byte binding limit a 16×16 expert (3 KiB in f32, 1.5 KiB in f16) leaves one
    // or two slots per arena chunk, so pairs are spread over many dispatches.
    for format in weight_formats() {
        for &(hidden, inter) in &[(16usize, 16usize), (8, 40)] {
            for &(t, k) in &[(1usize, 2usize), (9, 3), (17, 4)] {
                seed += 1;
                for &prefill in prefills(t) {
                    let c = FfnCase { prefill, ..case(format, hidden, inter, t, k) };
                    let d = ffn_data(&c, seed);
                    let (h1, y1, n1) = run_ffn(&gpu(), &c, &d);
                    let (h2, y2, n2) = run_ffn(&chunked, &c, &d);
                    let what = describe(&c);
                    assert_eq!(n1, 1, "{what}: default arena should be one chunk");
                    assert!(n2 >= 4, "{what}: chunked arena has only {n2} chunks");
                    assert_bits_eq(&format!("chunked {what}: h"), &h2, &h1);
                    assert_bits_eq(&format!("chunked {what}: y"), &y2, &y1);
                    check_ffn_against_reference(&c, &d, &h2, &y2);
                }
            }
        }
    }
}

#[test]
fn expert_ffn_prefill_tiles_many_pairs_per_expert() {
    // Gathered prefill puts each expert's pairs into 32-pair tiles: few experts give one expert
    // several tiles, and routing every pair to one expert (twice per token) gives it more pairs
    // than the step has tokens, served by the grid-stride over the dispatch's token tiles.
    let mut seed = 600;
    for format in weight_formats() {
        for crowd in [false, true] {
            seed += 1;
            let c = FfnCase {
                format,
                hidden: 40,
                inter: 72,
                n_experts: 4,
                slots: 4,
                layers: 2,
                layer: 1,
                t: 70,
                top_k: 2,
                absent: 0,
                prefill: ExpertPrefill::Gather,
            };
            let mut d = ffn_data(&c, seed);
            if crowd {
                d.ids.iter_mut().for_each(|id| *id = 2);
            }
            let (h, y, _) = run_ffn(&gpu(), &c, &d);
            check_ffn_against_reference(&c, &d, &h, &y);
        }
    }
}

// ------------------------------------------------------------------------------ moe_combine

#[test]
fn moe_combine_with_and_without_shared() {
    let mut rng = Rng::new(9);
    let gpu = gpu();
    for &hidden in &[40usize, 72, 1000] {
        for top_k in 1..=4usize {
            for &t in &[1usize, 3, 17, 70] {
                for shared in [false, true] {
                    let x0 = rng.vec((t + 1) * hidden, -2.0, 2.0);
                    let y = rng.vec(t * top_k * hidden, -1.0, 1.0);
                    let so = rng.vec(t * hidden, -1.0, 1.0);
                    let sg = rng.vec(t, -4.0, 4.0);
                    let step = StepUniform::new(&gpu);
                    step.set(&gpu, t, 0);
                    let xb = upload_f32(&gpu, &x0);
                    let yb = upload_f32(&gpu, &y);
                    let sob = upload_f32(&gpu, &so);
                    let sgb = upload_f32(&gpu, &sg);
                    let op =
                        MoeCombine::new(&gpu, &step.buffer, &yb, &xb, shared.then_some((&sob, &sgb)), hidden, top_k);
                    submit(&gpu, |pass| op.record(&gpu, pass, t));
                    let got = read_f32(&gpu, &xb, x0.len());
                    let mut want = x0.clone();
                    for tok in 0..t {
                        for n in 0..hidden {
                            let mut s = 0.0f32;
                            for j in 0..top_k {
                                s += y[(tok * top_k + j) * hidden + n];
                            }
                            if shared {
                                s += refops::sigmoid(sg[tok]) * so[tok * hidden + n];
                            }
                            want[tok * hidden + n] += s;
                        }
                    }
                    let what = format!("moe_combine H={hidden} k={top_k} T={t} shared={shared}");
                    assert_close(&what, &got, &want, 1e-5);
                    assert_bits_eq(&format!("{what}: row T untouched"), &got[t * hidden..], &x0[t * hidden..]);
                }
            }
        }
    }
}
