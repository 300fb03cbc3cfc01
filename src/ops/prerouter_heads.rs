//! The prerouter heads on the GPU: every head runs on the step's last token in three
//! dispatches (fc1 + GELU, scores, top-k) and leaves each head's predicted experts in one
//! buffer. What they read, the [`PrerouterHistory`], is kept by the router top-k's
//! capture variant ([`super::router::Capture`]); heads with the `token` feature also read the
//! next token's input embedding, so they run once that token is embedded.

use super::router::{RouterIo, RouterShape, RouterTopK};
use super::{groups64, params};
use crate::error::{Error, Result};
use crate::gpu::kernel::Slice;
use crate::gpu::{Gpu, Kernel, Pass, StepUniform};
use crate::prerouter::features::Features;
use crate::prerouter::head::{HeadDims, HeadParams};

/// Id marking "no token" in the history (a sequence start).
pub const NO_EXPERT: u32 = u32::MAX;

/// The history the heads read, on the GPU.
pub struct PrerouterHistory {
    /// `[moe_layers, hidden]` f32: each MoE layer's FFN input of the last token.
    pub hidden: wgpu::Buffer,
    /// `[2, moe_layers, top_k]` u32: routed ids of the last token (first block) and of the
    /// token before (second block); [`NO_EXPERT`] where there is none.
    pub ids: wgpu::Buffer,
    /// MoE layers.
    pub moe_layers: usize,
    /// Experts per token.
    pub top_k: usize,
}

impl PrerouterHistory {
    /// Empty history for `moe_layers` MoE layers.
    pub fn new(gpu: &Gpu, moe_layers: usize, hidden: usize, top_k: usize) -> PrerouterHistory {
        let history = PrerouterHistory {
            hidden: gpu.storage("prerouter hidden history", (moe_layers * hidden * 4) as u64),
            ids: gpu.storage("prerouter id history", (2 * moe_layers * top_k * 4) as u64),
            moe_layers,
            top_k,
        };
        history.reset(gpu);
        history
    }

    /// Forgets every token (a new sequence starts: no routing at t−1).
    pub fn reset(&self, gpu: &Gpu) {
        let none = vec![NO_EXPERT; 2 * self.moe_layers * self.top_k];
        gpu.queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(&none));
    }
}

/// One head to run: the MoE-layer ordinal that owns it (it predicts ordinal `owner + 1`) and
/// its parameters.
#[derive(Clone, Copy)]
pub struct HeadToRun<'a> {
    /// Ordinal (among MoE layers) of the owning layer.
    pub owner: usize,
    /// The trained parameters.
    pub params: &'a HeadParams,
}

/// Bound heads.
pub struct PrerouterHeads {
    /// Per group of heads sharing one binding of each tensor: fc1 + GELU, scores, head count.
    groups: Vec<(Kernel, Kernel, usize)>,
    topk: RouterTopK,
    inner: usize,
    experts: usize,
    /// `[heads, top_k]` u32: each head's predicted experts, most likely first.
    pub predicted: wgpu::Buffer,
    /// `[heads, experts]` f32: each head's scores.
    pub logits: wgpu::Buffer,
    _buffers: Vec<wgpu::Buffer>,
    _step: StepUniform,
}

fn feature_bits(f: Features) -> u32 {
    u32::from(f.next)
        | u32::from(f.prev) << 1
        | u32::from(f.own) << 2
        | u32::from(f.deep) << 3
        | u32::from(f.token) << 4
}

