//! Keeps, per MoE layer, what the prerouter heads read at the end of a step: the last token's
//! FFN input and routed ids, and the ids of the token before.

use super::params;
use crate::gpu::{Gpu, Kernel};

/// Id marking "no token" in the history (a sequence start).
pub const NO_EXPERT: u32 = u32::MAX;

/// The history the heads read, on the GPU.
pub struct PrerouterHistory {
    /// `[moe_layers, hidden]` f32: each MoE layer's FFN input of the last token.
    pub hidden: wgpu::Buffer,
    /// `[2, moe_layers, top_k]` u32: routed ids of the last token (first block) and of the
    /// token before (second block); [`NO_EXPERT`] where there is none.
    pub ids: wgpu::Buffer,
    moe_layers: usize,
    top_k: usize,
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

/// A bound capture for one MoE layer.
pub struct PrerouterCapture {
    kernel: Kernel,
}

impl PrerouterCapture {
    /// Binds MoE layer `layer` (ordinal among MoE layers): `hn` (`[tokens, hidden]`) and `ids`
    /// (`[tokens, top_k]`) of the step → `history`.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        hn: &wgpu::Buffer,
        ids: &wgpu::Buffer,
        history: &PrerouterHistory,
        layer: usize,
        hidden: usize,
    ) -> PrerouterCapture {
        let p = params(&[hidden as u32, history.top_k as u32, layer as u32, history.moe_layers as u32]);
        let storage = [hn.into(), ids.into(), (&history.hidden).into(), (&history.ids).into()];
        PrerouterCapture { kernel: Kernel::new(gpu, "prerouter_capture", &[], step, &p, &storage) }
    }

    /// Records the capture (after the layer's routing, before `hn` is overwritten).
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>) {
        self.kernel.dispatch(pass, 1, gpu.caps.max_workgroups_per_dim);
    }
}
