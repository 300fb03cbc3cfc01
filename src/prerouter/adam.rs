//! Adam (Kingma & Ba), by hand, over a head's tensors.

use super::head::{HeadDims, HeadParams};

/// Adam's state for one head.
pub struct Adam {
    /// Learning rate.
    pub lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    steps: i32,
    m: HeadParams,
    v: HeadParams,
}

impl Adam {
    /// Fresh moments for a head of `dims`, standard betas (0.9, 0.999) and epsilon 1e-8.
    pub fn new(dims: HeadDims, lr: f32) -> Adam {
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            steps: 0,
            m: HeadParams::zeros(dims),
            v: HeadParams::zeros(dims),
        }
    }

    /// One update of `params` from summed gradients `grads` over `batch` samples.
    pub fn step(&mut self, params: &mut HeadParams, grads: &HeadParams, batch: usize) {
        self.steps += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let lr_t = self.lr * (1.0 - b2.powi(self.steps)).sqrt() / (1.0 - b1.powi(self.steps));
        let scale = 1.0 / batch as f32;
        let tensors =
            params.tensors_mut().into_iter().zip(grads.tensors()).zip(self.m.tensors_mut()).zip(self.v.tensors_mut());
        for (((p, g), m), v) in tensors {
            for i in 0..p.len() {
                let g = g[i] * scale;
                m[i] = b1 * m[i] + (1.0 - b1) * g;
                v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                p[i] -= lr_t * m[i] / (v[i].sqrt() + self.eps);
            }
        }
    }
}
