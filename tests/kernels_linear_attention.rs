//! The linear-attention kernels (causal conv1d, the gated delta rule of Gated DeltaNet and of
//! KDA with its safe and softplus gates, their per-token states in a step of draft tokens, gate
//! multiply) against the CPU reference, over
//! several steps so that the conv window and the recurrent state carry over between
//! submissions, with grouped value heads (Gated DeltaNet: `v_heads = 2 * k_heads`) and a key
//! width above the 64 lanes of a workgroup.
//!
//! Tolerances: conv |Δ| ≤ 1e-5·(1+|ref|); delta rule and its state |Δ| ≤ 1e-4·(1+|ref|) (sums
//! of `dk` products, state carried over steps); gate multiply |Δ| ≤ 1e-5·(1+|ref|).

mod common;

use common::{assert_close, gpu, gpu_sequential_delta_rule, read_f32, submit, upload_f32, Rng};
use moestream::gpu::Gpu;
use moestream::gpu::StepUniform;
use moestream::model::LinearKind;
use moestream::ops::causal_conv1d::{CausalConv1d, ConvShape};
use moestream::ops::gate_mul::{GateMul, GateRows};
use moestream::ops::gated_delta_rule::{chunk_scratch_bytes, ChunkScratch, DeltaIo, GatedDeltaRule};
use moestream::reference::ops::{self as refops, DeltaGates, DeltaShape, GateAct};

#[test]
fn causal_conv1d_matches_reference_across_steps() {
    let gpu = gpu();
    let (channels, kernel, stride) = (136, 4, 150);
    let mut rng = Rng::new(11);
    let w = rng.vec(channels * kernel, -1.0, 1.0);
    let mut window = vec![0.0f32; channels * (kernel - 1)];
    let (wb, winb) = (upload_f32(&gpu, &w), upload_f32(&gpu, &window));
    let step = StepUniform::new(&gpu);
    let xb = upload_f32(&gpu, &vec![0.0; 5 * stride]);
    let outb = upload_f32(&gpu, &vec![0.0; 5 * channels]);
    let shape = ConvShape { channels, kernel, in_stride: stride };
    let op = CausalConv1d::new(&gpu, &step.buffer, (&xb, &wb, &winb, &outb), shape);
    let mut pos = 0;
    for n in [5, 1, 2, 1] {
        let x = rng.vec(n * stride, -2.0, 2.0);
        gpu.queue.write_buffer(&xb, 0, bytemuck::cast_slice(&x));
        step.set(&gpu, n, pos);
        submit(&gpu, |pass| op.record(&gpu, pass));
        let mut want = vec![0.0f32; n * channels];
        for t in 0..n {
            let xt = &x[t * stride..t * stride + channels];
            refops::causal_conv1d_step(xt, &mut window, &w, kernel, &mut want[t * channels..(t + 1) * channels]);
        }
        assert_close("conv out", &read_f32(&gpu, &outb, n * channels), &want, 1e-5);
        assert_close("conv window", &read_f32(&gpu, &winb, window.len()), &window, 1e-6);
        pos += n;
    }
}

/// Steps token by token (1), chunked within one chunk (6, 3), over whole and partial chunks (70,
/// 33), and a hybrid fixture's long prompt in one step (1100).
const CHUNKED_STEPS: &[usize] = &[6, 1, 70, 3, 1, 33, 1100];

/// Steps of the token-by-token kernel. Its steps stay under 200 tokens: on lavapipe it writes
/// zeros from about the 201st token of one dispatch on (a step of 300 fails; decode runs it one
/// token per dispatch and longer steps take the chunked form).
const SEQUENTIAL_STEPS: &[usize] = &[6, 1, 70, 3, 1, 33, 150];

