//! Router softmax + top-k (+ renormalisation) over router logits.

use super::params;
use super::prerouter_heads::PrerouterHistory;
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
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

/// Experts chosen elsewhere (the prerouter's prediction-as-routing): `experts[offset..offset +
/// top_k]` become the routing, and only their probabilities come from the logits. Meant for
/// one-token steps: every token of a step gets the same experts.
#[derive(Clone, Copy)]
pub struct Forced<'a> {
    /// u32 expert ids.
    pub experts: &'a wgpu::Buffer,
    /// Where this layer's ids start (in ids).
    pub offset: usize,
}

/// Also keep the prerouter heads' inputs: the step's last-token FFN input `hn` and the
/// routing of the last two tokens, as MoE layer `layer` (ordinal) of `history`.
#[derive(Clone, Copy)]
pub struct Capture<'a> {
    /// `[tokens, hidden]` FFN input of the layer.
    pub hn: &'a wgpu::Buffer,
    /// Where it goes.
    pub history: &'a PrerouterHistory,
    /// Ordinal among MoE layers.
    pub layer: usize,
    /// Hidden size.
    pub hidden: usize,
}

impl RouterTopK {
    /// Binds `io`: softmax over each token's logits, the `top_k` most probable experts (ties
    /// to the lower index) and their probabilities.
    pub fn new(gpu: &Gpu, step: &wgpu::Buffer, io: RouterIo<'_>, shape: RouterShape) -> RouterTopK {
        Self::with(gpu, step, io, shape, None, None)
    }

    /// [`new`](Self::new), optionally taking the experts from `forced` and keeping the
    /// prerouter's inputs (`capture`).
    pub fn with(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: RouterIo<'_>,
        shape: RouterShape,
        forced: Option<Forced<'_>>,
        capture: Option<Capture<'_>>,
    ) -> RouterTopK {
        assert!(shape.n_experts <= 256, "more than 256 experts is rejected at load");
        let (hidden, layer, moe_layers) = capture.map_or((0, 0, 0), |c| (c.hidden, c.layer, c.history.moe_layers));
        let p = params(&[
            shape.n_experts as u32,
            shape.top_k as u32,
            shape.renormalize as u32,
            forced.map_or(0, |f| f.offset as u32),
            hidden as u32,
            layer as u32,
            moe_layers as u32,
            0,
        ]);
        let mut storage: Vec<Slice<'_>> = vec![io.logits.into(), io.ids.into(), io.weights.into()];
        let mut defines = Vec::new();
        if let Some(f) = forced {
            storage.push(f.experts.into());
            defines.push("FORCED");
        }
        if let Some(c) = capture {
            storage.extend([Slice::from(c.hn), Slice::from(&c.history.hidden), Slice::from(&c.history.ids)]);
            defines.push("CAPTURE");
        }
        // Per token its logits in, ids and weights out.
        let traffic = Traffic { fixed: 0, per_token: 4 * (shape.n_experts + 2 * shape.top_k) as u64, per_position: 0 };
        RouterTopK { kernel: Kernel::new(gpu, "router_topk", &defines, step, &p, &storage).with_traffic(traffic) }
    }

    /// Records routing for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize) {
        self.kernel.dispatch(pass, n_tokens as u32, gpu.caps.max_workgroups_per_dim);
    }
}