impl PrerouterHeads {
    /// Uploads `heads` (all of sizes `dims`, reading `features`, top-`top_k`) and binds them to
    /// `history` and, with the `token` feature, to `next_embedding` (whose first `hidden`
    /// floats hold the next token's input embedding when they run). Heads are split into
    /// groups whose tensors fit the device's binding limit.
    pub fn new(
        gpu: &Gpu,
        history: &PrerouterHistory,
        heads: &[HeadToRun<'_>],
        dims: HeadDims,
        features: Features,
        next_embedding: Option<&wgpu::Buffer>,
    ) -> Result<PrerouterHeads> {
        let (n, top_k, moe_layers) = (heads.len(), history.top_k, history.moe_layers);
        if n == 0 || heads.iter().any(|h| h.owner + 1 >= moe_layers) {
            return Err(Error::InvalidArgument("prerouter heads need owners before the last MoE layer".into()));
        }
        if features.token != next_embedding.is_some() {
            return Err(Error::InvalidArgument(
                "prerouter heads read the next token's embedding exactly when they have the `token` feature".into(),
            ));
        }
        if dims.experts > 256 {
            return Err(Error::UnsupportedConfig(format!(
                "prerouter heads over {} experts (at most 256)",
                dims.experts
            )));
        }
        let step = StepUniform::new(gpu);
        step.set(gpu, n, 0);
        let f = |x: usize| (x * 4) as u64;
        let act = gpu.storage("prerouter act", f(n * dims.inner));
        let logits = gpu.storage("prerouter logits", f(n * dims.experts));
        let predicted = gpu.storage("prerouter predicted", f(n * top_k));
        let weights = gpu.storage("prerouter weights", f(n * top_k));
        let owners: Vec<u32> = heads.iter().map(|h| h.owner as u32).collect();
        let owners = gpu.upload("prerouter owners", bytemuck::cast_slice(&owners));
        let per_head = f(dims.inner * dims.input()).max(f(dims.experts * dims.inner.max(dims.hidden)));
        if per_head > gpu.caps.max_binding {
            return Err(Error::UnsupportedConfig(format!(
                "a prerouter head's {per_head}-byte tensors exceed the binding limit {}",
                gpu.caps.max_binding
            )));
        }
        let per_group = (gpu.caps.max_binding / per_head).max(1) as usize;
        let mut buffers = Vec::new();
        let mut groups = Vec::new();
        for (g, chunk) in heads.chunks(per_group).enumerate() {
            let cat = |part: fn(&HeadParams) -> &Vec<f32>| -> Vec<f32> {
                chunk.iter().flat_map(|h| part(h.params).iter().copied()).collect()
            };
            let upload = |label: &str, data: Vec<f32>| gpu.upload(label, bytemuck::cast_slice(&data));
            let tensors = [
                upload("prerouter fc1", cat(|p| &p.fc1_weight)),
                upload("prerouter fc1 bias", cat(|p| &p.fc1_bias)),
                upload("prerouter fc2", cat(|p| &p.fc2_weight)),
                upload("prerouter fc2 bias", cat(|p| &p.fc2_bias)),
                upload("prerouter skip", cat(|p| &p.skip_weight)),
            ];
            let p = params(&[
                dims.hidden as u32,
                dims.dense as u32,
                dims.inner as u32,
                dims.experts as u32,
                top_k as u32,
                (g * per_group) as u32,
                chunk.len() as u32,
                feature_bits(features),
                moe_layers as u32,
                0,
                0,
                0,
            ]);
            let [fc1, b1, fc2, b2, skip] = &tensors;
            let (owners, hidden, ids) = (Slice::from(&owners), Slice::from(&history.hidden), Slice::from(&history.ids));
            let mut storage = vec![owners, hidden, ids, fc1.into(), b1.into(), (&act).into()];
            storage.extend(next_embedding.map(Slice::from));
            let defines: &[&str] = if features.token { &["TOKEN"] } else { &[] };
            let hidden_layer = Kernel::new(gpu, "prerouter_heads", defines, &step.buffer, &p, &storage);
            let storage = [owners, hidden, fc2.into(), b2.into(), skip.into(), (&act).into(), (&logits).into()];
            let scores = Kernel::new(gpu, "prerouter_heads", &["SCORES"], &step.buffer, &p, &storage);
            groups.push((hidden_layer, scores, chunk.len()));
            buffers.extend(tensors);
        }
        let io = RouterIo { logits: &logits, ids: &predicted, weights: &weights };
        let shape = RouterShape::softmax(dims.experts, top_k, false);
        let topk = RouterTopK::new(gpu, &step.buffer, io, shape);
        buffers.extend([owners, act, weights]);
        let (inner, experts) = (dims.inner, dims.experts);
        Ok(PrerouterHeads { groups, topk, inner, experts, predicted, logits, _buffers: buffers, _step: step })
    }

    /// Records every head on the history's last token.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass) {
        let max = gpu.caps.max_workgroups_per_dim;
        for (hidden_layer, _, heads) in &self.groups {
            hidden_layer.dispatch(pass, groups64(heads * self.inner), max);
        }
        for (_, scores, heads) in &self.groups {
            scores.dispatch(pass, groups64(heads * self.experts), max);
        }
        let heads = self.groups.iter().map(|g| g.2).sum();
        self.topk.record(gpu, pass, heads);
    }
}