/// The delta rule of `kind` on heads of `shape` against the reference over `steps` (their
/// token counts), the state carried from one to the next.
fn delta_rule_matches_reference(gpu: &Gpu, shape: DeltaShape, kind: LinearKind, seed: u64, steps: &[usize]) {
    let (kd, vd, nv) = (shape.k_heads * shape.dk, shape.v_heads * shape.dv, shape.v_heads);
    let conv_dim = 2 * kd + vd;
    // The decay inputs: one per value head, KDA's one per key channel.
    let na = if kind.is_gated_delta_net() { nv } else { kd };
    // The projection row: [conv channels | z | b | a] as the decoder lays it out.
    let (gate_offset, width) = (conv_dim + vd, conv_dim + vd + nv + na);
    let mut rng = Rng::new(seed);
    let decay = [rng.vec(nv, 0.0, 2.5), rng.vec(na, -1.0, 1.0)].concat();
    let mut state = vec![0.0f32; nv * shape.dk * shape.dv];
    let step = StepUniform::new(gpu);
    let max_n = steps.iter().copied().max().unwrap();
    let convb = upload_f32(gpu, &vec![0.0; max_n * conv_dim]);
    let projb = upload_f32(gpu, &vec![0.0; max_n * width]);
    let decayb = upload_f32(gpu, &decay);
    let stateb = upload_f32(gpu, &state);
    let outb = upload_f32(gpu, &vec![0.0; max_n * vd]);
    let scratch = gpu.storage("chunks", chunk_scratch_bytes(shape, max_n));
    let chunks = Some(ChunkScratch { buffer: &scratch, max_tokens: max_n });
    let io = DeltaIo { conv: &convb, proj: &projb, decay_params: &decayb, state: &stateb, out: &outb, chunks };
    let op = GatedDeltaRule::new(gpu, &step.buffer, io, (shape, kind), (width, gate_offset));
    let mut pos = 0;
    for &n in steps {
        let conv = rng.vec(n * conv_dim, -1.0, 1.0);
        // a spans softplus' linear branch (> 20) too.
        let mut proj = rng.vec(n * width, -3.0, 3.0);
        proj[gate_offset + nv] = 25.0;
        gpu.queue.write_buffer(&convb, 0, bytemuck::cast_slice(&conv));
        gpu.queue.write_buffer(&projb, 0, bytemuck::cast_slice(&proj));
        step.set(gpu, n, pos);
        submit(gpu, |pass| op.record(gpu, pass, n));
        let mut want = vec![0.0f32; n * vd];
        for t in 0..n {
            let c = &conv[t * conv_dim..(t + 1) * conv_dim];
            let g = &proj[t * width + gate_offset..(t + 1) * width];
            let gates = DeltaGates { b: &g[..nv], a: &g[nv..], a_log: &decay[..nv], dt_bias: &decay[nv..], kind };
            let qkv = (&c[..kd], &c[kd..2 * kd], &c[2 * kd..]);
            refops::gated_delta_step(shape, qkv, gates, &mut state, &mut want[t * vd..(t + 1) * vd]);
        }
        assert_close(&format!("{kind:?} out"), &read_f32(gpu, &outb, n * vd), &want, 1e-4);
        assert_close(&format!("{kind:?} state"), &read_f32(gpu, &stateb, state.len()), &state, 1e-4);
        pos += n;
    }
}

#[test]
fn gated_delta_rule_matches_reference_across_steps() {
    let shape = DeltaShape { k_heads: 2, v_heads: 4, dk: 72, dv: 80 };
    delta_rule_matches_reference(&gpu(), shape, LinearKind::GatedDeltaNet, 12, CHUNKED_STEPS);
}

#[test]
fn sequential_delta_rule_matches_reference_across_steps() {
    // The token-by-token kernel over steps of several tokens (the chunked form's fallback).
    let gpu = gpu_sequential_delta_rule();
    let shape = DeltaShape { k_heads: 2, v_heads: 4, dk: 72, dv: 80 };
    delta_rule_matches_reference(&gpu, shape, LinearKind::GatedDeltaNet, 16, SEQUENTIAL_STEPS);
    let kda = DeltaShape { k_heads: 3, v_heads: 3, ..shape };
    delta_rule_matches_reference(&gpu, kda, LinearKind::Kda { lower_bound: Some(-5.0) }, 17, SEQUENTIAL_STEPS);
}

#[test]
fn kda_matches_reference_across_steps() {
    // KDA: one decay per key channel, as many key as value heads; the safe gate (Ling's
    // default, bounded below by -5) and the softplus one.
    let shape = DeltaShape { k_heads: 3, v_heads: 3, dk: 72, dv: 80 };
    delta_rule_matches_reference(&gpu(), shape, LinearKind::Kda { lower_bound: Some(-5.0) }, 14, CHUNKED_STEPS);
    delta_rule_matches_reference(&gpu(), shape, LinearKind::Kda { lower_bound: None }, 15, CHUNKED_STEPS);
}

#[test]
fn gate_mul_matches_reference() {
    let gpu = gpu();
    let (n, width, stride, offset) = (3, 40, 100, 24);
    let mut rng = Rng::new(13);
    let g = rng.vec(n * stride, -4.0, 4.0);
    let y = rng.vec(n * width, -2.0, 2.0);
    let step = StepUniform::new(&gpu);
    step.set(&gpu, n, 0);
    // One gate value per value, and one per 8 (a head's: Ling's MLA gate).
    for (act, span) in [(GateAct::Sigmoid, 1), (GateAct::Silu, 1), (GateAct::Sigmoid, 8)] {
        let (gb, yb) = (upload_f32(&gpu, &g), upload_f32(&gpu, &y));
        let op = GateMul::new(&gpu, &step.buffer, (&gb, &yb), GateRows { width, span, stride, offset }, act);
        submit(&gpu, |pass| op.record(&gpu, pass, n));
        let mut want = y.clone();
        for t in 0..n {
            let gates = &g[t * stride + offset..t * stride + offset + width / span];
            refops::gate_mul(&mut want[t * width..(t + 1) * width], gates, span, act);
        }
        assert_close(&format!("{act:?} span {span}"), &read_f32(&gpu, &yb, n * width), &want, 1e-5);
    }
}

