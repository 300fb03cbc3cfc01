//! One prerouter head: parameters, forward pass and hand-written backward pass.
//!
//! ```text
//! a      = fc1.weight · [x, multi-hot] + fc1.bias          (inner)
//! g      = gelu_erf(a) = a · Φ(a)
//! logits = fc2.weight · g + fc2.bias + skip.weight · h      (experts)
//! ```
//!
//! `x` is the dense input: `h` (the owning layer's hidden state) optionally followed by more
//! hidden states; the skip reads `h` only.
//!
//! Weights are row-major `[out, in]` like PyTorch's `nn.Linear`. The multi-hot part of the input
//! is sparse, so it is passed as the indices of its ones.

use crate::util::rng::SplitMix64;

/// The sizes of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadDims {
    /// Model hidden size (the skip's input: the first `hidden` entries of the dense part).
    pub hidden: usize,
    /// Width of the dense part of the input (`hidden`, or more with extra hidden states).
    pub dense: usize,
    /// Width of the multi-hot part of the input.
    pub sparse: usize,
    /// fc1's output width.
    pub inner: usize,
    /// Experts scored (fc2's and the skip's output width).
    pub experts: usize,
}

impl HeadDims {
    /// fc1's input width.
    pub fn input(&self) -> usize {
        self.dense + self.sparse
    }
}

/// A head's tensors (also used for gradients and optimiser moments, same shapes).
#[derive(Clone, Debug, PartialEq)]
pub struct HeadParams {
    /// `[inner, dense + sparse]`.
    pub fc1_weight: Vec<f32>,
    /// `[inner]`.
    pub fc1_bias: Vec<f32>,
    /// `[experts, inner]`.
    pub fc2_weight: Vec<f32>,
    /// `[experts]`.
    pub fc2_bias: Vec<f32>,
    /// `[experts, hidden]`.
    pub skip_weight: Vec<f32>,
}

impl HeadParams {
    /// All zeros.
    pub fn zeros(d: HeadDims) -> HeadParams {
        HeadParams {
            fc1_weight: vec![0.0; d.inner * d.input()],
            fc1_bias: vec![0.0; d.inner],
            fc2_weight: vec![0.0; d.experts * d.inner],
            fc2_bias: vec![0.0; d.experts],
            skip_weight: vec![0.0; d.experts * d.hidden],
        }
    }

    /// Every tensor, in a fixed order.
    pub fn tensors(&self) -> [&Vec<f32>; 5] {
        [&self.fc1_weight, &self.fc1_bias, &self.fc2_weight, &self.fc2_bias, &self.skip_weight]
    }

    /// Every tensor, mutably, in the order of [`tensors`](Self::tensors).
    pub fn tensors_mut(&mut self) -> [&mut Vec<f32>; 5] {
        [&mut self.fc1_weight, &mut self.fc1_bias, &mut self.fc2_weight, &mut self.fc2_bias, &mut self.skip_weight]
    }

    /// Sets every entry to zero.
    pub fn clear(&mut self) {
        for t in self.tensors_mut() {
            t.fill(0.0);
        }
    }
}

/// A head: sizes and parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Head {
    /// Sizes.
    pub dims: HeadDims,
    /// Parameters.
    pub params: HeadParams,
}

/// What the forward pass keeps for the backward pass.
#[derive(Clone, Debug, Default)]
pub struct Tape {
    /// fc1's output before the activation.
    pub pre: Vec<f32>,
    /// The activation's output.
    pub act: Vec<f32>,
}

/// `Σ a_i b_i` with eight independent accumulators (so the compiler vectorises it).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += alpha · x`.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// The error function (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7), evaluated in f64.
pub fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let y = 1.0 - poly * (-x * x).exp();
    y.copysign(x)
}

/// `x · Φ(x)` (GELU with the exact normal CDF).
pub fn gelu(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// d gelu / dx = `Φ(x) + x · φ(x)`.
pub fn gelu_grad(x: f32) -> f32 {
    let x = f64::from(x);
    let cdf = 0.5 * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2));
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    (cdf + x * pdf) as f32
}

impl Head {
    /// A fresh head: fc1 Xavier-uniform from `rng`, fc2 zero (so the head starts as its skip),
    /// biases zero, the skip set to `skip` (`[experts, hidden]`, e.g. the next layer's router)
    /// or zero.
    pub fn new(dims: HeadDims, skip: Option<&[f32]>, rng: &mut SplitMix64) -> Head {
        let mut params = HeadParams::zeros(dims);
        let limit = (6.0 / (dims.input() + dims.inner) as f32).sqrt();
        for w in &mut params.fc1_weight {
            *w = rng.next_signed() * limit;
        }
        if let Some(s) = skip {
            params.skip_weight.copy_from_slice(s);
        }
        Head { dims, params }
    }

    /// Scores of every expert for input `[x, multi-hot with ones at active]` into `logits`,
    /// keeping intermediates in `tape`.
    pub fn forward(&self, x: &[f32], active: &[usize], tape: &mut Tape, logits: &mut [f32]) {
        let d = self.dims;
        let p = &self.params;
        let width = d.input();
        tape.pre.resize(d.inner, 0.0);
        tape.act.resize(d.inner, 0.0);
        for f in 0..d.inner {
            let row = &p.fc1_weight[f * width..(f + 1) * width];
            let sparse: f32 = active.iter().map(|&i| row[d.dense + i]).sum();
            let a = p.fc1_bias[f] + dot(&row[..d.dense], x) + sparse;
            tape.pre[f] = a;
            tape.act[f] = gelu(a);
        }
        for (e, z) in logits.iter_mut().enumerate().take(d.experts) {
            *z = p.fc2_bias[e]
                + dot(&p.fc2_weight[e * d.inner..(e + 1) * d.inner], &tape.act)
                + dot(&p.skip_weight[e * d.hidden..(e + 1) * d.hidden], &x[..d.hidden]);
        }
    }

    /// Adds to `grads` the gradient of a loss whose gradient with respect to the logits of the
    /// sample `(x, active)` is `dlogits`; `tape` is that sample's forward pass. `scratch` is
    /// reused between calls (any contents).
    pub fn backward(
        &self,
        x: &[f32],
        active: &[usize],
        tape: &Tape,
        dlogits: &[f32],
        grads: &mut HeadParams,
        scratch: &mut Vec<f32>,
    ) {
        let d = self.dims;
        let p = &self.params;
        let width = d.input();
        scratch.clear();
        scratch.resize(d.inner, 0.0);
        for (e, &dz) in dlogits.iter().enumerate().take(d.experts) {
            grads.fc2_bias[e] += dz;
            axpy(dz, &tape.act, &mut grads.fc2_weight[e * d.inner..(e + 1) * d.inner]);
            axpy(dz, &x[..d.hidden], &mut grads.skip_weight[e * d.hidden..(e + 1) * d.hidden]);
            axpy(dz, &p.fc2_weight[e * d.inner..(e + 1) * d.inner], scratch);
        }
        for (f, (&dg, &pre)) in scratch.iter().zip(&tape.pre).enumerate() {
            let da = dg * gelu_grad(pre);
            grads.fc1_bias[f] += da;
            let row = &mut grads.fc1_weight[f * width..(f + 1) * width];
            axpy(da, x, &mut row[..d.dense]);
            for &i in active {
                row[d.dense + i] += da;
            }
        }
    }
}
