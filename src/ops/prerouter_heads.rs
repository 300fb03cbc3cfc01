//! The prerouter heads on the GPU: every head runs on the step's last token in three
//! dispatches (fc1 + GELU, scores, top-k) and leaves each head's predicted experts in one
//! buffer.

use super::params;
use super::prerouter_capture::PrerouterHistory;
use super::router::{RouterIo, RouterShape, RouterTopK};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, Kernel, StepUniform};
use crate::prerouter::features::Features;
use crate::prerouter::head::{HeadDims, HeadParams};

/// One head to run: the MoE-layer ordinal that owns it (it predicts ordinal `owner + 1`) and
/// its parameters.
#[derive(Clone, Copy)]
pub struct HeadToRun<'a> {
    /// Ordinal (among MoE layers) of the owning layer.
    pub owner: usize,
    /// The trained parameters.
    pub params: &'a HeadParams,
}

/// Heads sharing one binding of each weight tensor.
struct Group {
    hidden_layer: Kernel,
    scores: Kernel,
    heads: usize,
}

/// Bound heads.
pub struct PrerouterHeads {
    groups: Vec<Group>,
    topk: RouterTopK,
    dims: HeadDims,
    heads: usize,
    /// `[heads, top_k]` u32: each head's predicted experts, most likely first.
    pub predicted: wgpu::Buffer,
    /// `[heads, experts]` f32: each head's scores.
    pub logits: wgpu::Buffer,
    _buffers: Vec<wgpu::Buffer>,
    _step: StepUniform,
}

fn feature_bits(f: Features) -> u32 {
    u32::from(f.next) | u32::from(f.prev) << 1 | u32::from(f.own) << 2 | u32::from(f.deep) << 3
}

impl PrerouterHeads {
    /// Uploads `heads` (all of sizes `dims`, reading `features`, top-`top_k`) and binds them to
    /// `history` (of `moe_layers` MoE layers). Heads are split into groups whose tensors fit
    /// the device's binding limit.
    pub fn new(
        gpu: &Gpu,
        history: &PrerouterHistory,
        heads: &[HeadToRun<'_>],
        dims: HeadDims,
        features: Features,
        top_k: usize,
        moe_layers: usize,
    ) -> Result<PrerouterHeads> {
        let n = heads.len();
        if n == 0 || heads.iter().any(|h| h.owner + 1 >= moe_layers) {
            return Err(Error::InvalidArgument("prerouter heads need owners before the last MoE layer".into()));
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
            let first = g * per_group;
            let cat = |part: fn(&HeadParams) -> &Vec<f32>| -> Vec<f32> {
                chunk.iter().flat_map(|h| part(h.params).iter().copied()).collect()
            };
            let upload = |label: &str, data: Vec<f32>| gpu.upload(label, bytemuck::cast_slice(&data));
            let fc1 = upload("prerouter fc1", cat(|p| &p.fc1_weight));
            let b1 = upload("prerouter fc1 bias", cat(|p| &p.fc1_bias));
            let fc2 = upload("prerouter fc2", cat(|p| &p.fc2_weight));
            let b2 = upload("prerouter fc2 bias", cat(|p| &p.fc2_bias));
            let skip = upload("prerouter skip", cat(|p| &p.skip_weight));
            let p = params(&[
                dims.hidden as u32,
                dims.dense as u32,
                dims.inner as u32,
                dims.experts as u32,
                top_k as u32,
                first as u32,
                chunk.len() as u32,
                feature_bits(features),
                moe_layers as u32,
                0,
                0,
                0,
            ]);
            let hidden_layer = Kernel::new(
                gpu,
                "prerouter_heads",
                &[],
                &step.buffer,
                &p,
                &[
                    (&owners).into(),
                    (&history.hidden).into(),
                    (&history.ids).into(),
                    (&fc1).into(),
                    (&b1).into(),
                    (&act).into(),
                ],
            );
            let scores = Kernel::new(
                gpu,
                "prerouter_heads",
                &["SCORES"],
                &step.buffer,
                &p,
                &[
                    (&owners).into(),
                    (&history.hidden).into(),
                    (&fc2).into(),
                    (&b2).into(),
                    (&skip).into(),
                    (&act).into(),
                    (&logits).into(),
                ],
            );
            groups.push(Group { hidden_layer, scores, heads: chunk.len() });
            buffers.extend([fc1, b1, fc2, b2, skip]);
        }
        let io = RouterIo { logits: &logits, ids: &predicted, weights: &weights };
        let shape = RouterShape { n_experts: dims.experts, top_k, renormalize: false };
        let topk = RouterTopK::new(gpu, &step.buffer, io, shape);
        buffers.extend([act, weights, owners]);
        Ok(PrerouterHeads { groups, topk, dims, heads: n, predicted, logits, _buffers: buffers, _step: step })
    }

    /// Records every head on the history's last token.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>) {
        let max = gpu.caps.max_workgroups_per_dim;
        for g in &self.groups {
            g.hidden_layer.dispatch(pass, (g.heads * self.dims.inner) as u32, max);
        }
        for g in &self.groups {
            g.scores.dispatch(pass, (g.heads * self.dims.experts) as u32, max);
        }
        self.topk.record(gpu, pass, self.heads);
    }
}
