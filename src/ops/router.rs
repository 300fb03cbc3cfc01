//! Router softmax + top-k (+ renormalisation) over router logits.

use super::prerouter_heads::PrerouterHistory;
use super::{one_subgroup_layout, params};
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

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

/// A router's shape and rule.
#[derive(Clone, Copy, Debug)]
pub struct RouterShape<'a> {
    /// Experts scored.
    pub n_experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Divide the chosen weights by their sum.
    pub renormalize: bool,
    /// `(n_group, topk_group)`: choose only within the best `topk_group` of `n_group` equal
    /// expert groups; `(1, 1)` for no grouping.
    pub groups: (usize, usize),
    /// Multiplier of the final weights (`routed_scaling_factor`).
    pub routed_scale: f32,
    /// Sigmoid scoring, choosing by score + this correction bias (`n_experts` values); `None`
    /// for softmax.
    pub sigmoid_bias: Option<&'a [f32]>,
}

impl RouterShape<'_> {
    /// Plain softmax top-k.
    pub fn softmax(n_experts: usize, top_k: usize, renormalize: bool) -> RouterShape<'static> {
        RouterShape { n_experts, top_k, renormalize, groups: (1, 1), routed_scale: 1.0, sigmoid_bias: None }
    }
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
    /// Binds `io`: each token's `top_k` experts by `shape`'s rule (ties to the lower index) and
    /// their weights.
    pub fn new(gpu: &Gpu, step: &wgpu::Buffer, io: RouterIo<'_>, shape: RouterShape<'_>) -> RouterTopK {
        Self::with(gpu, step, io, shape, None, None)
    }

    /// [`new`](Self::new), optionally taking the experts from `forced` and keeping the
    /// prerouter's inputs (`capture`).
    pub fn with(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: RouterIo<'_>,
        shape: RouterShape<'_>,
        forced: Option<Forced<'_>>,
        capture: Option<Capture<'_>>,
    ) -> RouterTopK {
        let (hidden, layer, moe_layers) = capture.map_or((0, 0, 0), |c| (c.hidden, c.layer, c.history.moe_layers));
        let fields = ChoiceFields { forced_offset: forced.map_or(0, |f| f.offset), hidden, layer, moe_layers };
        let p = choice_params(&shape, fields);
        let mut storage: Vec<Slice<'_>> = vec![io.logits.into(), io.ids.into(), io.weights.into()];
        let mut defines: Vec<&str> = one_subgroup_layout(gpu).into_iter().collect();
        defines.extend(choice_defines(&shape));
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
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        self.kernel.dispatch(pass, n_tokens as u32, gpu.caps.max_workgroups_per_dim);
    }
}

/// router_choice's fields besides the shape: where forced experts start and CAPTURE's sizes.
#[derive(Clone, Copy, Default)]
struct ChoiceFields {
    /// FORCED: where this layer's ids start in the forced experts.
    forced_offset: usize,
    /// CAPTURE: the hidden size (the FFN input rows it keeps).
    hidden: usize,
    /// CAPTURE: the layer's ordinal among MoE layers.
    layer: usize,
    /// CAPTURE: MoE layers in the history.
    moe_layers: usize,
}

/// router_choice's `Params` (shaders/router_choice.wgsl) for `shape`.
fn choice_params(shape: &RouterShape<'_>, c: ChoiceFields) -> Vec<u8> {
    assert!(shape.n_experts <= 256, "more than 256 experts is rejected at load");
    let mut words = vec![
        shape.n_experts as u32,
        shape.top_k as u32,
        shape.renormalize as u32,
        c.forced_offset as u32,
        c.hidden as u32,
        c.layer as u32,
        c.moe_layers as u32,
        shape.groups.0 as u32,
        shape.groups.1 as u32,
        shape.routed_scale.to_bits(),
        0,
        0,
        0,
        0,
        0,
        0,
    ];
    let mut bias = [0f32; 256];
    if let Some(b) = shape.sigmoid_bias {
        bias[..b.len()].copy_from_slice(b);
    }
    words.extend(bias.iter().map(|b| b.to_bits()));
    params(&words)
}

/// router_choice's defines for `shape`'s rule.
fn choice_defines(shape: &RouterShape<'_>) -> Vec<&'static str> {
    let mut defines = Vec::new();
    if shape.groups.0 > 1 {
        defines.push("GROUPS");
    }
    if shape.sigmoid_bias.is_some() {
        defines.push("SIGMOID");
    }
    defines
}
