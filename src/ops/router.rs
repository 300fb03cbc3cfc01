//! Router softmax + top-k (+ renormalisation) over router logits.

use super::params;
use crate::gpu::kernel::Slice;
use crate::gpu::{Gpu, Kernel};

/// A bound router top-k.
pub struct RouterTopK {
    kernel: Kernel,
}

/// What a router's top-k reads and writes.
#[derive(Clone, Copy)]
pub struct RouterIo<'a> {
    /// `[tokens, n_experts]` logits.
    pub logits: &'a wgpu::Buffer,
    /// `[tokens, top_k]` chosen expert ids (written).
    pub ids: &'a wgpu::Buffer,
    /// `[tokens, top_k]` their weights (written).
    pub weights: &'a wgpu::Buffer,
}

/// A router's shape.
#[derive(Clone, Copy, Debug)]
pub struct RouterShape {
    /// Experts scored.
    pub n_experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Divide the chosen probabilities by their sum.
    pub renormalize: bool,
}

impl RouterTopK {
    /// Binds `io`: softmax over each token's logits, the `top_k` most probable experts (ties
    /// to the lower index) and their probabilities.
    pub fn new(gpu: &Gpu, step: &wgpu::Buffer, io: RouterIo<'_>, shape: RouterShape) -> RouterTopK {
        Self::bind(gpu, step, io, shape, None)
    }

    /// Like [`new`](Self::new), but the experts are `forced[offset..offset + top_k]` (chosen
    /// elsewhere: the prerouter's prediction) and only their probabilities come from the
    /// logits. Meant for one-token steps: every token of a step gets the same experts.
    pub fn forced(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: RouterIo<'_>,
        shape: RouterShape,
        forced: &wgpu::Buffer,
        offset: usize,
    ) -> RouterTopK {
        Self::bind(gpu, step, io, shape, Some((forced, offset)))
    }

    fn bind(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: RouterIo<'_>,
        shape: RouterShape,
        forced: Option<(&wgpu::Buffer, usize)>,
    ) -> RouterTopK {
        assert!(shape.n_experts <= 256, "more than 256 experts is rejected at load");
        let offset = forced.map_or(0, |(_, o)| o as u32);
        let p = params(&[shape.n_experts as u32, shape.top_k as u32, shape.renormalize as u32, offset]);
        let mut storage: Vec<Slice<'_>> = vec![io.logits.into(), io.ids.into(), io.weights.into()];
        storage.extend(forced.map(|(b, _)| Slice::from(b)));
        let defines: &[&str] = if forced.is_some() { &["FORCED"] } else { &[] };
        RouterTopK { kernel: Kernel::new(gpu, "router_topk", defines, step, &p, &storage) }
    }

    /// Records routing for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize) {
        self.kernel.dispatch(pass, n_tokens as u32, gpu.caps.max_workgroups_per_dim);
    }
}