#[test]
fn drafted_steps_keep_each_tokens_states() {
    // The kernels of a step of draft tokens (`with_snapshots`) also write the conv window and the
    // recurrent state after every token: each row equals the reference's after that token, and
    // the live state is the last one (Gated DeltaNet and KDA).
    let gpu = gpu();
    let n = 5;
    let (channels, kernel, stride) = (136, 4, 150);
    let mut rng = Rng::new(21);
    let w = rng.vec(channels * kernel, -1.0, 1.0);
    let mut window = rng.vec(channels * (kernel - 1), -1.0, 1.0);
    let (wb, winb) = (upload_f32(&gpu, &w), upload_f32(&gpu, &window));
    let x = rng.vec(n * stride, -2.0, 2.0);
    let (xb, outb) = (upload_f32(&gpu, &x), upload_f32(&gpu, &vec![0.0; n * channels]));
    let snaps = upload_f32(&gpu, &vec![0.0; n * window.len()]);
    let step = StepUniform::new(&gpu);
    let shape = ConvShape { channels, kernel, in_stride: stride };
    let op = CausalConv1d::with_snapshots(&gpu, &step.buffer, (&xb, &wb, &winb, &outb), shape, &snaps);
    step.set(&gpu, n, 7);
    submit(&gpu, |pass| op.record(&gpu, pass));
    let got = read_f32(&gpu, &snaps, n * window.len());
    let mut out = vec![0.0f32; channels];
    for t in 0..n {
        refops::causal_conv1d_step(&x[t * stride..t * stride + channels], &mut window, &w, kernel, &mut out);
        assert_close(&format!("window after token {t}"), &got[t * window.len()..(t + 1) * window.len()], &window, 1e-6);
    }
    for (shape, kind) in [
        (DeltaShape { k_heads: 2, v_heads: 4, dk: 72, dv: 80 }, LinearKind::GatedDeltaNet),
        (DeltaShape { k_heads: 3, v_heads: 3, dk: 72, dv: 80 }, LinearKind::Kda { lower_bound: Some(-5.0) }),
    ] {
        let (kd, vd, nv) = (shape.k_heads * shape.dk, shape.v_heads * shape.dv, shape.v_heads);
        let conv_dim = 2 * kd + vd;
        let na = if kind.is_gated_delta_net() { nv } else { kd };
        let (gate_offset, width) = (conv_dim + vd, conv_dim + vd + nv + na);
        let decay = [rng.vec(nv, 0.0, 2.5), rng.vec(na, -1.0, 1.0)].concat();
        let mut state = rng.vec(nv * shape.dk * shape.dv, -0.5, 0.5);
        let (conv, proj) = (rng.vec(n * conv_dim, -1.0, 1.0), rng.vec(n * width, -3.0, 3.0));
        let (convb, projb, decayb) = (upload_f32(&gpu, &conv), upload_f32(&gpu, &proj), upload_f32(&gpu, &decay));
        let (stateb, outb) = (upload_f32(&gpu, &state), upload_f32(&gpu, &vec![0.0; n * vd]));
        let snaps = upload_f32(&gpu, &vec![0.0; n * state.len()]);
        let io =
            DeltaIo { conv: &convb, proj: &projb, decay_params: &decayb, state: &stateb, out: &outb, chunks: None };
        let op = GatedDeltaRule::with_snapshots(&gpu, &step.buffer, io, (shape, kind), (width, gate_offset), &snaps);
        step.set(&gpu, n, 7);
        submit(&gpu, |pass| op.record(&gpu, pass, n));
        let got = read_f32(&gpu, &snaps, n * state.len());
        let mut out = vec![0.0f32; vd];
        for t in 0..n {
            let c = &conv[t * conv_dim..(t + 1) * conv_dim];
            let g = &proj[t * width + gate_offset..(t + 1) * width];
            let gates = DeltaGates { b: &g[..nv], a: &g[nv..], a_log: &decay[..nv], dt_bias: &decay[nv..], kind };
            refops::gated_delta_step(shape, (&c[..kd], &c[kd..2 * kd], &c[2 * kd..]), gates, &mut state, &mut out);
            let row = &got[t * state.len()..(t + 1) * state.len()];
            assert_close(&format!("{kind:?} state after token {t}"), row, &state, 1e-4);
        }
        assert_close(&format!("{kind:?} live state"), &read_f32(&gpu, &stateb, state.len()), &state, 1e-4);
    }
}
